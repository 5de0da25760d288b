package chattemplate_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/gateway/internal/chattemplate"
)

// renderParsed renders body through ParseRequest and RenderRequest (the gateway's parse-once path).
func renderParsed(tmpl *chattemplate.Template, body []byte) (string, error) {
	r, err := chattemplate.ParseRequest(body, nil)
	if err != nil {
		return "", err
	}
	return tmpl.RenderRequest(context.Background(), r)
}

// TestParseRequestOther: members the template does not read reach the callback raw, in body order, as
// exact sub-slices of the body; the template's own members do not.
func TestParseRequestOther(t *testing.T) {
	body := []byte(`{ "model" : "m\u00e9",  "messages":[{"role":"user","content":"hi"}], "stream":true,` +
		`"tools":null, "max_tokens": 1e2 ,"x":{"a":[1,{"b":null}]},"add_generation_prompt":false, "cache_salt":"s"}`)
	var got []string
	r, err := chattemplate.ParseRequest(body, func(key string, raw []byte) { got = append(got, key+"="+string(raw)) })
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`model="m\u00e9"`, `stream=true`, `max_tokens=1e2`, `x={"a":[1,{"b":null}]}`, `cache_salt="s"`}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("members\n got %q\nwant %q", got, want)
	}
	if r.Messages() != 1 {
		t.Fatalf("Messages() = %d, want 1", r.Messages())
	}
	out, err := newTemplate(t, "qwen3").RenderRequest(context.Background(), r)
	if err != nil || out != "<|im_start|>user\nhi<|im_end|>\n" {
		t.Fatalf("render %q, %v", out, err)
	}
}

// TestParseRequestDefersFieldErrors: a field error does not fail ParseRequest (so the caller can answer
// an unknown model first) and comes back from RenderRequest as Render reports it; malformed JSON fails
// the parse.
func TestParseRequestDefersFieldErrors(t *testing.T) {
	tmpl := newTemplate(t, "qwen3", chattemplate.WithLimits(chattemplate.Limits{MaxMessages: 2}))
	three := `[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"}]`
	for _, c := range []struct {
		body     string
		messages int
		kind     error
	}{
		{`{"model":"x"}`, -1, chattemplate.ErrBadRequest},
		{`{"messages":{"role":"user"},"model":"x"}`, -1, chattemplate.ErrBadRequest},
		{`{"add_generation_prompt":"maybe","messages":` + three + `}`, 3, chattemplate.ErrBadRequest},
		{`{"messages":` + three + `,"add_generation_prompt":"maybe"}`, 3, chattemplate.ErrLimit},
		{`{"messages":[],"chat_template":"{{ 1 }}","model":"x"}`, 0, chattemplate.ErrBadRequest},
	} {
		r, err := chattemplate.ParseRequest([]byte(c.body), nil)
		if err != nil {
			t.Fatalf("%s: ParseRequest: %v", c.body, err)
		}
		if r.Messages() != c.messages {
			t.Fatalf("%s: Messages() = %d, want %d", c.body, r.Messages(), c.messages)
		}
		_, err = tmpl.RenderRequest(context.Background(), r)
		_, want := tmpl.Render([]byte(c.body))
		if !errors.Is(err, c.kind) || want == nil || err.Error() != want.Error() {
			t.Fatalf("%s: RenderRequest: %v; Render: %v; want kind %v", c.body, err, want, c.kind)
		}
	}
	for _, body := range []string{``, `[1]`, `{"model":"x",}`, `{"model":"x"} {}`, `{"messages":[}`, `{"x":"\x01"}`} {
		if _, err := chattemplate.ParseRequest([]byte(body), nil); !errors.Is(err, chattemplate.ErrBadRequest) {
			t.Fatalf("%q: ParseRequest error %v, want ErrBadRequest", body, err)
		}
	}
}
