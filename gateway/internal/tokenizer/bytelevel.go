package tokenizer

import "unicode/utf8"

// byteToRune is GPT-2's byte-to-unicode table: printable Latin-1 bytes map to themselves, the other 68 bytes
// to U+0100 onwards in byte order. runeToByte is its inverse.
var (
	byteToRune [256]rune
	runeToByte [324]int16 // rune -> byte, -1 for runes outside the alphabet (all alphabet runes are < 324)
)

func init() {
	n := 0
	for i := range runeToByte {
		runeToByte[i] = -1
	}
	for b := 0; b < 256; b++ {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if printable {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = rune(256 + n)
			n++
		}
		runeToByte[byteToRune[b]] = int16(b)
	}
}

// byteLevelDecode maps a byte-level token string (GPT-2 alphabet) to its raw bytes. A token holding any
// character outside the alphabet is returned unchanged, as HF's ByteLevel decoder does.
func byteLevelDecode(tok string) string {
	var arr [64]byte
	buf, ok := appendByteLevelDecode(arr[:0], tok)
	if !ok {
		return tok
	}
	return string(buf)
}

// appendByteLevelDecode appends the raw bytes of a byte-level token (a string, or a []byte such as a
// vocabulary key read from tokenizer.json) to buf; ok is false when tok holds a character outside the
// alphabet. It reads tok in place (no conversion, so neither form is copied): the alphabet's characters
// are below U+0144, one byte or two in UTF-8, so the two-byte sequences are decoded here and anything
// else (a longer sequence, or invalid UTF-8, which utf8.DecodeRune would read as U+FFFD) is outside it.
func appendByteLevelDecode[S string | []byte](buf []byte, tok S) ([]byte, bool) {
	for i := 0; i < len(tok); {
		c := tok[i]
		if c < utf8.RuneSelf {
			if runeToByte[c] < 0 {
				return buf, false
			}
			buf = append(buf, c)
			i++
			continue
		}
		// A two-byte sequence: lead 0xC2..0xDF (0xC0 and 0xC1 would be overlong), then a continuation byte.
		if c < 0xC2 || c > 0xDF || i+1 == len(tok) || tok[i+1]&0xC0 != 0x80 {
			return buf, false
		}
		r := rune(c&0x1F)<<6 | rune(tok[i+1]&0x3F)
		if int(r) >= len(runeToByte) || runeToByte[r] < 0 {
			return buf, false
		}
		buf = append(buf, byte(runeToByte[r]))
		i += 2
	}
	return buf, true
}

// appendLossyUTF8 appends b to dst as valid UTF-8, replacing each maximal ill-formed subpart with U+FFFD the
// way Rust's String::from_utf8_lossy does (Go's utf8 package would emit one U+FFFD per byte instead).
func appendLossyUTF8(dst []byte, b []byte) []byte {
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || size > 1 {
			dst = append(dst, b[i:i+size]...)
			i += size
			continue
		}
		dst = append(dst, "\uFFFD"...)
		i += maximalSubpart(b[i:])
	}
	return dst
}

// maximalSubpart returns the length (>= 1) of the ill-formed sequence starting at b[0], per Unicode's
// "maximal subpart" rule.
func maximalSubpart(b []byte) int {
	c := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
		need = 2
	case c == 0xED:
		need, hi = 2, 0x9F
	case c == 0xF0:
		need, lo = 3, 0x90
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	case c == 0xF4:
		need, hi = 3, 0x8F
	default:
		return 1
	}
	n := 1
	for k := 0; k < need && n < len(b); k++ {
		x := b[n]
		if k == 0 {
			if x < lo || x > hi {
				break
			}
		} else if x < 0x80 || x > 0xBF {
			break
		}
		n++
	}
	return n
}
