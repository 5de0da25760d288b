package chattemplate_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/gateway/internal/chattemplate"
)

// longConversation builds a chat request with n user/assistant turns of ~60 bytes each, plus tools.
func longConversation(b *testing.B, turns int) []byte {
	var buf bytes.Buffer
	buf.WriteString(`{"messages": [{"role": "system", "content": "You are a helpful assistant."}`)
	for i := 0; i < turns; i++ {
		fmt.Fprintf(&buf, `, {"role": "user", "content": "Question number %d: what is the weather like today in Zürich?"}`, i)
		fmt.Fprintf(&buf, `, {"role": "assistant", "content": "Answer number %d: it is sunny with a light breeze and 21 °C."}`, i)
	}
	fmt.Fprintf(&buf, `], "tools": %s}`, readFile(b, "testdata/tools.json"))
	return buf.Bytes()
}

// BenchmarkRender measures Render on the Qwen3 template: the reference tool-call conversation, and long
// conversations of 100 and 1000 turns.
func BenchmarkRender(b *testing.B) {
	tmpl := newTemplate(b, "qwen3")
	var toolsCall []byte
	for _, c := range loadConversations(b) {
		if c.Name == "tools_call" {
			toolsCall = requestBody(b, c, true)
		}
	}
	for _, bc := range []struct {
		name string
		body []byte
	}{{"tools_call", toolsCall}, {"turns=100", longConversation(b, 100)}, {"turns=1000", longConversation(b, 1000)}} {
		b.Run(bc.name, func(b *testing.B) {
			out, err := tmpl.Render(bc.body)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(out)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tmpl.Render(bc.body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkNew measures compiling the Qwen3 template (pre-pass, detection and ardanlabs/jinja compile).
func BenchmarkNew(b *testing.B) {
	src := string(readFile(b, "testdata/templates/qwen3.jinja"))
	for b.Loop() {
		if _, err := chattemplate.New(src, nil); err != nil {
			b.Fatal(err)
		}
	}
}
