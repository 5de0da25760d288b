package tokenizer

import (
	"bytes"
	"testing"
	"unicode/utf8"
)

// referenceByteLevelDecode is the decoder written with utf8.DecodeRuneInString (the form before the
// string and []byte versions became one generic function).
func referenceByteLevelDecode(buf []byte, tok string) ([]byte, bool) {
	for i := 0; i < len(tok); {
		r, w := utf8.DecodeRuneInString(tok[i:])
		if int(r) >= len(runeToByte) || runeToByte[r] < 0 {
			return buf, false
		}
		buf = append(buf, byte(runeToByte[r]))
		i += w
	}
	return buf, true
}

// TestByteLevelDecodeExhaustive compares appendByteLevelDecode, on strings and on byte slices, with the
// reference on every input of one to three bytes, valid UTF-8 or not, and on every alphabet character.
func TestByteLevelDecodeExhaustive(t *testing.T) {
	check := func(tok string) {
		want, wantOK := referenceByteLevelDecode(nil, tok)
		got, ok := appendByteLevelDecode(nil, tok)
		gotB, okB := appendByteLevelDecode(nil, []byte(tok))
		if ok != wantOK || okB != wantOK || (ok && (!bytes.Equal(got, want) || !bytes.Equal(gotB, want))) {
			t.Fatalf("%q: got %q %v / %q %v, want %q %v", tok, got, ok, gotB, okB, want, wantOK)
		}
	}
	for a := range 256 {
		check(string([]byte{byte(a)}))
		for b := range 256 {
			check(string([]byte{byte(a), byte(b)}))
			for _, c := range []byte{0, 'a', 0x80, 0xA0, 0xBF, 0xC4, 0xFF} {
				check(string([]byte{byte(a), byte(b), c}))
			}
		}
	}
	for b := range 256 {
		check("x" + string(byteToRune[b]) + "y")
	}
}

// TestByteLevelDecodeNoCopy: decoding a string allocates nothing beyond buf (the string is not converted).
func TestByteLevelDecodeNoCopy(t *testing.T) {
	tok := "ĠhelloĊworldĠ" + string(byteToRune[0xE4]) + string(byteToRune[0xB8])
	buf := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() { appendByteLevelDecode(buf[:0], tok) }); n != 0 {
		t.Errorf("string decode: %v allocations", n)
	}
	raw := []byte(tok)
	if n := testing.AllocsPerRun(100, func() { appendByteLevelDecode(buf[:0], raw) }); n != 0 {
		t.Errorf("[]byte decode: %v allocations", n)
	}
}
