package e2e

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/kvgate/kvgate/cmd/kvgate-bench/harness"
)

// The official client gets complete answers through the gateway, streamed and not; the usage the engine
// reports matches the gateway's own token count (explain), and the stream carries a usage chunk only
// when the client asked for one.
func TestChatStreamingAndNot(t *testing.T) {
	t.Parallel() // waits on its own engines and gateway only; asserts no latency bound
	env := newEnv(t)
	engines := env.Engines("e", 2, harness.EngineOptions{TimeScale: 0.05})
	g := env.Gateway("g0", memoryConfig(env.Model(engines, 64, 1_000_000)))
	c := client(g)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(1, 2))
	msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("You are terse. " + words(r, 60)),
		openai.UserMessage("Summarise: " + words(r, 40))}

	// The gateway's explain for the same body gives the prompt length it routes on.
	body, _ := json.Marshal(map[string]any{"model": model, "messages": []map[string]string{
		{"role": "system", "content": msgs[0].OfSystem.Content.OfString.Value},
		{"role": "user", "content": msgs[1].OfUser.Content.OfString.Value}}})
	ex, err := g.Explain(ctx, body)
	if err != nil {
		t.Fatal(err)
	}
	if ex.PromptTokens < 100 || ex.Blocks != ex.PromptTokens/16 || len(ex.Endpoints) != 2 {
		t.Fatalf("explain: %d prompt tokens, %d blocks, %d endpoints", ex.PromptTokens, ex.Blocks, len(ex.Endpoints))
	}

	res, err := chat(ctx, c, msgs, 7)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains([]string{"e0", "e1"}, res.Endpoint) || !strings.HasPrefix(res.Policy, "three-tier@") {
		t.Fatalf("headers: endpoint %q policy %q", res.Endpoint, res.Policy)
	}
	if res.PromptTokens != int64(ex.PromptTokens) || res.CompletionTokens != 7 || res.Content == "" {
		t.Fatalf("non-streaming: prompt %d (explain %d), completion %d, content %q", res.PromptTokens,
			ex.PromptTokens, res.CompletionTokens, res.Content)
	}

	st, err := chatStream(ctx, c, msgs, 9)
	if err != nil {
		t.Fatal(err)
	}
	// 9 content chunks (one token each) and the usage chunk at least; the prompt is the same one, now
	// cached on the endpoint that served it (the gateway sends it back there).
	if st.Endpoint != res.Endpoint || st.CompletionTokens != 9 || st.Chunks < 10 || st.Content == "" ||
		st.PromptTokens != res.PromptTokens || st.CachedTokens < int64(ex.PromptTokens/16*16-16) {
		t.Fatalf("streaming: %+v (first %+v)", st, res)
	}

	// Without stream_options the engine sends no usage chunk and the gateway adds none.
	var raw *http.Response
	s := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs,
		MaxTokens: openai.Int(3)}, option.WithResponseInto(&raw))
	chunks, usage := 0, 0
	for s.Next() {
		chunks++
		if s.Current().Usage.TotalTokens > 0 {
			usage++
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if chunks < 3 || usage != 0 || !strings.HasPrefix(raw.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream without stream_options: %d chunks, %d usage chunks, content type %q", chunks, usage,
			raw.Header.Get("Content-Type"))
	}
}
