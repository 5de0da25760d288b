package chattemplate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"

	"github.com/kvgate/kvgate/gateway/internal/jsonstr"
)

// jsonScanner parses request JSON straight into jinja values. It accepts exactly what encoding/json
// accepts (RFC 8259; invalid UTF-8 and lone surrogates become U+FFFD, as there) and is checked against it
// by FuzzJSONScanner; it exists because the token API of encoding/json was a third of Render's time.
type jsonScanner struct {
	data []byte
	pos  int
}

var errJSONSyntax = errors.New("invalid JSON")

func (s *jsonScanner) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s at offset %d", errJSONSyntax, fmt.Sprintf(format, args...), s.pos)
}

func (s *jsonScanner) skipSpace() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// atEnd reports whether only whitespace is left.
func (s *jsonScanner) atEnd() bool {
	s.skipSpace()
	return s.pos >= len(s.data)
}

// peek returns the next non-space byte, or 0 at the end.
func (s *jsonScanner) peek() byte {
	s.skipSpace()
	if s.pos >= len(s.data) {
		return 0
	}
	return s.data[s.pos]
}

func (s *jsonScanner) expect(c byte) error {
	if s.peek() != c {
		if s.pos >= len(s.data) {
			return s.errorf("unexpected end, want %q", c)
		}
		return s.errorf("unexpected %q, want %q", s.data[s.pos], c)
	}
	s.pos++
	return nil
}

// value parses one JSON value.
func (s *jsonScanner) value(depth int) (jinja.Value, error) {
	switch c := s.peek(); {
	case c == '{':
		if depth >= maxJSONDepth {
			return jinja.Undefined(), errJSONDepth
		}
		s.pos++
		out := jinja.NewDict()
		d := out.AsDict()
		if s.peek() == '}' {
			s.pos++
			return out, nil
		}
		for {
			if s.peek() != '"' {
				return jinja.Undefined(), s.errorf("object key must be a string")
			}
			key, err := s.str()
			if err != nil {
				return jinja.Undefined(), err
			}
			if err := s.expect(':'); err != nil {
				return jinja.Undefined(), err
			}
			v, err := s.value(depth + 1)
			if err != nil {
				return jinja.Undefined(), err
			}
			d.Set(key, v)
			switch s.peek() {
			case ',':
				s.pos++
			case '}':
				s.pos++
				return out, nil
			default:
				return jinja.Undefined(), s.errorf("want ',' or '}' in object")
			}
		}
	case c == '[':
		if depth >= maxJSONDepth {
			return jinja.Undefined(), errJSONDepth
		}
		s.pos++
		items := []jinja.Value{}
		if s.peek() == ']' {
			s.pos++
			return jinja.NewList(items), nil
		}
		for {
			v, err := s.value(depth + 1)
			if err != nil {
				return jinja.Undefined(), err
			}
			items = append(items, v)
			switch s.peek() {
			case ',':
				s.pos++
			case ']':
				s.pos++
				return jinja.NewList(items), nil
			default:
				return jinja.Undefined(), s.errorf("want ',' or ']' in array")
			}
		}
	case c == '"':
		str, err := s.str()
		if err != nil {
			return jinja.Undefined(), err
		}
		return jinja.NewString(str), nil
	case c == '-' || (c >= '0' && c <= '9'):
		lit, err := s.number()
		if err != nil {
			return jinja.Undefined(), err
		}
		return numberValue(lit), nil
	case c == 't':
		return jinja.NewBool(true), s.literal("true")
	case c == 'f':
		return jinja.NewBool(false), s.literal("false")
	case c == 'n':
		return jinja.None(), s.literal("null")
	case c == 0:
		return jinja.Undefined(), s.errorf("unexpected end of JSON input")
	default:
		return jinja.Undefined(), s.errorf("unexpected %q", c)
	}
}

func (s *jsonScanner) literal(word string) error {
	if len(s.data)-s.pos < len(word) || string(s.data[s.pos:s.pos+len(word)]) != word {
		return s.errorf("invalid literal")
	}
	s.pos += len(word)
	return nil
}

