package openai

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/gateway/internal/model"
	"github.com/kvgate/kvgate/kvstore/testenv"
)

// BenchmarkParseAndEncodeChat is the gateway's per-request text work on BenchmarkOverhead's body (a 7 KB
// system prompt and a 1 KB question, Qwen3; the prompt is in the model's prefix cache after the first
// call): "twice" is the old path (gjson validation and member pass, then the template's own parse of the
// body), "once" the one-scan path (ParseRequest decodes the template's members, EncodeChatRequest renders
// them).
func BenchmarkParseAndEncodeChat(b *testing.B) {
	md, err := model.Load(testenv.ModelDir(b, "qwen3"))
	if err != nil {
		b.Fatal(err)
	}
	var sys strings.Builder
	for i := 0; sys.Len() < 7000; i++ {
		fmt.Fprintf(&sys, "Policy %d: be precise, cite section %d, and keep answers short. ", i, i*3)
	}
	q := strings.Repeat("Tell me about the refund rules for damaged items please. ", 18)
	body := []byte(fmt.Sprintf(`{"model":"qwen3","max_tokens":1,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, sys.String(), q))
	b.Run("twice", func(b *testing.B) {
		for b.Loop() {
			if _, err := referenceParse(Chat, body); err != nil {
				b.Fatal(err)
			}
			if _, _, err := md.EncodeChat(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("once", func(b *testing.B) {
		for b.Loop() {
			r, err := ParseRequest(Chat, body)
			if err != nil {
				b.Fatal(err)
			}
			if _, _, err := md.EncodeChatRequest(r.Chat); err != nil {
				b.Fatal(err)
			}
		}
	})
}
