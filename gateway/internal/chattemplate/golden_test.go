package chattemplate_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/gateway/internal/chattemplate"
)

// models are the templates whose reference renders are in testdata/renders_py.
var models = []string{"deepseek_v3", "gemma3", "llama3_1", "qwen3"}

// conversation is one entry of testdata/conversations.json, with its raw JSON kept so key order survives.
type conversation struct {
	Name                string          `json:"name"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
	Tools               bool            `json:"tools"`
	Kwargs              json.RawMessage `json:"kwargs"`
	Messages            json.RawMessage `json:"messages"`
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func loadConversations(t testing.TB) []conversation {
	var convs []conversation
	if err := json.Unmarshal(readFile(t, "testdata/conversations.json"), &convs); err != nil {
		t.Fatal(err)
	}
	if len(convs) != 7 {
		t.Fatalf("want 7 conversations, got %d", len(convs))
	}
	return convs
}

// requestBody builds the OpenAI chat request for a conversation, as a client would send it.
func requestBody(t testing.TB, c conversation, wire bool) []byte {
	msgs := c.Messages
	if wire {
		msgs = argumentsAsStrings(t, msgs)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"model": "m", "messages": %s, "add_generation_prompt": %v`, msgs, c.AddGenerationPrompt)
	if c.Tools {
		fmt.Fprintf(&b, `, "tools": %s`, readFile(t, "testdata/tools.json"))
	}
	if len(c.Kwargs) > 0 {
		fmt.Fprintf(&b, `, "chat_template_kwargs": %s`, c.Kwargs)
	}
	b.WriteString(`, "stream": false}`)
	return b.Bytes()
}

// argumentsAsStrings rewrites every "arguments" object into the JSON string the OpenAI API sends
// (tool_calls[].function.arguments), keeping everything else byte for byte.
func argumentsAsStrings(t testing.TB, raw []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	dec := json.NewDecoder(bytes.NewReader(raw))
	var walk func() error
	walk = func() error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{':
				out.WriteByte('{')
				for i := 0; dec.More(); i++ {
					kt, err := dec.Token()
					if err != nil {
						return err
					}
					key := kt.(string)
					if i > 0 {
						out.WriteString(", ")
					}
					kb, _ := json.Marshal(key)
					out.Write(kb)
					out.WriteString(": ")
					if key == "arguments" {
						var val json.RawMessage
						if err := dec.Decode(&val); err != nil {
							return err
						}
						s, _ := json.Marshal(string(val))
						out.Write(s)
						continue
					}
					if err := walk(); err != nil {
						return err
					}
				}
				_, err := dec.Token()
				out.WriteByte('}')
				return err
			case '[':
				out.WriteByte('[')
				for i := 0; dec.More(); i++ {
					if i > 0 {
						out.WriteString(", ")
					}
					if err := walk(); err != nil {
						return err
					}
				}
				_, err := dec.Token()
				out.WriteByte(']')
				return err
			}
		default:
			b, _ := json.Marshal(v)
			out.Write(b)
		}
		return nil
	}
	if err := walk(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func specialTokens(t testing.TB) map[string]map[string]string {
	var sp map[string]map[string]string
	if err := json.Unmarshal(readFile(t, "testdata/special_tokens.json"), &sp); err != nil {
		t.Fatal(err)
	}
	return sp
}

func newTemplate(t testing.TB, model string, opts ...chattemplate.Option) *chattemplate.Template {
	t.Helper()
	src := readFile(t, filepath.Join("testdata/templates", model+".jinja"))
	tmpl, err := chattemplate.New(string(src), specialTokens(t)[model], opts...)
	if err != nil {
		t.Fatalf("%s: %v", model, err)
	}
	return tmpl
}

// checkRender compares one render with its reference file; a reference "ERROR: TemplateError: msg" must
// come back as a *RenderError raised by the template with that message.
func checkRender(t *testing.T, got string, err error, wantFile string) {
	t.Helper()
	want := string(readFile(t, wantFile))
	if msg, ok := strings.CutPrefix(want, "ERROR: "); ok {
		var re *chattemplate.RenderError
		if !errors.As(err, &re) || !errors.Is(err, chattemplate.ErrTemplateRaised) {
			t.Fatalf("want a raised *RenderError (%s), got %q, %v", msg, got, err)
		}
		if "TemplateError: "+re.Message != msg {
			t.Fatalf("raised %q, want %q", re.Message, msg)
		}
		return
	}
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	if got != want {
		t.Fatalf("render differs from %s\n got: %q\nwant: %q", wantFile, got, want)
	}
}

// TestGoldenRenders renders the 7 reference conversations with the 4 templates (28 renders, tools
// included) and compares them byte for byte with Python jinja2's renders, once with tool-call arguments
// as parsed objects (as the reference conversations hold them) and once as the JSON strings the OpenAI
// API sends.
func TestGoldenRenders(t *testing.T) {
	convs := loadConversations(t)
	n := 0
	for _, m := range models {
		tmpl := newTemplate(t, m)
		for _, c := range convs {
			for _, wire := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/wire=%v", m, c.Name, wire), func(t *testing.T) {
					body := requestBody(t, c, wire)
					got, err := tmpl.Render(body)
					checkRender(t, got, err, filepath.Join("testdata/renders_py", m, c.Name+".txt"))
					// The parse-once path (ParseRequest + RenderRequest) renders the same bytes.
					got, err = renderParsed(tmpl, body)
					checkRender(t, got, err, filepath.Join("testdata/renders_py", m, c.Name+".txt"))
				})
			}
			n++
		}
	}
	if n != 28 {
		t.Fatalf("rendered %d cases, want 28", n)
	}
}

// TestWireFormActuallyDiffers guards the wire-form test above: the rewritten body must carry the
// arguments as a string.
func TestWireFormActuallyDiffers(t *testing.T) {
	for _, c := range loadConversations(t) {
		if c.Name != "tools_call" {
			continue
		}
		body := string(requestBody(t, c, true))
		if !strings.Contains(body, `"arguments": "{\"location\": \"Paris, France\", \"unit\": \"celsius\"}"`) {
			t.Fatalf("arguments not sent as a JSON string: %s", body)
		}
		return
	}
	t.Fatal("tools_call conversation missing")
}