// number scans a JSON number literal: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *jsonScanner) number() (string, error) {
	start := s.pos
	d := s.data
	i := s.pos
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && d[i] >= '1' && d[i] <= '9':
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
	default:
		s.pos = i
		return "", s.errorf("invalid number")
	}
	if i < len(d) && d[i] == '.' {
		i++
		if i >= len(d) || d[i] < '0' || d[i] > '9' {
			s.pos = i
			return "", s.errorf("invalid number")
		}
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) || d[i] < '0' || d[i] > '9' {
			s.pos = i
			return "", s.errorf("invalid number")
		}
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
	}
	s.pos = i
	return string(d[start:i]), nil
}

// str scans a JSON string starting at the opening quote.
func (s *jsonScanner) str() (string, error) {
	d := s.data
	s.pos++ // opening quote
	start := s.pos
	// Fast path: no escapes, all ASCII or valid UTF-8. Eight bytes at a time while none of them is a quote,
	// a backslash or a control character (message texts are long: this is most of the body).
	i := start
	for i+8 <= len(d) && !specialIn8(binary.LittleEndian.Uint64(d[i:])) {
		i += 8
	}
	for i < len(d) {
		c := d[i]
		if c == '"' {
			if utf8.Valid(d[start:i]) {
				s.pos = i + 1
				return string(d[start:i]), nil
			}
			break
		}
		if c == '\\' || c < 0x20 {
			break
		}
		i++
	}
	buf, next, err := jsonstr.AppendUnquoted(make([]byte, 0, i-start+16), d, start, true)
	s.pos = next
	if err != nil {
		return "", s.errorf("%s", err.(*jsonstr.Error).Msg)
	}
	return string(buf), nil
}

// skip scans past one JSON value without building it.
func (s *jsonScanner) skip(depth int) error {
	switch c := s.peek(); {
	case c == '{' || c == '[':
		if depth >= maxJSONDepth {
			return errJSONDepth
		}
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		s.pos++
		if s.peek() == closer {
			s.pos++
			return nil
		}
		for {
			if c == '{' {
				if s.peek() != '"' {
					return s.errorf("object key must be a string")
				}
				if err := s.skipString(); err != nil {
					return err
				}
				if err := s.expect(':'); err != nil {
					return err
				}
			}
			if err := s.skip(depth + 1); err != nil {
				return err
			}
			switch s.peek() {
			case ',':
				s.pos++
			case closer:
				s.pos++
				return nil
			default:
				return s.errorf("want ',' or %q", closer)
			}
		}
	case c == '"':
		return s.skipString()
	default:
		_, err := s.value(depth)
		return err
	}
}

// skipString validates a string like str without building it.
func (s *jsonScanner) skipString() error {
	d := s.data
	i := s.pos + 1
	for i < len(d) {
		c := d[i]
		switch {
		case c == '"':
			s.pos = i + 1
			return nil
		case c < 0x20:
			s.pos = i
			return s.errorf("control character in string")
		case c == '\\':
			if i+1 >= len(d) {
				s.pos = i
				return s.errorf("unterminated escape")
			}
			switch d[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if _, ok := jsonstr.Hex4(d, i+2); !ok {
					s.pos = i
					return s.errorf("invalid \\u escape")
				}
				i += 6
			default:
				s.pos = i
				return s.errorf("invalid escape")
			}
		default:
			i++
		}
	}
	s.pos = i
	return s.errorf("unterminated string")
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// specialIn8 reports whether one of the 8 bytes packed in x is '"', '\\' or below 0x20: the classic
// "has a zero byte" test on x^quotes and x^backslashes, and "has a byte below n" (exact for n ≤ 128).
func specialIn8(x uint64) bool {
	q := x ^ ('"' * ones)
	b := x ^ ('\\' * ones)
	return ((q-ones)&^q|(b-ones)&^b|(x-0x20*ones)&^x)&highs != 0
}
