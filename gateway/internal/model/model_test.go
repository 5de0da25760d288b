package model

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/gateway/internal/chattemplate"
	"github.com/kvgate/kvgate/gateway/internal/tokenizer"
	"github.com/kvgate/kvgate/kvstore/testenv"
)

// repoRoot is the directory holding go.mod (kvstore/testenv.RepoRoot).
func repoRoot(t testing.TB) string { t.Helper(); return testenv.RepoRoot(t) }

// modelDir locates a reference model ($KVGATE_MODELS_DIR or <repo>/.cache/models); a missing model skips
// the test, or fails it when CI=true (kvstore/testenv.ModelDir).
func modelDir(t testing.TB, m string) string { t.Helper(); return testenv.ModelDir(t, m) }

var (
	toksMu sync.Mutex
	toks   = map[string]*tokenizer.Tokenizer{}
)

func loadTok(t testing.TB, dir string) *tokenizer.Tokenizer {
	t.Helper()
	toksMu.Lock()
	defer toksMu.Unlock()
	if tk, ok := toks[dir]; ok {
		return tk
	}
	tk, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	toks[dir] = tk
	return tk
}

type idsLine struct {
	Name string   `json:"name"`
	IDs  []uint32 `json:"ids"`
}

func readIDs(t testing.TB, path string) []idsLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []idsLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var l idsLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

// chatGoldens is the chat template package's reference data (conversations.json, tools.json and the
// Python jinja2 renders in renders_py/): read from there, not copied, so the two packages test the same
// renders. The token IDs HF's tokenizers produced for those renders are this package's testdata/renders.
const chatGoldens = "../chattemplate/testdata"

// TestRenderIDs encodes the 28 reference chat renders (4 templates x 7 conversations) and compares with
// the IDs HF's tokenizers produced for them, through the segment cache (twice: cold and cached).
func TestRenderIDs(t *testing.T) {
	for _, m := range []string{"qwen3", "llama3_1", "deepseek_v3", "gemma3"} {
		t.Run(m, func(t *testing.T) {
			md := New(loadTok(t, modelDir(t, m)), nil)
			golden := readIDs(t, filepath.Join("testdata", "renders", m+".ids.jsonl"))
			if len(golden) != 7 {
				t.Fatalf("%d renders, want 7", len(golden))
			}
			for _, g := range golden {
				b, err := os.ReadFile(filepath.Join(chatGoldens, "renders_py", m, g.Name+".txt"))
				if err != nil {
					t.Fatal(err)
				}
				for pass := range 2 {
					if got := md.EncodePrompt(string(b)); !slices.Equal(got, g.IDs) {
						t.Errorf("%s pass %d: EncodePrompt\n got  %v\n want %v", g.Name, pass, got, g.IDs)
					}
				}
				if got := md.Tokenizer().Encode(string(b), false); !slices.Equal(got, g.IDs) {
					t.Errorf("%s: Encode differs from golden", g.Name)
				}
			}
		})
	}
}

// benchText returns the tokenizer package's 1 MB bench text.
func benchText(t testing.TB) string {
	t.Helper()
	return string(testenv.ReadGzip(t, filepath.Join(repoRoot(t), "gateway", "internal", "tokenizer", "testdata", "goldens", "bench.txt.gz")))
}

// chatML renders turns in Qwen's ChatML layout (the shape Qwen3's template produces for plain messages).
func chatML(turns []string) string {
	var sb strings.Builder
	sb.WriteString("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
	for i, t := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		fmt.Fprintf(&sb, "<|im_start|>%s\n%s<|im_end|>\n", role, t)
	}
	sb.WriteString("<|im_start|>assistant\n")
	return sb.String()
}

// conversation cuts the bench text into turns of about turnBytes bytes until the rendered prompt holds
// at least minTokens tokens.
func conversation(t testing.TB, tk *tokenizer.Tokenizer, turnBytes, minTokens int) []string {
	text := benchText(t)
	var turns []string
	for off := 0; off+turnBytes <= len(text); off += turnBytes {
		turns = append(turns, strings.ToValidUTF8(text[off:off+turnBytes], ""))
		if len(turns)%8 == 0 && len(tk.Encode(chatML(turns), false)) >= minTokens {
			break
		}
	}
	return turns
}

// TestEncodePromptEqualsEncode re-encodes a growing conversation turn by turn: each turn's IDs must equal
// the uncached Encode, and the cache must have served the earlier turns.
func TestEncodePromptEqualsEncode(t *testing.T) {
	tk := loadTok(t, modelDir(t, "qwen3"))
	md := New(tk, nil)
	minTokens := 8000
	if testing.Short() {
		minTokens = 2000
	}
	turns := conversation(t, tk, 1500, minTokens)
	for k := 1; k <= len(turns); k++ {
		p := chatML(turns[:k])
		if got, want := md.EncodePrompt(p), tk.Encode(p, false); !slices.Equal(got, want) {
			t.Fatalf("turn %d: EncodePrompt differs from Encode (%d vs %d IDs)", k, len(got), len(want))
		}
	}
	if n := md.segs.len(); n < len(turns) {
		t.Errorf("segment cache holds %d segments, want >= %d", n, len(turns))
	}
	// Invalid UTF-8 is repaired as Encode does.
	bad := "<|im_start|>user\n" + strings.Repeat("x\xff", 40) + "<|im_end|>"
	if got, want := md.EncodePrompt(bad), tk.Encode(bad, false); !slices.Equal(got, want) {
		t.Errorf("invalid UTF-8: %v vs %v", got, want)
	}
}

