package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// FuzzEncode checks that encoding never panics and round-trips: for Qwen3 decode(encode(x)) equals x after
// the model's normalizer (NFC, applied between added tokens as HF does: "<|im_end|>\u0338" must not
// compose '>' with the overlay), and for Llama-3.1 (no normalizer) it equals x. Invalid UTF-8 is replaced
// by U+FFFD first, as Encode documents. Seeds: testdata/fuzz/FuzzEncode.
func FuzzEncode(f *testing.F) {
	qwen := loadModel(f, "qwen3")
	llama := loadModel(f, "llama3_1")
	var gemma *Tokenizer
	if !testing.Short() {
		gemma = loadModel(f, "gemma3")
	}
	f.Add("Hello, world! It's 2026.")
	f.Add("<|im_start|>user\ncafe\u0301<|im_end|>\u0338")
	f.Fuzz(func(t *testing.T, x string) {
		valid := x
		if !utf8.ValidString(valid) {
			valid = strings.ToValidUTF8(valid, "\uFFFD")
		}
		ids := qwen.Encode(x, false)
		var want strings.Builder
		qwen.rawAdded.split(valid, func(s string) { want.WriteString(norm.NFC.String(s)) }, func(id uint32) {
			want.WriteString(qwen.addedByID[id].content)
		})
		if got := qwen.Decode(ids); got != want.String() {
			t.Errorf("qwen3: decode(encode(%q)) = %q, want %q", x, got, want.String())
		}
		if got := llama.Decode(llama.Encode(x, false)); got != valid {
			t.Errorf("llama3_1: decode(encode(%q)) = %q", x, got)
		}
		if got := llama.Encode(x, true); len(got) == 0 || got[0] != 128000 {
			t.Errorf("llama3_1: Encode(%q, true) does not start with BOS: %v", x, got)
		}
		if gemma != nil {
			gemma.Encode(x, true) // must not panic
		}
	})
}

// FuzzLoad feeds arbitrary bytes to the tokenizer.json parser (New): it must return a tokenizer or an error,
// never panic, and a tokenizer it returns must encode and decode without panicking. Seeds:
// testdata/fuzz/FuzzLoad (small valid files of each supported shape and broken variants).
func FuzzLoad(f *testing.F) {
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tk, err := New(data, nil)
		if err != nil {
			return
		}
		ids := tk.Encode("ab ab\n<x> é", true)
		tk.Decode(ids)
		tk.Decode([]uint32{0, 1, 2, 1 << 31})
	})
}
