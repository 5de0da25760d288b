package tokenizer

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestDemoModelGz loads the gzipped Qwen3 demo copy shipped in examples/ and checks it against the Qwen3
// corpus goldens.
func TestDemoModelGz(t *testing.T) {
	tk, err := Load(filepath.Join(repoRoot(t), "examples", "models", "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	corpus := readJSONL[corpusCase](t, filepath.Join("testdata", "goldens", "corpus.jsonl"))
	checkCases(t, tk, corpus, readJSONL[goldenCase](t, filepath.Join("testdata", "goldens", "qwen3.jsonl")))
}

// TestSpecialTokens checks token lookups and BOS/EOS against HF's token_to_id on the same files.
func TestSpecialTokens(t *testing.T) {
	cases := []struct {
		model            string
		bos, eos         string
		bosID, eosID     uint32
		hasBOS           bool
		lookups          map[string]uint32
		missing          []string
		prefix           []uint32
		specialID, plain uint32
	}{
		{model: "qwen3", eos: "<|im_end|>", eosID: 151645, lookups: map[string]uint32{"Ġthe": 279, "<think>": 151667},
			missing: []string{"<|begin_of_text|>", "▁the"}, specialID: 151645, plain: 151667},
		{model: "llama3_1", bos: "<|begin_of_text|>", bosID: 128000, hasBOS: true, eos: "<|eot_id|>", eosID: 128009,
			lookups: map[string]uint32{"Ġthe": 279}, prefix: []uint32{128000}, specialID: 128009, plain: 279},
		{model: "deepseek_v3", bos: "<｜begin▁of▁sentence｜>", bosID: 0, hasBOS: true, eos: "<｜end▁of▁sentence｜>", eosID: 1,
			lookups: map[string]uint32{"Ġthe": 270}, specialID: 0, plain: 270},
		{model: "gemma3", bos: "<bos>", bosID: 2, hasBOS: true, eos: "<end_of_turn>", eosID: 106,
			lookups: map[string]uint32{"▁the": 506, "<s>": 203}, prefix: []uint32{2}, specialID: 106, plain: 506},
		{model: "llama2", bos: "<s>", bosID: 1, hasBOS: true, eos: "</s>", eosID: 2,
			lookups: map[string]uint32{"▁the": 272}, prefix: []uint32{1}, specialID: 2, plain: 272},
	}
	for _, c := range cases {
		t.Run(c.model, func(t *testing.T) {
			tk := loadModel(t, c.model)
			tok, id, ok := tk.BOS()
			if ok != c.hasBOS || (ok && (tok != c.bos || id != c.bosID)) {
				t.Errorf("BOS() = %q %d %v, want %q %d %v", tok, id, ok, c.bos, c.bosID, c.hasBOS)
			}
			if tok, id, ok := tk.EOS(); !ok || tok != c.eos || id != c.eosID {
				t.Errorf("EOS() = %q %d %v, want %q %d", tok, id, ok, c.eos, c.eosID)
			}
			for s, want := range c.lookups {
				if got, ok := tk.TokenID(s); !ok || got != want {
					t.Errorf("TokenID(%q) = %d %v, want %d", s, got, ok, want)
				}
			}
			for _, s := range c.missing {
				if got, ok := tk.TokenID(s); ok {
					t.Errorf("TokenID(%q) = %d, want absent", s, got)
				}
			}
			if !slices.Equal(tk.SpecialPrefix(), c.prefix) {
				t.Errorf("SpecialPrefix() = %v, want %v", tk.SpecialPrefix(), c.prefix)
			}
			if !tk.IsSpecial(c.specialID) || tk.IsSpecial(c.plain) {
				t.Errorf("IsSpecial wrong for %d / %d", c.specialID, c.plain)
			}
		})
	}
}

// TestDecodeInvalidBytes checks UTF-8 repair on decode against HF: byte-level (Rust from_utf8_lossy: one
// U+FFFD per maximal ill-formed subpart) and ByteFallback (one U+FFFD per byte of an invalid run).
func TestDecodeInvalidBytes(t *testing.T) {
	qwen := loadModel(t, "qwen3")
	// 158 = "â" (0xE2), 224 = "Ĥ" (0x82), 32 = "A", 187 = "ÿ" (0xFF); HF decodes to "\uFFFDA\uFFFD\uFFFD".
	if got := qwen.Decode([]uint32{158, 224, 32, 187, 187}); got != "\uFFFDA\uFFFD\uFFFD" {
		t.Errorf("qwen3 Decode = %q", got)
	}
	gemma := loadModel(t, "gemma3")
	// 5631 = "▁hi", 464/368/410 = <0xE2>/<0x82>/<0xAC>; HF: " hi" + 5 x U+FFFD + " hi".
	if got := gemma.Decode([]uint32{5631, 464, 368, 410, 464, 368, 5631}); got != " hi"+strings.Repeat("\uFFFD", 5)+" hi" {
		t.Errorf("gemma3 Decode = %q", got)
	}
	llama2 := loadModel(t, "llama2")
	// HF encodes "<s>hello world</s>" as [1 6312 28709 1526 2] and decodes it to "<s> hello world</s>".
	ids := llama2.Encode("<s>hello world</s>", false)
	if want := []uint32{1, 6312, 28709, 1526, 2}; !slices.Equal(ids, want) {
		t.Errorf("llama2 Encode = %v, want %v", ids, want)
	}
	if got := llama2.Decode(ids); got != "<s> hello world</s>" {
		t.Errorf("llama2 Decode = %q", got)
	}
	if got := qwen.Decode([]uint32{1 << 30}); got != "" {
		t.Errorf("unknown ID decoded to %q", got)
	}
}

// TestConcurrentEncode encodes the corpus from many goroutines at once (the word cache is shared and
// lock-free) and checks every result against the goldens; run it with -race.
func TestConcurrentEncode(t *testing.T) {
	tk := loadModel(t, "qwen3")
	corpus := readJSONL[corpusCase](t, filepath.Join("testdata", "goldens", "corpus.jsonl"))
	golden := readJSONL[goldenCase](t, filepath.Join("testdata", "goldens", "qwen3.jsonl"))
	tk.ResetCache()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for k := range 3 {
				for i := range corpus {
					c := corpus[(i+g*10+k)%len(corpus)]
					want := golden[(i+g*10+k)%len(corpus)].IDs
					if got := tk.Encode(c.Text, false); !slices.Equal(got, want) && len(got)+len(want) > 0 {
						t.Errorf("goroutine %d: %s differs", g, c.Name)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

func TestLoadErrors(t *testing.T) {
	if _, err := Load(t.TempDir()); !errors.Is(err, ErrNoTokenizerFile) {
		t.Errorf("empty dir: %v, want ErrNoTokenizerFile", err)
	}
	base := `{"added_tokens":[],"normalizer":%N,"pre_tokenizer":%P,"post_processor":null,"decoder":%D,
		"model":{"type":%M,"vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}}`
	build := func(n, p, d, m string) string {
		r := strings.NewReplacer("%N", n, "%P", p, "%D", d, "%M", m)
		return r.Replace(base)
	}
	unsupportedCases := []struct {
		name, json, component, typ string
	}{
		{"model", build("null", "null", "null", `"WordPiece"`), "model", "WordPiece"},
		{"normalizer", build(`{"type":"BertNormalizer"}`, "null", "null", `"BPE"`), "normalizer", "BertNormalizer"},
		{"nested normalizer", build(`{"type":"Sequence","normalizers":[{"type":"NFC"},{"type":"Precompiled"}]}`, "null", "null", `"BPE"`),
			"normalizer.normalizers[1]", "Precompiled"},
		{"pre-tokenizer", build("null", `{"type":"Whitespace"}`, "null", `"BPE"`), "pre_tokenizer", "Whitespace"},
		{"metaspace scheme", build("null", `{"type":"Metaspace","replacement":"▁","prepend_scheme":"sometimes"}`, "null", `"BPE"`),
			"pre_tokenizer", "Metaspace"},
		{"decoder", build("null", "null", `{"type":"WordPiece"}`, `"BPE"`), "decoder", "WordPiece"},
	}
	for _, c := range unsupportedCases {
		_, err := New([]byte(c.json), nil)
		ue, ok := errors.AsType[*UnsupportedError](err)
		if !ok {
			t.Errorf("%s: err = %v, want *UnsupportedError", c.name, err)
			continue
		}
		if ue.Component != c.component || ue.Type != c.typ {
			t.Errorf("%s: got component %q type %q, want %q %q", c.name, ue.Component, ue.Type, c.component, c.typ)
		}
	}
	// A minimal supported file works: "ab" merges into ID 2.
	tk, err := New([]byte(build("null", "null", "null", `"BPE"`)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := tk.Encode("ab", false); !slices.Equal(got, []uint32{2}) {
		t.Errorf("Encode(ab) = %v", got)
	}
	for _, bad := range []string{``, `{`, `{"model":{"type":"BPE","vocab":{"a":-1}}}`, `{"model":{"type":"BPE","vocab":{"a":0},"merges":["a a"]}}`,
		`{"model":{"type":"BPE","vocab":{"a":0},"merges":[["a"]]}}`, `[]`, `{"model":{"vocab":{"a":"x"}}}`} {
		if _, err := New([]byte(bad), nil); err == nil {
			t.Errorf("New(%q) accepted", bad)
		}
	}
}

// TestSmallMetaspaceFile exercises Prepend/Replace normalizers, byte_fallback, unk with fuse_unk and
// TemplateProcessing on a hand-made Llama-2-shaped file (the fuzz seed), where the expected IDs follow
// from HF's semantics and were confirmed with HF's tokenizers 0.23.2 on the same file.
func TestSmallMetaspaceFile(t *testing.T) {
	const file = `{"added_tokens":[{"id":1,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],` +
		`"normalizer":{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]},` +
		`"pre_tokenizer":null,"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],"pair":[{"Sequence":{"id":"A","type_id":0}},{"Sequence":{"id":"B","type_id":1}}],` +
		`"special_tokens":{"<s>":{"id":"<s>","ids":[1],"tokens":["<s>"]}}},` +
		`"decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]},` +
		`"model":{"type":"BPE","unk_token":"<unk>","fuse_unk":true,"byte_fallback":true,"vocab":{"<unk>":0,"<s>":1,"<0x41>":2,"▁":3,"a":4,"▁a":5},"merges":["▁ a"]}}`
	tk, err := New([]byte(file), nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		text    string
		special bool
		want    []uint32
	}{
		{"a a", false, []uint32{5, 5}},             // "▁a▁a": the merge applies at both places
		{"a a", true, []uint32{1, 5, 5}},           // BOS from TemplateProcessing
		{"A", false, []uint32{3, 2}},               // "▁" then byte fallback <0x41>
		{"ZZa", false, []uint32{3, 0, 4}},          // two unknown characters fuse into one <unk>
		{"<s>a", false, []uint32{1, 5}},            // Prepend applies to the text after the added token
		{"", true, []uint32{1}},                    // empty text still gets BOS
		{"aZ<s>Z", false, []uint32{5, 0, 1, 3, 0}}, // unk runs do not fuse across an added token
	}
	for _, c := range cases {
		if got := tk.Encode(c.text, c.special); !slices.Equal(got, c.want) {
			t.Errorf("Encode(%q, %v) = %v, want %v", c.text, c.special, got, c.want)
		}
	}
	if got := tk.Decode([]uint32{5, 5, 3, 2}); got != "a a A" {
		t.Errorf("Decode = %q, want %q", got, "a a A")
	}
}

// TestMemberOrder: tokenizer.json members may come in any order (a re-serialized file often sorts them,
// putting "model" before the pre-tokenizer); the result must not depend on it.
func TestMemberOrder(t *testing.T) {
	const model = `"model":{"type":"BPE","vocab":{"a":0,"▁":1,"▁a":2},"merges":["▁ a"]}`
	const pre = `"pre_tokenizer":{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true}`
	for _, f := range []string{"{" + model + "," + pre + "}", "{" + pre + "," + model + "}"} {
		tk, err := New([]byte(f), nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := tk.Encode("a a", false); !slices.Equal(got, []uint32{2, 2}) {
			t.Errorf("%s: Encode = %v, want [2 2]", f, got)
		}
	}
}
