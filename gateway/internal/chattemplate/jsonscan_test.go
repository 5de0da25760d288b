package chattemplate

import (
	"encoding/binary"
	"errors"
	"testing"
)

// FuzzJSONScanner checks the hand-written JSON scanner against encoding/json: the same inputs are
// rejected, and accepted inputs give the same values with the same key order.
func FuzzJSONScanner(f *testing.F) {
	for _, s := range []string{
		`{"a": [1, 2.5, -0, 1e400, "x\u00e9\ud83d\ude00", true, false, null], "b": {"c": {}}, "a": 2}`,
		`"\ud800\u0041 \udc00 \\ \/ \b\f\n\r\t"`, "\"\xff\xfe ok\"", `[1,]`, `{"a" 1}`, `01`, `1.`, `-`, `1e`,
		`[` + "\x00" + `]`, `"a` + "\x01" + `"`, ` {"k": [[[]]]} `, `1 2`, `nul`, `"\u12"`, `{"a":1}` + "\x00",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err1 := parseJSONValue(data)
		want, err2 := parseJSONValueStd(data)
		if (err1 == nil) != (err2 == nil) {
			if errors.Is(err1, errJSONDepth) && errors.Is(err2, errJSONDepth) {
				return
			}
			t.Fatalf("%q: scanner err %v, encoding/json err %v", data, err1, err2)
		}
		if err1 == nil && got.String() != want.String() {
			t.Fatalf("%q: scanner %s, encoding/json %s", data, got.String(), want.String())
		}
	})
}

// BenchmarkJSONDecode compares the scanner with the encoding/json token decoder on a 200-message body.
func BenchmarkJSONDecode(b *testing.B) {
	body := []byte(`{"messages": [`)
	for i := 0; i < 200; i++ {
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, `{"role": "user", "content": "Question: what is the weather like today in Zürich? \"quoted\"", "name": "n"}`...)
	}
	body = append(body, `]}`...)
	b.Run("scanner", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, err := parseJSONValue(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, err := parseJSONValueStd(body); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestSpecialIn8 checks the 8-byte test against a byte loop, for every byte value at every position of
// an otherwise plain word.
func TestSpecialIn8(t *testing.T) {
	special := func(c byte) bool { return c == '"' || c == '\\' || c < 0x20 }
	for pos := range 8 {
		for c := range 256 {
			for _, fill := range []byte{'a', 0xc3, 0x7f, 0x20, 0xff} {
				w := [8]byte{}
				for i := range w {
					w[i] = fill
				}
				w[pos] = byte(c)
				want := special(byte(c)) || special(fill)
				if got := specialIn8(binary.LittleEndian.Uint64(w[:])); got != want {
					t.Fatalf("specialIn8(%q) = %v, want %v", w, got, want)
				}
			}
		}
	}
}
