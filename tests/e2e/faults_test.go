package e2e

import (
	"context"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/kvgate/kvgate/cmd/kvgate-bench/harness"
)

// stepsPerSecond is how many decode steps a real-time (--time-scale 1) simulator with its default timing
// runs in one second with one request: 1 s / (7 ms step overhead + 60 µs per sequence).
const stepsPerSecond = 141

// gatewayInFlight returns the gateway's in-flight lease count for endpoint.
func gatewayInFlight(t *testing.T, g *harness.Gateway, endpoint string) float64 {
	t.Helper()
	s, err := g.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s.Sum("kvgate_endpoint_inflight_requests", "endpoint", endpoint)
}

// An engine killed while it streams: the client's stream ends with an error event (the SDK reports it),
// the lease on the dead endpoint is released, and the next request is served by the other endpoint.
func TestEngineKilledMidStream(t *testing.T) {
	t.Parallel() // waits on its own engines and gateway only; asserts no latency bound
	env := newEnv(t)
	engines := env.Engines("e", 2, harness.EngineOptions{TimeScale: 1})
	g := env.Gateway("g0", memoryConfig(env.Model(engines, 64, 1_000_000)))
	c := client(g)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(3, 3))
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Write at length about " + words(r, 40))}

	var raw *http.Response
	s := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs,
		MaxTokens: openai.Int(1000)}, option.WithResponseInto(&raw))
	defer s.Close()
	chunks := 0
	var victim *harness.Engine
	for s.Next() {
		chunks++
		if chunks == 3 {
			victim = engineByID(t, engines, raw.Header.Get("x-kvgate-endpoint"))
			if got := gatewayInFlight(t, g, victim.ID); got != 1 {
				t.Fatalf("in flight on %s while streaming: %v, want 1", victim.ID, got)
			}
			victim.Kill()
		}
	}
	err := s.Err()
	if victim == nil {
		t.Fatalf("stream ended after %d chunks (%v) before the engine was killed", chunks, err)
	}
	if err == nil || !strings.Contains(err.Error(), "received error while streaming") {
		t.Fatalf("after %d chunks the stream ended with %v, want an error event", chunks, err)
	}
	if chunks >= 1000 {
		t.Fatalf("%d chunks: the stream was not cut", chunks)
	}
	t.Logf("stream cut after %d chunks: %v", chunks, err)
	if !waitFor(3*time.Second, func() bool { return gatewayInFlight(t, g, victim.ID) == 0 }) {
		t.Fatalf("lease on killed endpoint %s not released: in flight %v", victim.ID, gatewayInFlight(t, g, victim.ID))
	}
	res, err := chat(ctx, c, msgs, 3)
	if err != nil {
		t.Fatal(err)
	}
	if res.Endpoint == victim.ID || res.Endpoint == "" {
		t.Fatalf("next request served by %q, killed engine %s", res.Endpoint, victim.ID)
	}
}

// A client that goes away, streaming or not, stops the engine's generation within 1 s of model time: the
// simulator counts the request cancelled, runs nothing, and generated at most one second's worth of
// decode steps after the disconnect. The gateway releases the lease and counts the disconnect.
func TestClientDisconnectStopsGeneration(t *testing.T) {
	env := newEnv(t)
	engines := env.Engines("e", 1, harness.EngineOptions{TimeScale: 1})
	e := engines[0]
	g := env.Gateway("g0", memoryConfig(env.Model(engines, 64, 1_000_000)))
	c := client(g)
	r := rand.New(rand.NewPCG(5, 5))
	const maxTokens = 3000 // 21 s of generation if nothing stopped it

	metric := func(name string, match ...string) float64 { return engineSums(t, engines, name, match...)[0] }
	check := func(t *testing.T, stream bool, cancelledBefore, genAtCancel float64) {
		t.Helper()
		if !waitFor(3*time.Second, func() bool {
			return metric(harness.MetricCancelled) == cancelledBefore+1 && metric(harness.MetricRunning) == 0
		}) {
			t.Fatalf("engine: cancelled %v (before %v), running %v", metric(harness.MetricCancelled), cancelledBefore,
				metric(harness.MetricRunning))
		}
		after := metric(harness.MetricGenerationTokens) - genAtCancel
		t.Logf("stream=%v: %v tokens generated after the disconnect", stream, after)
		if after > stepsPerSecond {
			t.Fatalf("%v tokens generated after the disconnect, more than 1 s of decoding (%d)", after, stepsPerSecond)
		}
		if !waitFor(3*time.Second, func() bool { return gatewayInFlight(t, g, e.ID) == 0 }) {
			t.Fatalf("gateway lease not released: in flight %v", gatewayInFlight(t, g, e.ID))
		}
		s, err := g.Metrics(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		want := "false"
		if stream {
			want = "true"
		}
		if s.Sum("kvgate_client_disconnects_total", "stream", want) < 1 {
			t.Errorf("kvgate_client_disconnects_total{stream=%q} not counted", want)
		}
	}

	t.Run("streaming", func(t *testing.T) {
		msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell a long story about " + words(r, 30))}
		cancelledBefore := metric(harness.MetricCancelled)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		s := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs,
			MaxTokens: openai.Int(maxTokens)})
		chunks := 0
		for s.Next() {
			if chunks++; chunks == 20 {
				break
			}
		}
		if chunks != 20 {
			t.Fatalf("stream ended after %d chunks: %v", chunks, s.Err())
		}
		cancel()
		s.Close()
		check(t, true, cancelledBefore, metric(harness.MetricGenerationTokens))
	})

	t.Run("non-streaming", func(t *testing.T) {
		msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell another long story about " + words(r, 30))}
		cancelledBefore := metric(harness.MetricCancelled)
		genBefore := metric(harness.MetricGenerationTokens)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, Messages: msgs,
				MaxTokens: openai.Int(maxTokens)})
			done <- err
		}()
		// Wait until the engine is decoding this request, then hang up.
		if !waitFor(5*time.Second, func() bool { return metric(harness.MetricGenerationTokens) >= genBefore+20 }) {
			cancel()
			t.Fatalf("engine never started generating: %v", <-done)
		}
		cancel()
		genAtCancel := metric(harness.MetricGenerationTokens)
		if err := <-done; err == nil {
			t.Fatal("request finished despite the cancel")
		}
		check(t, false, cancelledBefore, genAtCancel)
	})
}
