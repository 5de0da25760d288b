// Package jsonstr decodes JSON string literals (RFC 8259): the one unescaper that the chat template's request
// scanner (gateway/internal/chattemplate) and the tokenizer's file reader (gateway/internal/tokenizer) share. Callers keep
// their own fast paths for strings without escapes and call AppendUnquoted for the rest.
package jsonstr

import (
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// Error is a malformed string literal. Offset is the byte index in the input where decoding stopped: the
// end of the input for an unterminated string, the control character, the backslash of an unterminated
// escape, the letter of an unknown escape, or the first hex digit of a bad \u escape.
type Error struct {
	Offset int
	Msg    string // "unterminated string", "control character in string", "unterminated escape", "invalid escape", `invalid \u escape`
}

func (e *Error) Error() string { return e.Msg + " at offset " + strconv.Itoa(e.Offset) }

// AppendUnquoted decodes the string literal whose content starts at d[i] (the byte after the opening
// quote), appends the decoded text to dst, and returns dst and the index just past the closing quote.
//
// Escapes are JSON's eight and \uXXXX; a \u high surrogate followed by an escaped low surrogate is one code
// point, any other surrogate escape is U+FFFD (as encoding/json decodes them). Raw bytes that are not valid
// UTF-8 become U+FFFD when replaceInvalid is set (encoding/json's rule) and are copied as they are otherwise.
// The error is an *Error.
func AppendUnquoted(dst, d []byte, i int, replaceInvalid bool) ([]byte, int, error) {
	for {
		if i >= len(d) {
			return dst, i, &Error{Offset: i, Msg: "unterminated string"}
		}
		c := d[i]
		switch {
		case c == '"':
			return dst, i + 1, nil
		case c < 0x20:
			return dst, i, &Error{Offset: i, Msg: "control character in string"}
		case c == '\\':
			if i+1 >= len(d) {
				return dst, i, &Error{Offset: i, Msg: "unterminated escape"}
			}
			e := d[i+1]
			i += 2
			switch e {
			case '"', '\\', '/':
				dst = append(dst, e)
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				r, ok := Hex4(d, i)
				if !ok {
					return dst, i, &Error{Offset: i, Msg: `invalid \u escape`}
				}
				i += 4
				if utf16.IsSurrogate(r) {
					if i+1 < len(d) && d[i] == '\\' && d[i+1] == 'u' {
						if r2, ok := Hex4(d, i+2); ok {
							if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
								dst = utf8.AppendRune(dst, dec)
								i += 6
								continue
							}
						}
					}
					r = utf8.RuneError
				}
				dst = utf8.AppendRune(dst, r)
			default:
				return dst, i - 1, &Error{Offset: i - 1, Msg: "invalid escape"}
			}
		case c < utf8.RuneSelf || !replaceInvalid:
			dst = append(dst, c)
			i++
		default:
			r, size := utf8.DecodeRune(d[i:])
			if r == utf8.RuneError && size == 1 {
				dst = utf8.AppendRune(dst, utf8.RuneError)
			} else {
				dst = append(dst, d[i:i+size]...)
			}
			i += size
		}
	}
}

// Hex4 reads the four hex digits of a \u escape at d[i:]; ok is false when they are not four hex digits.
func Hex4(d []byte, i int) (rune, bool) {
	if i+4 > len(d) {
		return 0, false
	}
	var v rune
	for _, c := range d[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			v = v<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return v, true
}
