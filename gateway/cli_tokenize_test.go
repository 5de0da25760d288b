package gateway

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/kvstore/testenv"
)

// tokModelDir locates a reference model like the tokenizer tests do (kvstore/testenv.ModelDir).
func tokModelDir(t *testing.T, m string) string { t.Helper(); return testenv.ModelDir(t, m) }

func runTokenize(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	cmd := newTokenizeCmd()
	cmd.SetArgs(args)
	cmd.SetIn(strings.NewReader(stdin))
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.Execute()
	return out.String(), err
}

type goldenIDs struct {
	Name          string   `json:"name"`
	IDs           []uint32 `json:"ids"`
	SpecialPrefix []uint32 `json:"special_prefix"`
}

// readLines decodes a JSON-lines golden file (kvstore/testenv.ReadJSONL).
func readLines[T any](t *testing.T, path string) []T {
	t.Helper()
	return testenv.ReadJSONL[T](t, path)
}

// TestTokenizeJSONLCorpus feeds the 81-case corpus through `tokenize --jsonl [--special]` and compares
// every line with HF's goldens (gateway/internal/tokenizer/testdata/goldens).
func TestTokenizeJSONLCorpus(t *testing.T) {
	goldens := filepath.Join("internal", "tokenizer", "testdata", "goldens")
	corpus, err := os.ReadFile(filepath.Join(goldens, "corpus.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"qwen3", "llama3_1"} {
		dir := tokModelDir(t, m)
		golden := readLines[goldenIDs](t, filepath.Join(goldens, m+".jsonl"))
		for _, special := range []bool{false, true} {
			args := []string{"--model", dir, "--jsonl"}
			if special {
				args = append(args, "--special")
			}
			out, err := runTokenize(t, string(corpus), args...)
			if err != nil {
				t.Fatalf("%s: %v", m, err)
			}
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if len(lines) != 81 {
				t.Fatalf("%s: %d output lines, want 81", m, len(lines))
			}
			for i, l := range lines {
				var got struct {
					IDs []uint32 `json:"ids"`
				}
				if err := json.Unmarshal([]byte(l), &got); err != nil {
					t.Fatalf("%s line %d: %v: %s", m, i, err, l)
				}
				want := golden[i].IDs
				if special {
					want = append(slices.Clone(golden[i].SpecialPrefix), want...)
				}
				if !slices.Equal(got.IDs, want) && len(want)+len(got.IDs) > 0 {
					t.Errorf("%s special=%v %s: got %v want %v", m, special, golden[i].Name, got.IDs, want)
				}
			}
		}
	}
}

func TestTokenizeText(t *testing.T) {
	dir := tokModelDir(t, "llama3_1")
	// "Hello world" is the corpus case "hello" (HF: [9906, 1917], BOS 128000).
	out, err := runTokenize(t, "Hello world", "--model", dir, "--special")
	if err != nil || out != "[128000,9906,1917]\n" {
		t.Errorf("got %q, %v", out, err)
	}
	out, err = runTokenize(t, "Hello world", "--model", dir)
	if err != nil || out != "[9906,1917]\n" {
		t.Errorf("got %q, %v", out, err)
	}
	// The demo model ships gzipped.
	out, err = runTokenize(t, "Hello world", "--model", filepath.Join("..", "examples", "models", "qwen3"))
	if err != nil || out != "[9707,1879]\n" {
		t.Errorf("demo qwen3: got %q, %v", out, err)
	}
}

func TestTokenizeErrors(t *testing.T) {
	dir := tokModelDir(t, "qwen3")
	if _, err := runTokenize(t, "x"); err == nil {
		t.Error("missing --model accepted")
	}
	if _, err := runTokenize(t, "x", "--model", t.TempDir()); err == nil {
		t.Error("directory without tokenizer accepted")
	}
	// A broken line yields {"error"} in place, the others still answer, and the exit is non-zero.
	out, err := runTokenize(t, "{\"text\":\"a\"}\nnot json\n{\"text\":\"b\"}\n", "--model", dir, "--jsonl")
	if err == nil {
		t.Error("failed line did not make the command fail")
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[1], `{"error":`) || lines[0] != `{"ids":[64]}` || lines[2] != `{"ids":[65]}` {
		t.Errorf("jsonl output %q", out)
	}
}

// TestTokenizeChat renders a reference conversation with --chat (prompt and IDs must equal the Python
// jinja2 render in gateway/internal/chattemplate/testdata and HF's IDs in gateway/internal/model/testdata) and checks that a request the template rejects
// prints {"error"} and fails.
func TestTokenizeChat(t *testing.T) {
	renders := filepath.Join("..", "gateway", "internal", "chattemplate", "testdata", "renders_py")
	ids := filepath.Join("internal", "model", "testdata", "renders")
	body := `{"model":"m","messages":[{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello! What's 2+2?"}],"add_generation_prompt":true}`
	want, err := os.ReadFile(filepath.Join(renders, "qwen3", "sys_user_gen.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var wantIDs []uint32
	for _, g := range readLines[goldenIDs](t, filepath.Join(ids, "qwen3.ids.jsonl")) {
		if g.Name == "sys_user_gen" {
			wantIDs = g.IDs
		}
	}
	out, err := runTokenize(t, body, "--model", tokModelDir(t, "qwen3"), "--chat")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Prompt string   `json:"prompt"`
		IDs    []uint32 `json:"ids"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got.Prompt != string(want) || !slices.Equal(got.IDs, wantIDs) {
		t.Errorf("--chat: got %q %v\nwant %q %v", got.Prompt, got.IDs, want, wantIDs)
	}
	// Gemma-3's template raises when roles do not alternate.
	bad := `{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}`
	out, err = runTokenize(t, bad, "--model", tokModelDir(t, "gemma3"), "--chat")
	if err == nil || !strings.HasPrefix(out, `{"error":"`) || !strings.Contains(out, "alternate") {
		t.Errorf("rejected request: out %q err %v", out, err)
	}
	// In --jsonl, chat lines and text lines mix, in order.
	out, err = runTokenize(t, body+"\n{\"text\":\"Hello world\"}\n", "--model", tokModelDir(t, "qwen3"), "--jsonl")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if err != nil || len(lines) != 2 || !strings.HasPrefix(lines[0], `{"prompt":"<|im_start|>system`) || lines[1] != `{"ids":[9707,1879]}` {
		t.Errorf("jsonl chat+text: %q %v", out, err)
	}
}
