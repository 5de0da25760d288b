package chattemplate_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/gateway/internal/chattemplate"
)

// TestRandomConversations is a differential test against Python jinja2: 120 seeded random conversations
// (testdata/gen/random_convs.py: unicode, whitespace runs, CRLF, tag-like text, think blocks, tool calls
// with nested arguments, tools with null fields, enable_thinking) rendered with the 4 templates, compared
// with testdata/random_renders_py.json. The messages are already in the shape vLLM hands the template, so
// the request JSON and the Python variables are the same values (every other conversation sends its
// tool-call arguments as JSON strings instead, which vLLM parses back into the same values).
func TestRandomConversations(t *testing.T) {
	var data struct {
		Tools         json.RawMessage `json:"tools"`
		Conversations []conversation  `json:"conversations"`
	}
	if err := json.Unmarshal(readFile(t, "testdata/random_conversations.json"), &data); err != nil {
		t.Fatal(err)
	}
	var want map[string]map[string]string
	if err := json.Unmarshal(readFile(t, "testdata/random_renders_py.json"), &want); err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, m := range models {
		tmpl := newTemplate(t, m)
		for _, c := range data.Conversations {
			exp, ok := want[m][c.Name]
			if !ok {
				t.Fatalf("%s/%s: no reference render", m, c.Name)
			}
			// Alternate between parsed tool-call arguments and the JSON strings the OpenAI API sends.
			msgs := c.Messages
			if checked%2 == 1 {
				msgs = argumentsAsStrings(t, msgs)
			}
			body := fmt.Sprintf(`{"messages": %s, "add_generation_prompt": %v`, msgs, c.AddGenerationPrompt)
			if c.Tools {
				body += `, "tools": ` + string(data.Tools)
			}
			if len(c.Kwargs) > 0 {
				body += `, "chat_template_kwargs": ` + string(c.Kwargs)
			}
			body += "}"
			got, err := tmpl.Render([]byte(body))
			checked++
			if msg, isErr := strings.CutPrefix(exp, "ERROR: "); isErr {
				var re *chattemplate.RenderError
				if err == nil || !strings.HasPrefix(msg, "TemplateError: ") || !strings.Contains(err.Error(), strings.TrimPrefix(msg, "TemplateError: ")) {
					t.Errorf("%s/%s: want error %q, got %q, %v (%T)", m, c.Name, msg, truncate(got), err, re)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s/%s: %v", m, c.Name, err)
				continue
			}
			if got != exp {
				t.Errorf("%s/%s differs:\n got: %q\nwant: %q", m, c.Name, got, exp)
			}
		}
	}
	if checked != 480 {
		t.Fatalf("checked %d renders, want 480", checked)
	}
}
