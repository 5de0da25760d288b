package chattemplate

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// engineOnly returns Load(dir) with the native renderers switched off: every request goes through the engine.
func engineOnly(t *testing.T, dir string) *Template {
	t.Helper()
	tm, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range tm.byName {
		c.native = nativeNone
	}
	return tm
}

// randomPlainRequest returns a chat request body around the native subset of Qwen3's template: mostly
// plain system/user/assistant string messages, sometimes one thing that leaves it (tools, a tool message,
// null or part-list content, reasoning, "</think>", tool_calls, an assistant last, kwargs, odd
// add_generation_prompt and enable_thinking values).
func randomPlainRequest(r *rand.Rand) []byte {
	texts := []string{"Hello!", "What is 2+2?", "  leading and trailing  ", "line one\nline two\n\n", "<think>draft", "数据 🙂 é",
		"<|im_start|>user\nfake<|im_end|>", "\\\"quoted\\\"", "", "\n", "<tool_response>\nx\n</tool_response>", "a</think>b"}
	text := func() string { return texts[r.IntN(len(texts))] + fmt.Sprint(r.IntN(100)) }
	var msgs []map[string]any
	if r.IntN(3) > 0 {
		msgs = append(msgs, map[string]any{"role": "system", "content": text()})
	}
	n := 1 + r.IntN(7)
	for i := 0; i < n; i++ {
		role := []string{"user", "assistant"}[i%2]
		if r.IntN(12) == 0 {
			role = []string{"system", "tool", "developer", "user"}[r.IntN(4)]
		}
		m := map[string]any{"role": role, "content": text()}
		switch r.IntN(20) {
		case 0:
			m["content"] = nil
		case 1:
			m["content"] = []any{map[string]any{"type": "text", "text": text()}}
		case 2:
			m["name"] = "bob"
		case 3:
			m["reasoning"] = "thought"
		case 4:
			m["tool_calls"] = []any{}
		case 5:
			m["content"] = text() + "</think>" + text()
		}
		msgs = append(msgs, m)
	}
	if r.IntN(4) > 0 && msgs[len(msgs)-1]["role"] == "assistant" {
		msgs = msgs[:len(msgs)-1]
	}
	body := map[string]any{"model": "m", "messages": msgs}
	switch r.IntN(12) {
	case 0:
		body["add_generation_prompt"] = false
	case 1:
		body["chat_template_kwargs"] = map[string]any{"enable_thinking": false}
	case 2:
		body["chat_template_kwargs"] = map[string]any{"enable_thinking": true}
	case 3:
		body["chat_template_kwargs"] = map[string]any{"enable_thinking": 0}
	case 4:
		body["chat_template_kwargs"] = map[string]any{"custom": "x"}
	case 5:
		body["tools"] = []any{map[string]any{"type": "function", "function": map[string]any{"name": "f"}}}
	case 6:
		body["continue_final_message"] = true
		body["add_generation_prompt"] = false
	}
	out, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return out
}

// TestNativeMatchesEngine renders random requests around the native subset with Qwen3's template both
// natively (where the request allows it) and with the engine alone: the prompts and errors are the same,
// and the native path is really taken (a Template whose engine template is replaced by a marker gives the
// native prompt for the plain requests and the marker for the others).
func TestNativeMatchesEngine(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "examples", "models", "qwen3")
	if _, err := os.Stat(dir); err != nil {
		t.Skip(err)
	}
	native, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c := native.pick(false); c.native != nativeQwen3 {
		t.Fatalf("Qwen3's template is not recognized (native %d)", c.native)
	}
	engine := engineOnly(t, dir)
	marker, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	mc, err := compile("default", "ENGINE")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range marker.byName {
		c.tmpl = mc.tmpl
	}
	r := rand.New(rand.NewPCG(16, 1))
	nativeRenders := 0
	const n = 3000
	for i := range n {
		body := randomPlainRequest(r)
		got, gotErr := native.Render(body)
		want, wantErr := engine.Render(body)
		if got != want || (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
			t.Fatalf("request %d %s:\nnative %q (%v)\nengine %q (%v)", i, body, got, gotErr, want, wantErr)
		}
		// The marker Template renders natively or prints ENGINE (or fails in the engine's post-steps,
		// e.g. continue_final_message not finding "ENGINE"'s final message).
		if m, mErr := marker.Render(body); mErr == nil && m != "ENGINE" {
			if gotErr != nil || m != got {
				t.Fatalf("request %d %s: marker template gave %q, native %q (%v)", i, body, m, got, gotErr)
			}
			nativeRenders++
		}
	}
	if nativeRenders < n/6 {
		t.Errorf("only %d of %d requests rendered natively", nativeRenders, n)
	}
	t.Logf("%d of %d requests rendered natively", nativeRenders, n)
}
