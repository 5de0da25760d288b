package chattemplate_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/gateway/internal/chattemplate"
)

func mustNew(t *testing.T, src string, opts ...chattemplate.Option) *chattemplate.Template {
	t.Helper()
	tmpl, err := chattemplate.New(src, map[string]string{"bos_token": "<s>"}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return tmpl
}

func wantLimit(t *testing.T, out string, err error, msgPart string) {
	t.Helper()
	var re *chattemplate.RenderError
	if !errors.As(err, &re) || !errors.Is(err, chattemplate.ErrLimit) {
		t.Fatalf("want a *RenderError with ErrLimit, got %q (%d bytes), %v", truncate(out), len(out), err)
	}
	if !strings.Contains(re.Message, msgPart) {
		t.Fatalf("limit message %q does not mention %q", re.Message, msgPart)
	}
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

const oneMessage = `{"messages": [{"role": "user", "content": "hi"}]}`

// TestHundredThousandMessages: a 100k-entry message list is refused while it is decoded.
func TestHundredThousandMessages(t *testing.T) {
	var b bytes.Buffer
	b.WriteString(`{"messages": [`)
	for i := range 100000 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role": "user", "content": "hello there"}`)
	}
	b.WriteString(`]}`)
	tmpl := newTemplate(t, "qwen3")
	_, err := tmpl.Render(b.Bytes())
	var re *chattemplate.RequestError
	if !errors.As(err, &re) || !errors.Is(err, chattemplate.ErrLimit) || re.Path != "messages" || !strings.Contains(re.Message, "16384") {
		t.Fatalf("want a *RequestError (ErrLimit) on messages naming the 16384 limit, got %v", err)
	}
	// The limit is configurable and exact.
	small := newTemplate(t, "qwen3", chattemplate.WithLimits(chattemplate.Limits{MaxMessages: 2}))
	if _, err := small.Render([]byte(`{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}`)); err != nil {
		t.Fatalf("2 messages at a limit of 2: %v", err)
	}
	if _, err := small.Render([]byte(`{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}`)); !errors.As(err, &re) {
		t.Fatalf("3 messages at a limit of 2: want *RequestError, got %v", err)
	}
}

// TestRunawayTemplates: templates that would loop for hours, recurse without end (which overflows the
// Go stack and kills the process in ardanlabs/jinja), or grow their output without bound stop with
// ErrLimit.
func TestRunawayTemplates(t *testing.T) {
	cases := []struct {
		name, src, msg string
	}{
		{"nested loops 1e10 iterations", "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "100000 loop iterations"},
		{"infinite macro recursion", "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "nested deeper"},
		{"mutual macro recursion", "{% macro a(n) %}{{ b(n) }}{% endmacro %}{% macro b(n) %}x{{ a(n + 1) }}{% endmacro %}{{ a(0) }}", "nested deeper"},
		{"infinite recursive loop", "{% for x in [[1]] recursive %}{{ loop([x]) }}{% endfor %}", "deeper"},
		{"output bomb", "{% for i in range(100000) %}{{ 'x' * 1000000 }}{% endfor %}", "byte limit"},
		{"literal text bomb", "{% for i in range(100000) %}{% for j in range(1000) %}" + strings.Repeat("y", 1000) + "{% endfor %}{% endfor %}", "byte limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// A smaller iteration budget keeps the test fast; the timeout is out of the way so the
			// limit that fires is the one under test even on a loaded machine.
			lim := chattemplate.Limits{MaxIterations: 100000, Timeout: time.Minute}
			out, err := mustNew(t, c.src, chattemplate.WithLimits(lim)).Render([]byte(oneMessage))
			wantLimit(t, out, err, c.msg)
		})
	}
	if testing.Short() {
		return
	}
	// With the default limits the runaway loop stops too (by iterations, or by time on a slow machine).
	out, err := mustNew(t, cases[0].src).Render([]byte(oneMessage))
	wantLimit(t, out, err, "")
}

// TestRenderDeadline: the context and the Timeout limit stop a long render.
func TestRenderDeadline(t *testing.T) {
	slow := "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out, err := mustNew(t, slow).RenderContext(ctx, []byte(oneMessage))
	wantLimit(t, out, err, "canceled")

	tmpl := mustNew(t, slow, chattemplate.WithLimits(chattemplate.Limits{Timeout: 1, MaxIterations: 1 << 40}))
	out, err = tmpl.Render([]byte(oneMessage))
	wantLimit(t, out, err, "longer than")
}

func TestMaxOutputBytes(t *testing.T) {
	tmpl := newTemplate(t, "qwen3", chattemplate.WithLimits(chattemplate.Limits{MaxOutputBytes: 20}))
	out, err := tmpl.Render([]byte(oneMessage))
	wantLimit(t, out, err, "20-byte")
}

// TestRequestErrors: malformed requests and unsupported content are *RequestError with the right kind
// and path, never a panic or a silent render.
func TestRequestErrors(t *testing.T) {
	qwen := newTemplate(t, "qwen3")   // takes string content
	gemma := newTemplate(t, "gemma3") // loops over content parts
	image := `{"type": "image_url", "image_url": {"url": "http://x/y.png"}}`
	cases := []struct {
		name string
		tmpl *chattemplate.Template
		body string
		kind error
		path string
	}{
		{"not json", qwen, `{"messages": []`, chattemplate.ErrBadRequest, ""},
		{"truncated list", qwen, `{"messages": [`, chattemplate.ErrBadRequest, "messages[0]"},
		{"not an object", qwen, `[1, 2]`, chattemplate.ErrBadRequest, ""},
		{"no messages", qwen, `{"model": "x"}`, chattemplate.ErrBadRequest, "messages"},
		{"messages not a list", qwen, `{"messages": {"role": "user"}}`, chattemplate.ErrBadRequest, "messages"},
		{"message not an object", qwen, `{"messages": ["hi"]}`, chattemplate.ErrBadRequest, "messages[0]"},
		{"missing role", qwen, `{"messages": [{"content": "hi"}]}`, chattemplate.ErrBadRequest, "messages[0].role"},
		{"content a number", qwen, `{"messages": [{"role": "user", "content": 5}]}`, chattemplate.ErrBadRequest, "messages[0].content"},
		{"part without type", qwen, `{"messages": [{"role": "user", "content": [{"foo": 1}]}]}`, chattemplate.ErrBadRequest, "messages[0].content[0]"},
		{"text part not a string", qwen, `{"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}`, chattemplate.ErrBadRequest, "messages[0].content[0].text"},
		{"image on a string template", qwen, `{"messages": [{"role": "user", "content": [` + image + `]}]}`, chattemplate.ErrUnsupportedContent, "messages[0].content[0]"},
		{"unknown part type", gemma, `{"messages": [{"role": "user", "content": [{"type": "hologram"}]}]}`, chattemplate.ErrUnsupportedContent, "messages[0].content[0]"},
		{"embeddings", gemma, `{"messages": [{"role": "user", "content": [{"type": "image_embeds", "image_embeds": "AAAA"}]}]}`, chattemplate.ErrUnsupportedContent, "messages[0].content[0]"},
		{"tool call without function", qwen, `{"messages": [{"role": "assistant", "tool_calls": [{"id": "x"}]}]}`, chattemplate.ErrBadRequest, "messages[0].tool_calls[0].function"},
		{"tool without name", qwen, `{"messages": [], "tools": [{"type": "function", "function": {}}]}`, chattemplate.ErrBadRequest, "tools[0].function.name"},
		{"tool of another type", qwen, `{"messages": [], "tools": [{"type": "web", "function": {"name": "f"}}]}`, chattemplate.ErrBadRequest, "tools[0].type"},
		{"continue and generation prompt", qwen, `{"messages": [{"role": "user", "content": "a"}], "continue_final_message": true}`, chattemplate.ErrBadRequest, "continue_final_message"},
		{"request template", qwen, `{"messages": [], "chat_template": "{{ 1 }}"}`, chattemplate.ErrBadRequest, "chat_template"},
		{"kwargs template", qwen, `{"messages": [], "chat_template_kwargs": {"chat_template": "x"}}`, chattemplate.ErrBadRequest, "chat_template_kwargs.chat_template"},
		{"kwargs not an object", qwen, `{"messages": [], "chat_template_kwargs": [1]}`, chattemplate.ErrBadRequest, "chat_template_kwargs"},
		{"deep nesting", qwen, `{"messages": [{"role": "user", "content": "a", "x": ` + strings.Repeat("[", 500) + strings.Repeat("]", 500) + `}]}`, chattemplate.ErrBadRequest, "messages[0]"},
		{"trailing data", qwen, oneMessage + `{}`, chattemplate.ErrBadRequest, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := c.tmpl.Render([]byte(c.body))
			var re *chattemplate.RequestError
			if !errors.As(err, &re) || !errors.Is(err, c.kind) {
				t.Fatalf("want *RequestError %v, got %q, %v", c.kind, out, err)
			}
			if re.Path != c.path {
				t.Fatalf("path %q, want %q (%v)", re.Path, c.path, err)
			}
			// The parse-once path fails the same way.
			if _, err2 := renderParsed(c.tmpl, []byte(c.body)); err2 == nil || err2.Error() != err.Error() {
				t.Fatalf("ParseRequest+RenderRequest: %v, want %v", err2, err)
			}
		})
	}
	// The same image part is fine on a template that loops over content parts.
	out, err := gemma.Render([]byte(`{"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, ` + image + `]}]}`))
	if err != nil || !strings.Contains(out, "see<start_of_image>") {
		t.Fatalf("gemma3 with an image part: %q, %v", out, err)
	}
}

// TestTemplateErrors: a template that fails at run time is a *RenderError with ErrTemplateFailed; a
// template that does not compile fails New.
func TestTemplateErrors(t *testing.T) {
	out, err := mustNew(t, "{{ messages[0].content.nosuchmethod() }}").Render([]byte(oneMessage))
	var re *chattemplate.RenderError
	if !errors.As(err, &re) || !errors.Is(err, chattemplate.ErrTemplateFailed) {
		t.Fatalf("want ErrTemplateFailed, got %q, %v", out, err)
	}
	for _, src := range []string{"{% if %}", "{{ unclosed", "{% for x in y %}", "{# open", "{% raw %}x"} {
		if _, err := chattemplate.New(src, nil); err == nil {
			t.Errorf("New(%q) compiled", src)
		}
	}
	if _, err := chattemplate.New("x", nil, chattemplate.WithDefaultKwargs([]byte(`[1]`))); err == nil {
		t.Error("default kwargs that are not an object must fail New")
	}
}

// TestDefaultKwargsAndExcludeTools covers the server-side options: defaults under the request's
// chat_template_kwargs, and tools dropped for tool_choice "none".
func TestDefaultKwargsAndExcludeTools(t *testing.T) {
	tmpl := mustNew(t, "{{ enable_thinking }}|{{ tools|length if tools else 'none' }}",
		chattemplate.WithDefaultKwargs([]byte(`{"enable_thinking": false}`)),
		chattemplate.WithExcludeToolsWhenToolChoiceNone(true))
	tools := `[{"type": "function", "function": {"name": "f"}}]`
	for body, want := range map[string]string{
		`{"messages": []}`: "False|none",
		`{"messages": [], "chat_template_kwargs": {"enable_thinking": true}}`: "True|none",
		`{"messages": [], "chat_template_kwargs": {"enable_thinking": null}}`: "False|none",
		`{"messages": [], "tools": ` + tools + `}`:                            "False|1",
		`{"messages": [], "tools": ` + tools + `, "tool_choice": "none"}`:     "False|none",
		`{"messages": [], "tools": ` + tools + `, "tool_choice": "auto"}`:     "False|1",
	} {
		got, err := tmpl.Render([]byte(body))
		if err != nil || got != want {
			t.Errorf("Render(%s) = %q, %v; want %q", body, got, err, want)
		}
	}
}
