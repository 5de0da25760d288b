package sim

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestQwen3 runs the tests that need a real model directory on one engine (loading the tokenizer is the
// slow part, especially under -race; -short skips them).
func TestQwen3(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skips loading the Qwen3 tokenizer")
	}
	if !hasTokenizerFiles(qwen3Dir) {
		t.Fatalf("no tokenizer in %s (examples/models/qwen3 is committed)", qwen3Dir)
	}
	e := startEngine(t, func(c *Config) { c.Model = qwen3Dir; c.ServedModelNames = []string{"qwen3"} })
	t.Run("TextAndTokenTwins", func(t *testing.T) { testQwen3TextAndTokenTwins(t, e) })
	t.Run("ChatTextAndTokenTwins", func(t *testing.T) { testQwen3ChatTextAndTokenTwins(t, e) })
}

// With a model directory the simulator tokenizes with the model's own tokenizer (gateway/textmodel), so a text
// prompt and its token-ID twin hit the same cache blocks, and output text is decoded with it.
func testQwen3TextAndTokenTwins(t *testing.T, e *Engine) {
	b, err := os.ReadFile("testdata/qwen3_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	g := decode[struct {
		Text string   `json:"text"`
		IDs  []uint32 `json:"ids"`
	}](t, b)
	tok := decode[struct {
		Tokens []uint32 `json:"tokens"`
	}](t, post(t, e, "/tokenize", map[string]any{"model": "qwen3", "prompt": g.Text}).body)
	if !reflect.DeepEqual(tok.Tokens, g.IDs) {
		t.Fatalf("tokenize %q = %v, want %v", g.Text, tok.Tokens, g.IDs)
	}
	text := strings.Repeat(g.Text+" ", 20) // 180 tokens: 11 full blocks can hit
	ids := decode[struct {
		Tokens []uint32 `json:"tokens"`
	}](t, post(t, e, "/tokenize", map[string]any{"model": "qwen3", "prompt": text}).body).Tokens
	first := decode[completionJSON](t, post(t, e, "/v1/completions", map[string]any{"model": "qwen3", "prompt": text, "max_tokens": 6}).body)
	twin := decode[completionJSON](t, post(t, e, "/v1/completions", map[string]any{"model": "qwen3", "prompt": ids, "max_tokens": 6}).body)
	want := (len(ids) - 1) / 16 * 16
	if first.Usage.PromptTokens != len(ids) || twin.Usage.PromptTokensDetails.CachedTokens != want {
		t.Fatalf("text prompt %d tokens (want %d); twin cached %d (want %d)", first.Usage.PromptTokens, len(ids),
			twin.Usage.PromptTokensDetails.CachedTokens, want)
	}
	// Output is the simulator's ASCII sentence, decoded by the tokenizer: six words of it.
	out := first.Choices[0].Text
	if len(strings.Fields(out)) < 3 || !strings.Contains(outputText+outputText, strings.TrimSpace(out)) {
		t.Fatalf("output %q is not decoded text from the output sentence", out)
	}
}

// A chat request rendered with the chat template and its prompt_token_ids twin hit the same blocks.
func testQwen3ChatTextAndTokenTwins(t *testing.T, e *Engine) {
	msgs := []map[string]string{{"role": "system", "content": strings.Repeat("You are a careful assistant. ", 12)},
		{"role": "user", "content": "Name three prime numbers."}}
	r := post(t, e, "/tokenize", map[string]any{"model": "qwen3", "messages": msgs})
	if r.status != 200 {
		t.Fatalf("tokenize messages: HTTP %d: %s", r.status, r.body)
	}
	ids := decode[struct {
		Tokens []uint32 `json:"tokens"`
	}](t, r.body).Tokens
	text := decode[completionJSON](t, post(t, e, "/v1/chat/completions", map[string]any{"model": "qwen3", "messages": msgs, "max_tokens": 2}).body)
	twin := decode[completionJSON](t, post(t, e, "/v1/chat/completions", map[string]any{"model": "qwen3", "prompt_token_ids": ids, "max_tokens": 2}).body)
	if text.Usage.PromptTokens != len(ids) || twin.Usage.PromptTokensDetails.CachedTokens != (len(ids)-1)/16*16 {
		t.Fatalf("chat %d tokens (tokenize %d), twin cached %d", text.Usage.PromptTokens, len(ids), twin.Usage.PromptTokensDetails.CachedTokens)
	}
}
