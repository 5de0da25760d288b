package tokenizer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/text/unicode/norm"

	"github.com/kvgate/kvgate/kvstore/testenv"
)

// referenceModels are the five models whose goldens live in testdata/goldens.
var referenceModels = []string{"qwen3", "llama3_1", "deepseek_v3", "gemma3", "llama2"}

// repoRoot is the directory holding go.mod (kvstore/testenv.RepoRoot).
func repoRoot(t testing.TB) string { t.Helper(); return testenv.RepoRoot(t) }

// modelDir locates a reference model ($KVGATE_MODELS_DIR or <repo>/.cache/models); a missing model skips
// the test, or fails it when CI=true (kvstore/testenv.ModelDir).
func modelDir(t testing.TB, m string) string { t.Helper(); return testenv.ModelDir(t, m) }

var (
	loadedMu sync.Mutex
	loaded   = map[string]*Tokenizer{}
)

// loadModel loads (once per test binary) a reference model.
func loadModel(t testing.TB, m string) *Tokenizer {
	t.Helper()
	if testing.Short() && m != "qwen3" && m != "llama3_1" {
		t.Skipf("-short: only qwen3 and llama3_1 (the race run); %s runs without -short", m)
	}
	dir := modelDir(t, m)
	loadedMu.Lock()
	defer loadedMu.Unlock()
	if tk, ok := loaded[dir]; ok {
		return tk
	}
	tk, err := Load(dir)
	if err != nil {
		t.Fatalf("Load(%s): %v", dir, err)
	}
	loaded[dir] = tk
	return tk
}

type corpusCase struct {
	Name string `json:"name"`
	Text string `json:"text"`
}

type goldenCase struct {
	Name          string   `json:"name"`
	IDs           []uint32 `json:"ids"`
	SpecialPrefix []uint32 `json:"special_prefix"`
	IDsSpecial    []uint32 `json:"ids_special"`
	DecodeDiffers bool     `json:"decode_differs"`
	// bench.txt line
	Count        int    `json:"count"`
	CountSpecial int    `json:"count_special"`
	SHA256       string `json:"sha256"`
}

// readJSONL decodes a JSON-lines golden file (kvstore/testenv.ReadJSONL).
func readJSONL[T any](t testing.TB, path string) []T {
	t.Helper()
	return testenv.ReadJSONL[T](t, path)
}

// readBench returns the 1 MB bench text (testdata/goldens/bench.txt.gz).
func readBench(t testing.TB) string {
	t.Helper()
	return string(testenv.ReadGzip(t, filepath.Join("testdata", "goldens", "bench.txt.gz")))
}

// checkCases compares Encode (with and without special tokens) and Decode against one golden file.
func checkCases(t *testing.T, tk *Tokenizer, corpus []corpusCase, golden []goldenCase) {
	t.Helper()
	if len(golden) < len(corpus) {
		t.Fatalf("golden has %d cases, corpus %d", len(golden), len(corpus))
	}
	fails := 0
	for i, c := range corpus {
		g := golden[i]
		if g.Name != c.Name {
			t.Fatalf("case %d: golden %q vs corpus %q", i, g.Name, c.Name)
		}
		got := tk.Encode(c.Text, false)
		if !slices.Equal(got, g.IDs) && !(len(got) == 0 && len(g.IDs) == 0) {
			fails++
			if fails <= 5 {
				t.Errorf("%s: Encode(%q, false)\n got  %v\n want %v", c.Name, trunc(c.Text), got, g.IDs)
			}
			continue
		}
		want := g.IDsSpecial
		if want == nil {
			want = append(slices.Clone(g.SpecialPrefix), g.IDs...)
		}
		if got := tk.Encode(c.Text, true); !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
			fails++
			if fails <= 5 {
				t.Errorf("%s: Encode(%q, true)\n got  %v\n want %v", c.Name, trunc(c.Text), got, want)
			}
			continue
		}
		if !g.DecodeDiffers {
			if got := tk.Decode(g.IDs); got != c.Text {
				fails++
				if fails <= 5 {
					t.Errorf("%s: Decode = %q, want %q", c.Name, trunc(got), trunc(c.Text))
				}
			}
		}
	}
	if fails > 0 {
		t.Errorf("%d of %d cases differ", fails, len(corpus))
	}
}

