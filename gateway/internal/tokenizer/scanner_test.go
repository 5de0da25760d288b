package tokenizer

import (
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func pieces(p preTokenizer, s string) []string {
	var out []string
	p.each(s, true, func(x string, _ bool) { out = append(out, x) })
	return out
}

// scannerTexts returns the golden corpus and fuzz strings plus seeded random strings built from characters
// of every class the patterns distinguish.
func scannerTexts(t *testing.T) []string {
	var texts []string
	for _, f := range []string{"corpus.jsonl", "fuzz.jsonl"} {
		for _, c := range readJSONL[corpusCase](t, filepath.Join("testdata", "goldens", f)) {
			texts = append(texts, c.Text)
		}
	}
	alphabet := []string{"a", "Z", "é", "e\u0301", "\u0301", "ſ", "'", "'s", "'LL", "x", "1", "٣", "½", "Ⅻ", " ", "  ", "\t", "\n",
		"\r\n", "\u3000", "\u00a0", "\u2003", "\u0085", ".", "!", "$", "_", "(", "€", "👍", "\u200d", "\x00", "\x1b",
		"你", "好", "こ", "ン", "・", "\u3099", "한", "Ω", "-", "/", "`", "~"}
	rng := rand.New(rand.NewPCG(1, 2))
	n := 3000
	if testing.Short() {
		n = 300
	}
	for range n {
		var sb strings.Builder
		for k := rng.IntN(24); k >= 0; k-- {
			sb.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		texts = append(texts, sb.String())
	}
	return texts
}

// TestScannersMatchRegexp2 checks the hand-written scanners piece by piece against dlclark/regexp2 running
// the same patterns (the goldens pin both to HF).
func TestScannersMatchRegexp2(t *testing.T) {
	mustRe := func(p string) *splitPre {
		re, err := compileRegex(p, "test")
		if err != nil {
			t.Fatal(err)
		}
		return &splitPre{re: re, behavior: "Isolated", pattern: p}
	}
	cases := []struct {
		name    string
		scanner pieceScanner
		oracle  preTokenizer
	}{
		{"qwen", &gptScanner{maxDigits: 1}, mustRe(qwenPattern)},
		{"llama3", &gptScanner{maxDigits: 3}, mustRe(llama3Pattern)},
	}
	texts := scannerTexts(t)
	deepseekOracle := seqPre{mustRe(deepseekDigits), mustRe(deepseekCJK), mustRe(deepseekWords)}
	fails := 0
	for _, s := range texts {
		if got, want := pieces(deepseekScanner{}, s), pieces(deepseekOracle, s); !slices.Equal(got, want) {
			fails++
			if fails <= 3 {
				t.Errorf("deepseek: %q\n got  %q\n want %q", s, got, want)
			}
		}
	}
	if fails > 0 {
		t.Errorf("deepseek: %d of %d texts differ", fails, len(texts))
	}
	for _, c := range cases {
		fails := 0
		for _, s := range texts {
			if strings.Contains(s, "ſ") {
				// Oniguruma (HF) case-folds ſ to s in (?i:'s); regexp2 does not (see contraction).
				continue
			}
			var got []string
			for i := 0; i < len(s); {
				j := c.scanner.next(s, i)
				got = append(got, s[i:j])
				i = j
			}
			if want := pieces(c.oracle, s); !slices.Equal(got, want) {
				fails++
				if fails <= 3 {
					t.Errorf("%s: %q\n got  %q\n want %q", c.name, s, got, want)
				}
			}
		}
		if fails > 0 {
			t.Errorf("%s: %d of %d texts differ", c.name, fails, len(texts))
		}
	}
}

// TestScannerSelection checks that Load picks the hand-written scanners for the models they were written for.
func TestScannerSelection(t *testing.T) {
	if _, ok := loadModel(t, "qwen3").scanner.(*gptScanner); !ok {
		t.Error("qwen3 does not use gptScanner")
	}
	if _, ok := loadModel(t, "llama3_1").scanner.(*gptScanner); !ok {
		t.Error("llama3_1 does not use gptScanner")
	}
	if _, ok := loadModel(t, "deepseek_v3").pre.(deepseekScanner); !ok {
		t.Error("deepseek_v3 does not use deepseekScanner")
	}
}
