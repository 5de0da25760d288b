package chattemplate_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/gateway/internal/chattemplate"
)

// TestLoadModelDirs loads the four reference model directories, checks the special tokens read from
// tokenizer_config.json (strings and AddedToken objects) against the reference's special_tokens.json,
// the detected content format, and renders the reference conversations through the loaded template.
func TestLoadModelDirs(t *testing.T) {
	sp := specialTokens(t)
	wantFormat := map[string]chattemplate.ContentFormat{
		"deepseek_v3": chattemplate.FormatString, "gemma3": chattemplate.FormatOpenAI,
		"llama3_1": chattemplate.FormatString, "qwen3": chattemplate.FormatString,
	}
	convs := loadConversations(t)
	for _, m := range models {
		tmpl, err := chattemplate.Load(needModel(t, m))
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		got := tmpl.SpecialTokens()
		for k, v := range sp[m] {
			if got[k] != v {
				t.Errorf("%s: %s = %q, want %q", m, k, got[k], v)
			}
		}
		if f := tmpl.ContentFormat(); f != wantFormat[m] {
			t.Errorf("%s: content format %v, want %v", m, f, wantFormat[m])
		}
		for _, c := range convs {
			out, err := tmpl.Render(requestBody(t, c, true))
			checkRender(t, out, err, filepath.Join("testdata/renders_py", m, c.Name+".txt"))
		}
	}
	// Qwen3's config lists additional_special_tokens; transformers passes them as a list.
	q, err := chattemplate.Load(needModel(t, "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	if ast := q.SpecialTokens()["additional_special_tokens"]; !strings.Contains(ast, "<|im_start|>") {
		t.Errorf("qwen3 additional_special_tokens = %q", ast)
	}
}

func TestLoadNoTemplate(t *testing.T) {
	_, err := chattemplate.Load(needModel(t, "llama2"))
	if !errors.Is(err, chattemplate.ErrNoTemplate) {
		t.Fatalf("llama2 has no chat template: want ErrNoTemplate, got %v", err)
	}
	if _, err := chattemplate.Load(t.TempDir()); err == nil {
		t.Fatal("a directory without tokenizer_config.json must fail")
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLoadNamedTemplates: a list of named templates picks "tool_use" when the request has tools and
// "default" otherwise (transformers' get_chat_template); AddedToken objects give their content.
func TestLoadNamedTemplates(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "tokenizer_config.json"), `{
  "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
  "eos_token": "</s>",
  "pad_token": null,
  "chat_template": [
    {"name": "default", "template": "D{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}"},
    {"name": "tool_use", "template": "T{{ bos_token }}{{ tools|length }}{% for m in messages %}[{{ m.content }}]{% endfor %}{{ eos_token }}"}
  ]}`)
	tmpl, err := chattemplate.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	plain := `{"messages": [{"role": "user", "content": "hi"}]}`
	withTools := `{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}]}`
	for body, want := range map[string]string{plain: "D<s>[hi]", withTools: "T<s>1[hi]</s>"} {
		got, err := tmpl.Render([]byte(body))
		if err != nil || got != want {
			t.Errorf("Render(%s) = %q, %v; want %q", body, got, err, want)
		}
	}
	if _, ok := tmpl.SpecialTokens()["pad_token"]; ok {
		t.Error("a null pad_token must not become a template variable")
	}

	// chat_template.jinja takes precedence over tokenizer_config.json, as in transformers.
	writeFile(t, filepath.Join(dir, "chat_template.jinja"), "J{% for m in messages %}{{ m.content }}{% endfor %}\n")
	tmpl, err = chattemplate.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := tmpl.Render([]byte(plain)); err != nil || got != "Jhi" {
		t.Errorf("chat_template.jinja: got %q, %v; want %q", got, err, "Jhi")
	}
}

// TestLoadProcessorTemplate: a processor's chat_template.json is used for requests without tools, the
// tokenizer's template for requests with tools (vLLM's resolve_chat_template order).
func TestLoadProcessorTemplate(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "tokenizer_config.json"), `{"chat_template": "TOK{{ messages|length }}"}`)
	writeFile(t, filepath.Join(dir, "chat_template.json"), `{"chat_template": "PROC{{ messages|length }}"}`)
	tmpl, err := chattemplate.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for body, want := range map[string]string{
		`{"messages": [{"role": "user", "content": "a"}]}`:                                                             "PROC1",
		`{"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function", "function": {"name": "f"}}]}`: "TOK1",
	} {
		if got, err := tmpl.Render([]byte(body)); err != nil || got != want {
			t.Errorf("Render(%s) = %q, %v; want %q", body, got, err, want)
		}
	}
	// Only a processor template: requests with tools find no template, as in vLLM.
	only := t.TempDir()
	writeFile(t, filepath.Join(only, "tokenizer_config.json"), `{}`)
	writeFile(t, filepath.Join(only, "chat_template.json"), `{"chat_template": "P"}`)
	tmpl, err = chattemplate.Load(only)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := tmpl.Render([]byte(`{"messages": []}`)); err != nil || got != "P" {
		t.Errorf("no tools: %q, %v", got, err)
	}
	if _, err := tmpl.Render([]byte(`{"messages": [], "tools": []}`)); !errors.Is(err, chattemplate.ErrNoTemplate) {
		t.Errorf("tools with only a processor template: want ErrNoTemplate, got %v", err)
	}
}