func TestEncodeCompletionAddsBOS(t *testing.T) {
	tk := loadTok(t, modelDir(t, "llama3_1"))
	md := New(tk, nil)
	got := md.EncodeCompletion("Hello")
	want := []uint32{128000, 9906} // <|begin_of_text|> Hello (HF tokenizers)
	if !slices.Equal(got, want) {
		t.Errorf("EncodeCompletion = %v, want %v", got, want)
	}
}

func TestEncodeChatWithoutTemplate(t *testing.T) {
	md := New(loadTok(t, modelDir(t, "llama2")), nil)
	if _, _, err := md.EncodeChat([]byte(`{"messages":[]}`)); !errors.Is(err, ErrNoChatTemplate) {
		t.Errorf("err = %v, want ErrNoChatTemplate", err)
	}
}

func TestSegmentCacheBounded(t *testing.T) {
	c := newSegmentCache(16 * 4096)
	for i := range 10000 {
		s := fmt.Sprintf("%08d%s", i, strings.Repeat("x", 100))
		c.put(s, []uint32{uint32(i)})
	}
	if _, most := c.c.Bytes(); most > c.c.ShardLimit() {
		t.Errorf("a shard holds %d bytes over its limit %d", most, c.c.ShardLimit())
	}
	total := c.len()
	if total == 0 || total >= 10000 {
		t.Errorf("cache holds %d entries", total)
	}
	// The most recent entry survives.
	s := fmt.Sprintf("%08d%s", 9999, strings.Repeat("x", 100))
	if ids, ok := c.get(s); !ok || ids[0] != 9999 {
		t.Errorf("latest entry missing")
	}
}

