package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/openai/openai-go"

	"github.com/kvgate/kvgate/cmd/kvgate-bench/harness"
)

// 50 users share one system prompt and send at once: the engines report cached prompt tokens totalling at
// least 80% of what one infinite cache would have served, and the in-flight load stays even: the
// simulators' peak running requests, max over mean, at most 1.5.
func TestSharedSystemPromptBurst(t *testing.T) {
	const users = 50
	env := newEnv(t)
	// Real-time engines: 30 output tokens take ≥ 210 ms, so the whole burst is in flight at once.
	engines := env.Engines("e", 4, harness.EngineOptions{TimeScale: 1})
	g := env.Gateway("g0", memoryConfig(env.Model(engines, 64, 1_000_000)))
	c := client(g)
	ctx := context.Background()

	r := rand.New(rand.NewPCG(7, 7))
	system := "You are the support assistant of a hardware store. Policies: " + words(r, 700)
	bodies := make([][]byte, users)
	msgs := make([][]openai.ChatCompletionMessageParamUnion, users)
	for i := range users {
		q := fmt.Sprintf("Question %s %d: %s", words(r, 1), i, words(r, 25))
		msgs[i] = []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system), openai.UserMessage(q)}
		bodies[i], _ = json.Marshal(map[string]any{"model": model, "messages": []map[string]string{
			{"role": "system", "content": system}, {"role": "user", "content": q}}})
	}
	// The oracle from the prompts' token IDs (the engine's own tokenization), checked against the length the
	// gateway routes on.
	prompts := make([][]uint32, users)
	for i, b := range bodies {
		ids, err := engines[0].Tokenize(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		prompts[i] = ids
	}
	ex, err := g.Explain(ctx, bodies[0])
	if err != nil {
		t.Fatal(err)
	}
	if ex.PromptTokens != len(prompts[0]) {
		t.Fatalf("gateway counts %d prompt tokens, engine tokenizes %d", ex.PromptTokens, len(prompts[0]))
	}
	oracle := harness.OracleCachedTokens(prompts, ex.BlockSize)

	results := make([]result, users)
	errs := make([]error, users)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range users {
		wg.Go(func() {
			<-start
			results[i], errs[i] = chat(ctx, c, msgs[i], 30)
		})
	}
	close(start)
	wg.Wait()
	var cached int64
	perEndpoint := map[string]int{}
	for i, res := range results {
		if errs[i] != nil {
			t.Fatalf("user %d: %v", i, errs[i])
		}
		if res.PromptTokens != int64(len(prompts[i])) {
			t.Fatalf("user %d: engine saw %d prompt tokens, tokenizer %d", i, res.PromptTokens, len(prompts[i]))
		}
		cached += res.CachedTokens
		perEndpoint[res.Endpoint]++
	}
	peaks := engineSums(t, engines, harness.MetricPeakRunning)
	var sum float64
	for _, p := range peaks {
		sum += p
	}
	mean := sum / float64(len(peaks))
	ratio := slices.Max(peaks) / mean
	t.Logf("cached %d of oracle %d tokens (%.1f%%), prompt %d tokens; requests per endpoint %v; peak running %v (max/mean %.2f)",
		cached, oracle, 100*float64(cached)/float64(oracle), len(prompts[0]), perEndpoint, peaks, ratio)
	if float64(cached) < 0.8*float64(oracle) {
		t.Errorf("cached tokens %d < 80%% of the oracle's %d", cached, oracle)
	}
	if ratio > 1.5 {
		t.Errorf("peak in-flight per endpoint %v: max/mean %.2f > 1.5", peaks, ratio)
	}
}
