package tokenizer

import (
	"errors"
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// This file holds a small hand-written reader for the two big members of tokenizer.json, model.vocab (an
// object of string -> int) and model.merges (an array of "a b" strings or of [a, b] pairs). Decoding them
// with encoding/json into maps and interfaces costs several times more than the rest of Load; see
// RATIONALE.md.

// jsonReader walks one JSON value held in buf.
type jsonReader struct {
	buf []byte
	pos int
}

var errJSONSyntax = errors.New("tokenizer: malformed JSON")

func (r *jsonReader) fail(what string) error {
	return fmt.Errorf("%w: %s at byte %d", errJSONSyntax, what, r.pos)
}

func (r *jsonReader) skipSpace() {
	for r.pos < len(r.buf) {
		switch r.buf[r.pos] {
		case ' ', '\t', '\n', '\r':
			r.pos++
		default:
			return
		}
	}
}

// expect consumes byte c after optional whitespace.
func (r *jsonReader) expect(c byte) error {
	r.skipSpace()
	if r.pos >= len(r.buf) || r.buf[r.pos] != c {
		return r.fail("expected " + strconv.QuoteRune(rune(c)))
	}
	r.pos++
	return nil
}

// peek returns the next non-space byte without consuming it (0 at the end).
func (r *jsonReader) peek() byte {
	r.skipSpace()
	if r.pos >= len(r.buf) {
		return 0
	}
	return r.buf[r.pos]
}

// str reads a JSON string.
func (r *jsonReader) str() (string, error) {
	if err := r.expect('"'); err != nil {
		return "", err
	}
	start := r.pos
	for r.pos < len(r.buf) {
		c := r.buf[r.pos]
		if c == '"' {
			s := string(r.buf[start:r.pos])
			r.pos++
			return s, nil
		}
		if c == '\\' {
			return r.strSlow(start)
		}
		if c < 0x20 {
			return "", r.fail("control character in string")
		}
		r.pos++
	}
	return "", r.fail("unterminated string")
}

// strSlow decodes a string holding escapes, starting from its first content byte.
func (r *jsonReader) strSlow(start int) (string, error) {
	out := append([]byte(nil), r.buf[start:r.pos]...)
	for r.pos < len(r.buf) {
		c := r.buf[r.pos]
		switch {
		case c == '"':
			r.pos++
			return string(out), nil
		case c == '\\':
			if r.pos+1 >= len(r.buf) {
				return "", r.fail("bad escape")
			}
			e := r.buf[r.pos+1]
			r.pos += 2
			switch e {
			case '"', '\\', '/':
				out = append(out, e)
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r1, ok := r.hex4()
				if !ok {
					return "", r.fail("bad \\u escape")
				}
				if utf16.IsSurrogate(r1) {
					if r.pos+1 < len(r.buf) && r.buf[r.pos] == '\\' && r.buf[r.pos+1] == 'u' {
						save := r.pos
						r.pos += 2
						r2, ok := r.hex4()
						if ok {
							if d := utf16.DecodeRune(r1, r2); d != utf8.RuneError {
								out = utf8.AppendRune(out, d)
								continue
							}
						}
						r.pos = save
					}
					r1 = utf8.RuneError
				}
				out = utf8.AppendRune(out, r1)
			default:
				return "", r.fail("bad escape")
			}
		case c < 0x20:
			return "", r.fail("control character in string")
		default:
			out = append(out, c)
			r.pos++
		}
	}
	return "", r.fail("unterminated string")
}

func (r *jsonReader) hex4() (rune, bool) {
	if r.pos+4 > len(r.buf) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(r.buf[r.pos:r.pos+4]), 16, 32)
	if err != nil {
		return 0, false
	}
	r.pos += 4
	return rune(v), true
}

// uint reads a non-negative integer that fits in uint32.
func (r *jsonReader) uint() (uint32, error) {
	r.skipSpace()
	start := r.pos
	var v uint64
	for r.pos < len(r.buf) && r.buf[r.pos] >= '0' && r.buf[r.pos] <= '9' {
		v = v*10 + uint64(r.buf[r.pos]-'0')
		if v > 1<<32-1 {
			return 0, r.fail("integer out of range")
		}
		r.pos++
	}
	if r.pos == start {
		return 0, r.fail("expected a non-negative integer")
	}
	return uint32(v), nil
}

// parseVocab reads {"token": id, ...}. fn is called once per entry, in file order.
func parseVocab(raw []byte, fn func(tok string, id uint32)) error {
	r := &jsonReader{buf: raw}
	if err := r.expect('{'); err != nil {
		return err
	}
	if r.peek() == '}' {
		return nil
	}
	for {
		k, err := r.str()
		if err != nil {
			return err
		}
		if err := r.expect(':'); err != nil {
			return err
		}
		id, err := r.uint()
		if err != nil {
			return err
		}
		fn(k, id)
		switch r.peek() {
		case ',':
			r.pos++
		case '}':
			return nil
		default:
			return r.fail("expected ',' or '}' in vocab")
		}
	}
}

// parseMerges reads ["a b", ...] or [["a", "b"], ...]. fn is called once per merge, in rank order.
func parseMerges(raw []byte, fn func(a, b string) error) error {
	r := &jsonReader{buf: raw}
	if err := r.expect('['); err != nil {
		return err
	}
	if r.peek() == ']' {
		return nil
	}
	for {
		var a, b string
		switch r.peek() {
		case '"':
			s, err := r.str()
			if err != nil {
				return err
			}
			i := indexByte(s, ' ')
			if i < 0 {
				return fmt.Errorf("tokenizer: merge %q is not two space-separated tokens", s)
			}
			a, b = s[:i], s[i+1:]
		case '[':
			r.pos++
			var err error
			if a, err = r.str(); err != nil {
				return err
			}
			if err = r.expect(','); err != nil {
				return err
			}
			if b, err = r.str(); err != nil {
				return err
			}
			if err = r.expect(']'); err != nil {
				return err
			}
		default:
			return r.fail("expected a merge")
		}
		if err := fn(a, b); err != nil {
			return err
		}
		switch r.peek() {
		case ',':
			r.pos++
		case ']':
			return nil
		default:
			return r.fail("expected ',' or ']' in merges")
		}
	}
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}
