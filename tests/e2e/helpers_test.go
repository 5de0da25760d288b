package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/kvgate/kvgate/cmd/kvgate-bench/harness"
	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/kvstore/testenv"
)

const model = harness.DefaultModel

// client returns an official OpenAI client pointed at g, without retries (a retry would hide a failure).
func client(g *harness.Gateway) openai.Client {
	return openai.NewClient(option.WithBaseURL(g.URL()+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0),
		option.WithRequestTimeout(60*time.Second))
}

// memoryConfig is a one-model gateway config on the memory store with a fast scrape interval.
func memoryConfig(m config.Model) config.Config {
	return config.Config{Store: config.Store{Kind: config.StoreMemory}, ScrapeInterval: 100 * time.Millisecond,
		LogLevel: "info", Models: []config.Model{m}}
}

// words returns n pseudo-random English-like words from r (distinct texts tokenize to distinct tokens).
func words(r *rand.Rand, n int) string {
	vocab := []string{"alpha", "river", "cobalt", "granite", "lantern", "meadow", "quartz", "harbor", "velvet",
		"summit", "ember", "willow", "falcon", "orchid", "canyon", "pepper", "thunder", "marble", "saffron",
		"glacier", "tundra", "copper", "nectar", "prairie", "cedar", "lagoon", "zephyr", "basalt", "juniper",
		"mosaic", "beacon", "sierra", "indigo", "trellis", "monsoon", "pylon", "quill", "rampart", "sonnet"}
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocab[r.IntN(len(vocab))])
		if r.IntN(9) == 0 {
			fmt.Fprintf(&b, " %d", r.IntN(1000))
		}
	}
	return b.String()
}

// result is what one chat call observed.
type result struct {
	Endpoint, Policy string
	Content          string
	PromptTokens     int64
	CachedTokens     int64
	CompletionTokens int64
	Chunks           int
}

// chat sends a non-streaming chat completion and returns the answer with the kvgate headers.
func chat(ctx context.Context, c openai.Client, msgs []openai.ChatCompletionMessageParamUnion, maxTokens int64) (result, error) {
	var raw *http.Response
	r, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs,
		MaxTokens: openai.Int(maxTokens)}, option.WithResponseInto(&raw))
	if err != nil {
		return result{}, err
	}
	out := result{Endpoint: raw.Header.Get("x-kvgate-endpoint"), Policy: raw.Header.Get("x-kvgate-policy"),
		PromptTokens: r.Usage.PromptTokens, CachedTokens: r.Usage.PromptTokensDetails.CachedTokens,
		CompletionTokens: r.Usage.CompletionTokens}
	if len(r.Choices) > 0 {
		out.Content = r.Choices[0].Message.Content
	}
	return out, nil
}

// chatStream sends a streaming chat completion with usage included and collects it.
func chatStream(ctx context.Context, c openai.Client, msgs []openai.ChatCompletionMessageParamUnion, maxTokens int64) (result, error) {
	var raw *http.Response
	s := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs,
		MaxTokens:     openai.Int(maxTokens),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}},
		option.WithResponseInto(&raw))
	defer s.Close()
	var out result
	var text strings.Builder
	for s.Next() {
		ch := s.Current()
		out.Chunks++
		if len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Delta.Content)
		}
		if ch.Usage.PromptTokens > 0 {
			out.PromptTokens = ch.Usage.PromptTokens
			out.CachedTokens = ch.Usage.PromptTokensDetails.CachedTokens
			out.CompletionTokens = ch.Usage.CompletionTokens
		}
	}
	if raw != nil {
		out.Endpoint, out.Policy = raw.Header.Get("x-kvgate-endpoint"), raw.Header.Get("x-kvgate-policy")
	}
	out.Content = text.String()
	return out, s.Err()
}

// engineByID returns the engine named id.
func engineByID(t *testing.T, engines []*harness.Engine, id string) *harness.Engine {
	t.Helper()
	for _, e := range engines {
		if e.ID == id {
			return e
		}
	}
	t.Fatalf("no engine %q (x-kvgate-endpoint header)", id)
	return nil
}

// engineSums reads name (summed over matching labels) from every engine.
func engineSums(t *testing.T, engines []*harness.Engine, name string, match ...string) []float64 {
	t.Helper()
	out := make([]float64, len(engines))
	for i, e := range engines {
		s, err := e.Metrics(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		out[i] = s.Sum(name, match...)
	}
	return out
}

// waitFor is testenv.WaitFor (polls cond up to d).
var waitFor = testenv.WaitFor
