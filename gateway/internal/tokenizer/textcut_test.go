package tokenizer

import (
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// textCutModels says which reference tokenizers have text cuts.
var textCutModels = map[string]bool{"qwen3": true, "llama3_1": true, "deepseek_v3": true, "llama2": false, "gemma3": false}

// spliced encodes s cut at every text cut below its end, each piece on its own, and concatenates.
func spliced(tk *Tokenizer, s string) (ids []uint32, cuts int) {
	var at []int
	tk.TextCutsBefore(s, len(s), func(p int) bool { at = append(at, p); return true })
	slices.Reverse(at)
	prev := 0
	for _, p := range at {
		ids = append(ids, tk.Encode(s[prev:p], false)...)
		prev = p
	}
	return append(ids, tk.Encode(s[prev:], false)...), len(at)
}

// TestTextCutsGoldens: the goldens' texts encoded piece by piece at their text cuts give HF's IDs.
func TestTextCutsGoldens(t *testing.T) {
	corpus := readJSONL[corpusCase](t, filepath.Join("testdata", "goldens", "corpus.jsonl"))
	for name, want := range textCutModels {
		t.Run(name, func(t *testing.T) {
			tk := loadModel(t, name)
			if tk.TextCuts() != want {
				t.Fatalf("TextCuts() = %v, want %v", tk.TextCuts(), want)
			}
			golden := readJSONL[goldenCase](t, filepath.Join("testdata", "goldens", name+".jsonl"))
			byName := map[string][]uint32{}
			for _, g := range golden {
				byName[g.Name] = g.IDs
			}
			total := 0
			for _, c := range corpus {
				ids, ok := byName[c.Name]
				if !ok {
					continue
				}
				got, n := spliced(tk, c.Text)
				total += n
				if !want && n > 0 {
					t.Fatalf("%s: %d text cuts on a tokenizer without them", c.Name, n)
				}
				if !slices.Equal(got, ids) {
					t.Errorf("%s: spliced at %d cuts differs from HF at ID %d", c.Name, n, firstDiff(got, ids))
				}
			}
			if want && total == 0 {
				t.Error("no golden text has a text cut")
			}
		})
	}
}

func firstDiff(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestTextCutsRandom: random texts built around newlines (bench text, whitespace runs, punctuation,
// contractions, digits, CJK, kana, Hangul jamo, combining marks, the models' added tokens) encode the same
// whole and spliced at every text cut.
func TestTextCutsRandom(t *testing.T) {
	bench := readBench(t)
	frags := []string{"\n", "\n\n", "\r\n", " \n", "\n ", "  \n\t", "\n\r", "!\n", "?!\n\n", "'s", "'\n", "\n's",
		"é", "e\u0301", "\u0301", "\u1100\u1161", "\u1161", "ᄀ", "数据", "カタカナ", "ひらがな", "0123", "\n1",
		"\n-", "\n#", "\nA", "\nz", "\nÉ", "\nß", " the", "<|im_end|>", "<|eot_id|>", "<｜end▁of▁sentence｜>", "🙂", "\u200d"}
	steps := 400
	if testing.Short() {
		steps = 100
	}
	for name, want := range textCutModels {
		if !want {
			continue
		}
		t.Run(name, func(t *testing.T) {
			tk := loadModel(t, name)
			r := rand.New(rand.NewPCG(uint64(len(name)), 7))
			cuts := 0
			for i := range steps {
				var sb strings.Builder
				for n := 2 + r.IntN(12); n > 0; n-- {
					if r.IntN(2) == 0 {
						sb.WriteString(frags[r.IntN(len(frags))])
						continue
					}
					off := r.IntN(len(bench) - 1000)
					sb.WriteString(bench[off : off+r.IntN(300)])
				}
				s := strings.ToValidUTF8(sb.String(), "")
				got, n := spliced(tk, s)
				cuts += n
				if want := tk.Encode(s, false); !slices.Equal(got, want) {
					t.Fatalf("step %d: %q spliced at %d cuts differs from Encode at ID %d", i, s, n, firstDiff(got, want))
				}
			}
			if cuts < steps {
				t.Errorf("only %d text cuts in %d texts", cuts, steps)
			}
		})
	}
}
