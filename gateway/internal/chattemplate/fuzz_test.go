package chattemplate_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/gateway/internal/chattemplate"
)

// checkTyped fails unless err is nil, a *RequestError or a *RenderError.
func checkTyped(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	var req *chattemplate.RequestError
	var ren *chattemplate.RenderError
	if !errors.As(err, &req) && !errors.As(err, &ren) {
		t.Fatalf("untyped error %T: %v", err, err)
	}
}

// FuzzRender feeds arbitrary request bodies to the Qwen3 (string content) and Gemma-3 (content parts)
// templates: Render must never panic, every error must be typed, and output stays within the limit.
// Seeds: testdata/fuzz/FuzzRender plus the reference conversations.
func FuzzRender(f *testing.F) {
	for _, c := range loadConversations(f) {
		f.Add(requestBody(f, c, false))
		f.Add(requestBody(f, c, true))
	}
	lim := chattemplate.WithLimits(chattemplate.Limits{MaxOutputBytes: 1 << 20, MaxIterations: 20000})
	var tmpls []*chattemplate.Template
	for _, m := range []string{"qwen3", "gemma3", "deepseek_v3", "llama3_1"} {
		tmpls = append(tmpls, newTemplate(f, m, lim))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, tmpl := range tmpls {
			out, err := tmpl.Render(body)
			checkTyped(t, err)
			// The parse-once path renders the same; its errors are the same, except that malformed JSON
			// later in the body wins over an earlier field error (ParseRequest reads the whole body).
			_, perr := chattemplate.ParseRequest(body, nil)
			out2, err2 := renderParsed(tmpl, body)
			if out2 != out || (err == nil) != (err2 == nil) || err != nil && perr == nil && err.Error() != err2.Error() {
				t.Fatalf("ParseRequest+RenderRequest: %q, %v; Render: %q, %v", out2, err2, out, err)
			}
			if len(out) > 1<<20 {
				t.Fatalf("output of %d bytes over the limit", len(out))
			}
		}
	})
}

// FuzzTemplateSource feeds arbitrary template sources through New and one render: compiling (the
// whitespace pre-pass, the budget instrumentation, content-format detection, ardanlabs/jinja's parser)
// and rendering must never panic; render errors must be typed. Seeds: testdata/fuzz/FuzzTemplateSource
// plus the four reference templates.
func FuzzTemplateSource(f *testing.F) {
	for _, m := range models {
		f.Add(string(readFile(f, filepath.Join("testdata/templates", m+".jinja"))))
	}
	lim := chattemplate.WithLimits(chattemplate.Limits{MaxOutputBytes: 1 << 16, MaxIterations: 5000, MaxDepth: 64})
	body := []byte(`{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "u"}]}, {"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}], "tools": [{"type": "function", "function": {"name": "f"}}]}`)
	f.Fuzz(func(t *testing.T, src string) {
		if len(src) > 4096 || strings.Contains(src, "*") {
			// Bound the work per input: "*" repetition can allocate 64 MiB per expression in the engine.
			return
		}
		tmpl, err := chattemplate.New(src, map[string]string{"bos_token": "<s>"}, lim)
		if err != nil {
			return
		}
		out, err := tmpl.Render(body)
		checkTyped(t, err)
		if len(out) > 1<<16 {
			t.Fatalf("output of %d bytes over the limit", len(out))
		}
	})
}