type refConversation struct {
	Name                string          `json:"name"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
	Tools               bool            `json:"tools"`
	Kwargs              json.RawMessage `json:"kwargs"`
	Messages            json.RawMessage `json:"messages"`
}

// requestBody builds the OpenAI chat request of a reference conversation.
func requestBody(t testing.TB, c refConversation) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `{"model": "m", "messages": %s, "add_generation_prompt": %v`, c.Messages, c.AddGenerationPrompt)
	if c.Tools {
		tools, err := os.ReadFile(filepath.Join(chatGoldens, "tools.json"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, `, "tools": %s`, tools)
	}
	if len(c.Kwargs) > 0 {
		fmt.Fprintf(&b, `, "chat_template_kwargs": %s`, c.Kwargs)
	}
	b.WriteString("}")
	return []byte(b.String())
}

// TestEncodeChatGoldens runs the 7 reference conversations through Load + EncodeChat for the 4 models with
// templates: the prompt must equal the Python jinja2 reference render and the IDs HF's tokenizers' IDs
// for that render.
func TestEncodeChatGoldens(t *testing.T) {
	var convs []refConversation
	b, err := os.ReadFile(filepath.Join(chatGoldens, "conversations.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &convs); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"qwen3", "llama3_1", "deepseek_v3", "gemma3"} {
		t.Run(m, func(t *testing.T) {
			md, err := Load(modelDir(t, m))
			if err != nil {
				t.Fatal(err)
			}
			golden := map[string][]uint32{}
			for _, g := range readIDs(t, filepath.Join("testdata", "renders", m+".ids.jsonl")) {
				golden[g.Name] = g.IDs
			}
			for _, c := range convs {
				want, err := os.ReadFile(filepath.Join(chatGoldens, "renders_py", m, c.Name+".txt"))
				if err != nil {
					t.Fatal(err)
				}
				body := requestBody(t, c)
				prompt, ids, err := md.EncodeChat(body)
				// The parse-once path (EncodeChatRequest on chattemplate.ParseRequest) gives the same.
				parsed, perr := chattemplate.ParseRequest(body, nil)
				if perr != nil {
					t.Fatalf("%s: ParseRequest: %v", c.Name, perr)
				}
				prompt2, ids2, err2 := md.EncodeChatRequest(parsed)
				if prompt2 != prompt || !slices.Equal(ids2, ids) || (err == nil) != (err2 == nil) || err != nil && err.Error() != err2.Error() {
					t.Errorf("%s: EncodeChatRequest (%d IDs, %v) differs from EncodeChat (%d IDs, %v)", c.Name, len(ids2), err2, len(ids), err)
				}
				if msg, ok := strings.CutPrefix(string(want), "ERROR: TemplateError: "); ok {
					// The reference template raised: EncodeChat must fail the same way.
					re, isRender := errors.AsType[*chattemplate.RenderError](err)
					if !isRender || !errors.Is(err, chattemplate.ErrTemplateRaised) || re.Message != strings.TrimSpace(msg) {
						t.Errorf("%s: err = %v, want the template's exception %q", c.Name, err, msg)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s: %v", c.Name, err)
					continue
				}
				if prompt != string(want) {
					t.Errorf("%s: prompt differs from the reference render\n got  %q\n want %q", c.Name, prompt, want)
				}
				if !slices.Equal(ids, golden[c.Name]) {
					t.Errorf("%s: IDs differ from HF", c.Name)
				}
			}
		})
	}
}

// TestLoadWithoutTemplate: Llama-2's directory has no chat template; it loads for completions.
func TestLoadWithoutTemplate(t *testing.T) {
	md, err := Load(modelDir(t, "llama2"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := md.EncodeChat([]byte(`{"messages":[{"role":"user","content":"hi"}]}`)); !errors.Is(err, ErrNoChatTemplate) {
		t.Errorf("EncodeChat err = %v, want ErrNoChatTemplate", err)
	}
	parsed, err := chattemplate.ParseRequest([]byte(`{"messages":[{"role":"user","content":"hi"}]}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := md.EncodeChatRequest(parsed); !errors.Is(err, ErrNoChatTemplate) {
		t.Errorf("EncodeChatRequest err = %v, want ErrNoChatTemplate", err)
	}
	if got := md.EncodeCompletion("hello"); !slices.Equal(got, []uint32{1, 6312, 28709}) { // HF: <s> ▁hell o
		t.Errorf("EncodeCompletion = %v", got)
	}
}

// TestPrefixCacheBranchesAndEviction drives the prefix cache through a long conversation (140 turns, so
// its arena grows several times), branches (an edited earlier turn, a regenerated answer) and a cache
// small enough to evict: every result must equal plain Encode.
func TestPrefixCacheBranchesAndEviction(t *testing.T) {
	tk := loadTok(t, modelDir(t, "qwen3"))
	text := benchText(t)
	var turns []string
	for off := 0; len(turns) < 140; off += 300 {
		turns = append(turns, strings.ToValidUTF8(text[off:off+300], ""))
	}
	// The second limit leaves room for two or three prefixes per shard, so entries get evicted.
	for _, limit := range []int{DefaultPrefixCacheBytes, prefixShards * 150 << 10} {
		md := New(tk, nil)
		md.prefixes = newPrefixCache(limit)
		check := func(what string, p string) {
			t.Helper()
			if got, want := md.EncodePrompt(p), tk.Encode(p, false); !slices.Equal(got, want) {
				t.Fatalf("limit %d, %s: EncodePrompt differs from Encode (%d vs %d IDs)", limit, what, len(got), len(want))
			}
		}
		step := 1
		if testing.Short() {
			step = 7
		}
		for k := 1; k <= len(turns); k += step {
			check(fmt.Sprintf("turn %d", k), chatML(turns[:k]))
		}
		edited := slices.Clone(turns)
		edited[len(edited)/2] = "an edited message in the middle"
		check("edited middle turn", chatML(edited))
		check("regenerated last answer", chatML(append(slices.Clone(turns[:len(turns)-1]), "another answer")))
		check("same prompt again", chatML(turns))
		check("original after branch", chatML(turns))
	}
}

// TestConcurrentConversations runs several conversations at once on one Model (shared caches, a long
// shared system prompt) and checks every turn against plain Encode; run it with -race.
func TestConcurrentConversations(t *testing.T) {
	tk := loadTok(t, modelDir(t, "qwen3"))
	md := New(tk, nil)
	text := benchText(t)
	system := strings.ToValidUTF8(text[:600], "")
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			var turns []string
			off := 10000 + g*50000
			for k := range 12 {
				turns = append(turns, strings.ToValidUTF8(text[off+k*400:off+k*400+400], ""))
				p := "<|im_start|>system\n" + system + "<|im_end|>\n" + chatML(turns)
				if got, want := md.EncodePrompt(p), tk.Encode(p, false); !slices.Equal(got, want) {
					t.Errorf("conversation %d turn %d differs", g, k)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestCachesDisabled(t *testing.T) {
	tk := loadTok(t, modelDir(t, "qwen3"))
	md := NewWithOptions(tk, nil, Options{SegmentCacheBytes: -1, PrefixCacheBytes: -1})
	turns := conversation(t, tk, 1500, 2000)
	for k := 1; k <= len(turns); k++ {
		p := chatML(turns[:k])
		if got, want := md.EncodePrompt(p), tk.Encode(p, false); !slices.Equal(got, want) {
			t.Fatalf("turn %d differs", k)
		}
	}
	if n := md.segs.len(); n != 0 {
		t.Errorf("disabled segment cache holds %d entries", n)
	}
	if n := md.prefixes.c.Len(); n != 0 {
		t.Errorf("disabled prefix cache holds %d entries", n)
	}
}
