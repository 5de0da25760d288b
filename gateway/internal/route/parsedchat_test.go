package route

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/gateway/internal/chattemplate"
	"github.com/kvgate/kvgate/gateway/internal/model"
	"github.com/kvgate/kvgate/gateway/internal/upstream"
	"github.com/kvgate/kvgate/kvstore"
)

// bodyOnly hides model.Model's EncodeChatRequest, so Plan takes the body path.
type bodyOnly struct{ Encoder }

// countingEncoder counts the parsed-request encodes.
type countingEncoder struct {
	*model.Model
	parsed int
}

func (c *countingEncoder) EncodeChatRequest(r *chattemplate.Request) (string, []uint32, error) {
	c.parsed++
	return c.Model.EncodeChatRequest(r)
}

// TestPlanUsesParsedChat: Plan encodes the request ParseRequest already decoded (no second scan), with the
// same IDs and the same client errors as the body path.
func TestPlanUsesParsedChat(t *testing.T) {
	eps := fakeEngines(t, 2)
	r, m := newRouter(t, eps, kvstore.NewMemoryIndex(kvstore.MemoryConfig{}), kvstore.NewMemoryReservations(nil))
	enc := &countingEncoder{Model: m.Encoder.(*model.Model)}
	parsed := *m
	parsed.Encoder = enc
	plain := *m
	plain.Encoder = bodyOnly{m.Encoder}
	for _, body := range []string{
		`{"model":"qwen3","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello there, long enough for two blocks of sixteen tokens each, surely, yes"}]}`,
		`{"model":"qwen3","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"a\": 1}"}}]}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
		`{"model":"qwen3","messages":[{"role":"user","content":"a"}],"add_generation_prompt":"maybe"}`,
		`{"model":"qwen3","messages":[{"content":"no role"}]}`,
		`{"model":"qwen3","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`,
	} {
		req, err := parseChat([]byte(body))
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		before := enc.parsed
		p1, err1 := r.Plan(context.Background(), &parsed, "", req, []byte(body))
		if enc.parsed != before+1 {
			t.Fatalf("%s: the parsed request was not used", body)
		}
		req2, _ := parseChat([]byte(body))
		p2, err2 := r.Plan(context.Background(), &plain, "", req2, []byte(body))
		if (err1 == nil) != (err2 == nil) {
			t.Fatalf("%s: parsed %v, body %v", body, err1, err2)
		}
		if err1 != nil {
			o1, _ := errors.AsType[*RequestError](err1)
			o2, _ := errors.AsType[*RequestError](err2)
			if o1 == nil || o2 == nil || *o1 != *o2 {
				t.Fatalf("%s: parsed %v, body %v", body, err1, err2)
			}
			continue
		}
		if strings.Contains(body, "image_url") {
			// Media on a template that takes string content: routed without IDs, forwarded with the
			// original body (the engine renders it), the same on both paths.
			if p1.IDs != nil || p2.IDs != nil || p1.TokenIDsSkip != upstream.SkipMultimodal || p2.TokenIDsSkip != upstream.SkipMultimodal {
				t.Fatalf("%s: IDs %v/%v, skip %q/%q", body, p1.IDs, p2.IDs, p1.TokenIDsSkip, p2.TokenIDsSkip)
			}
			continue
		}
		if len(p1.IDs) == 0 || !slices.Equal(p1.IDs, p2.IDs) || !slices.Equal(p1.Keys, p2.Keys) {
			t.Fatalf("%s: %d IDs parsed, %d from the body", body, len(p1.IDs), len(p2.IDs))
		}
	}
}