func trunc(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

func TestCorpusGoldens(t *testing.T) {
	corpus := readJSONL[corpusCase](t, filepath.Join("testdata", "goldens", "corpus.jsonl"))
	if len(corpus) != 81 {
		t.Fatalf("corpus has %d cases, want 81", len(corpus))
	}
	for _, m := range referenceModels {
		t.Run(m, func(t *testing.T) {
			tk := loadModel(t, m)
			checkCases(t, tk, corpus, readJSONL[goldenCase](t, filepath.Join("testdata", "goldens", m+".jsonl")))
		})
	}
}

func TestFuzzGoldens(t *testing.T) {
	corpus := readJSONL[corpusCase](t, filepath.Join("testdata", "goldens", "fuzz.jsonl"))
	if len(corpus) != 2000 {
		t.Fatalf("fuzz corpus has %d cases, want 2000", len(corpus))
	}
	for _, m := range referenceModels {
		t.Run(m, func(t *testing.T) {
			tk := loadModel(t, m)
			checkCases(t, tk, corpus, readJSONL[goldenCase](t, filepath.Join("testdata", "goldens", "fuzz-"+m+".jsonl")))
		})
	}
}

// TestBenchGolden checks the 1 MB bench text: token count with and without special tokens and the sha256
// of the IDs joined by ",".
func TestBenchGolden(t *testing.T) {
	bench := readBench(t)
	for _, m := range referenceModels {
		t.Run(m, func(t *testing.T) {
			if testing.Short() {
				t.Skip("-short: the 1 MB text is slow under -race; it runs without -short")
			}
			tk := loadModel(t, m)
			golden := readJSONL[goldenCase](t, filepath.Join("testdata", "goldens", m+".jsonl"))
			g := golden[len(golden)-1]
			if g.Name != "bench.txt" {
				t.Fatalf("last golden line is %q, want bench.txt", g.Name)
			}
			ids := tk.Encode(bench, false)
			if len(ids) != g.Count {
				t.Errorf("count = %d, want %d", len(ids), g.Count)
			}
			if h := idsHash(ids); h != g.SHA256 {
				t.Errorf("sha256 = %s, want %s", h, g.SHA256)
			}
			if n := len(tk.Encode(bench, true)); n != g.CountSpecial {
				t.Errorf("count with special tokens = %d, want %d", n, g.CountSpecial)
			}
		})
	}
}

func idsHash(ids []uint32) string {
	var sb strings.Builder
	for i, id := range ids {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(strconv.FormatUint(uint64(id), 10))
	}
	h := sha256.Sum256([]byte(sb.String()))
	return hex.EncodeToString(h[:])
}

var _ = norm.NFC

// derivedModels are reference models with one component swapped, to cover components none of the five
// uses; testdata/reference/regen_goldens.js applies the same edits before running HF.
var derivedModels = map[string]struct {
	base string
	edit map[string]string // top-level tokenizer.json members replaced
}{
	// Llama-2 as Mistral/Llama tokenizer.json files are now written: Metaspace with prepend_scheme "first".
	"llama2_metaspace_first": {base: "llama2", edit: map[string]string{
		"normalizer":    `null`,
		"pre_tokenizer": `{"type":"Metaspace","replacement":"\u2581","prepend_scheme":"first","split":false}`,
	}},
}

func TestDerivedModels(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: derived models run without -short")
	}
	corpus := readJSONL[corpusCase](t, filepath.Join("testdata", "goldens", "corpus.jsonl"))
	fuzz := readJSONL[corpusCase](t, filepath.Join("testdata", "goldens", "fuzz.jsonl"))
	bench := readBench(t)
	for name, d := range derivedModels {
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join(modelDir(t, d.base), "tokenizer.json"))
			if err != nil {
				t.Fatal(err)
			}
			var top map[string]json.RawMessage
			if err := json.Unmarshal(raw, &top); err != nil {
				t.Fatal(err)
			}
			for k, v := range d.edit {
				top[k] = json.RawMessage(v)
			}
			edited, err := json.Marshal(top)
			if err != nil {
				t.Fatal(err)
			}
			tk, err := New(edited, nil)
			if err != nil {
				t.Fatal(err)
			}
			golden := readJSONL[goldenCase](t, filepath.Join("testdata", "goldens", name+".jsonl"))
			checkCases(t, tk, corpus, golden)
			checkCases(t, tk, fuzz, readJSONL[goldenCase](t, filepath.Join("testdata", "goldens", "fuzz-"+name+".jsonl")))
			g := golden[len(golden)-1]
			ids := tk.Encode(bench, false)
			if len(ids) != g.Count || idsHash(ids) != g.SHA256 {
				t.Errorf("bench: %d IDs hash %s, want %d %s", len(ids), idsHash(ids), g.Count, g.SHA256)
			}
		})
	}
}
