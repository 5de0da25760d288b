package tokenizer

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"github.com/kvgate/kvgate/gateway/internal/jsonstr"
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

// strBytes reads a JSON string and returns its bytes: a view into the input when it holds no escapes
// (valid until the input changes), else a fresh decoded copy.
func (r *jsonReader) strBytes() ([]byte, error) {
	if err := r.expect('"'); err != nil {
		return nil, err
	}
	start := r.pos
	k := bytes.IndexByte(r.buf[r.pos:], '"')
	if k < 0 {
		return nil, r.fail("unterminated string")
	}
	if bytes.IndexByte(r.buf[start:start+k], '\\') < 0 {
		r.pos = start + k + 1
		return r.buf[start : start+k], nil
	}
	s, err := r.strSlow(start)
	return []byte(s), err
}

// strSlow decodes a string holding escapes, starting from its first content byte (gateway/internal/jsonstr; bytes
// that are not UTF-8 are kept as they are).
func (r *jsonReader) strSlow(start int) (string, error) {
	out, next, err := jsonstr.AppendUnquoted(nil, r.buf, start, false)
	r.pos = next
	if err != nil {
		return "", r.fail(err.(*jsonstr.Error).Msg)
	}
	return string(out), nil
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

// parseVocab reads {"token": id, ...}. fn is called once per entry, in file order; tok is only valid
// during the call.
func parseVocab(raw []byte, fn func(tok []byte, id uint32)) error {
	r := &jsonReader{buf: raw}
	if err := r.expect('{'); err != nil {
		return err
	}
	if r.peek() == '}' {
		return nil
	}
	for {
		k, err := r.strBytes()
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

// parseMerges reads ["a b", ...] or [["a", "b"], ...]. fn is called once per merge, in rank order; a and b
// are only valid during the call.
func parseMerges(raw []byte, fn func(a, b []byte) error) error {
	r := &jsonReader{buf: raw}
	if err := r.expect('['); err != nil {
		return err
	}
	if r.peek() == ']' {
		return nil
	}
	for {
		var a, b []byte
		switch r.peek() {
		case '"':
			s, err := r.strBytes()
			if err != nil {
				return err
			}
			i := bytes.IndexByte(s, ' ')
			if i < 0 {
				return fmt.Errorf("tokenizer: merge %q is not two space-separated tokens", s)
			}
			a, b = s[:i], s[i+1:]
		case '[':
			r.pos++
			var err error
			if a, err = r.strBytes(); err != nil {
				return err
			}
			if err = r.expect(','); err != nil {
				return err
			}
			if b, err = r.strBytes(); err != nil {
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

// skipValue moves past one JSON value without decoding it (strings are scanned for their closing quote
// with bytes.IndexByte, containers by depth); full validation is left to the decoders of the values that
// are used.
func (r *jsonReader) skipValue() error {
	r.skipSpace()
	depth := 0
	for r.pos < len(r.buf) {
		c := r.buf[r.pos]
		switch c {
		case '"':
			r.pos++
			for {
				k := bytes.IndexByte(r.buf[r.pos:], '"')
				if k < 0 {
					return r.fail("unterminated string")
				}
				end := r.pos + k
				bs := 0
				for j := end - 1; j >= r.pos && r.buf[j] == '\\'; j-- {
					bs++
				}
				r.pos = end + 1
				if bs%2 == 0 {
					break
				}
			}
		case '{', '[':
			depth++
			r.pos++
		case '}', ']':
			depth--
			r.pos++
			if depth < 0 {
				return r.fail("unbalanced brackets")
			}
		default:
			if depth == 0 {
				// A scalar ends at the next delimiter.
				for r.pos < len(r.buf) {
					switch r.buf[r.pos] {
					case ',', '}', ']', ' ', '\t', '\n', '\r':
						return nil
					}
					r.pos++
				}
				return nil
			}
			r.pos++
			continue
		}
		if depth == 0 {
			return nil
		}
	}
	return r.fail("unexpected end of input")
}

// members reads the object at the reader's position into its members' raw values.
func (r *jsonReader) members() (map[string][]byte, error) {
	raw := r.buf
	if err := r.expect('{'); err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	if r.peek() == '}' {
		r.pos++
		return out, nil
	}
	for {
		k, err := r.str()
		if err != nil {
			return nil, err
		}
		if err := r.expect(':'); err != nil {
			return nil, err
		}
		r.skipSpace()
		start := r.pos
		if err := r.skipValue(); err != nil {
			return nil, err
		}
		out[k] = raw[start:r.pos]
		switch r.peek() {
		case ',':
			r.pos++
		case '}':
			r.pos++
			return out, nil
		default:
			return nil, r.fail("expected ',' or '}'")
		}
	}
}

// fileMembers splits tokenizer.json into its top-level members and the members of its "model" object, in
// one pass over the input.
func fileMembers(raw []byte) (top, model map[string][]byte, err error) {
	r := &jsonReader{buf: raw}
	if err := r.expect('{'); err != nil {
		return nil, nil, err
	}
	top = map[string][]byte{}
	if r.peek() == '}' {
		return top, nil, nil
	}
	for {
		k, err := r.str()
		if err != nil {
			return nil, nil, err
		}
		if err := r.expect(':'); err != nil {
			return nil, nil, err
		}
		r.skipSpace()
		start := r.pos
		if k == "model" && r.peek() == '{' {
			if model, err = r.members(); err != nil {
				return nil, nil, err
			}
		} else if err := r.skipValue(); err != nil {
			return nil, nil, err
		}
		top[k] = raw[start:r.pos]
		switch r.peek() {
		case ',':
			r.pos++
		case '}':
			return top, model, nil
		default:
			return nil, nil, r.fail("expected ',' or '}'")
		}
	}
}
