package e2e

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go"

	"github.com/kvgate/kvgate/cmd/kvgate-bench/harness"
)

// conversations runs n two-turn conversations (3 at a time) through c and returns how many second turns
// landed on their first turn's endpoint with cached prompt tokens reported by the engine, and the policy
// header of every answer. Texts are drawn from seed so two runs do not share prefixes.
func conversations(t *testing.T, c openai.Client, n int, seed uint64) (sticky int, policies map[string]int) {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	policies = map[string]int{}
	var wg sync.WaitGroup
	work := make(chan int)
	errs := make(chan error, n)
	// Three workers for four endpoints: with lockstep interleaving a round-robin sequence would advance by
	// a multiple of the endpoint count between the two turns of one conversation and fake stickiness.
	for range 3 {
		wg.Go(func() {
			for k := range work {
				r := rand.New(rand.NewPCG(seed, uint64(k)))
				msgs := []openai.ChatCompletionMessageParamUnion{
					openai.UserMessage("Conversation " + words(r, 1) + ". Please review this text: " + words(r, 150))}
				first, err := chat(ctx, c, msgs, 6)
				if err != nil {
					errs <- err
					continue // keep draining work: the sender must not block
				}
				msgs = append(msgs, openai.AssistantMessage(first.Content), openai.UserMessage("And now: "+words(r, 20)))
				second, err := chatStream(ctx, c, msgs, 6)
				if err != nil {
					errs <- err
					continue
				}
				mu.Lock()
				if second.Endpoint == first.Endpoint && second.CachedTokens > 0 {
					sticky++
				}
				policies[first.Policy]++
				policies[second.Policy]++
				mu.Unlock()
			}
		})
	}
	for k := range n {
		work <- k
	}
	close(work)
	wg.Wait()
	close(errs)
	if err, ok := <-errs; ok {
		t.Fatalf("%d of %d conversations failed; first: %v", len(errs)+1, n, err)
	}
	return sticky, policies
}

// 20 two-turn conversations through the default three-tier policy: at least 19 second turns land on their
// first turn's endpoint and the engine reports cached prompt tokens; the same run through the round-robin
// example policy (uploaded and activated through the admin API) does clearly worse.
func TestTwoTurnAffinity(t *testing.T) {
	env := newEnv(t)
	engines := env.Engines("e", 4, harness.EngineOptions{TimeScale: 0.05})
	g := env.Gateway("g0", memoryConfig(env.Model(engines, 64, 1_000_000)))
	c := client(g)

	sticky, pol := conversations(t, c, 20, 11)
	t.Logf("three-tier: %d/20 second turns on their first endpoint with cached tokens; policies %v", sticky, pol)
	if sticky < 19 {
		t.Errorf("three-tier: %d/20 sticky second turns, want ≥ 19", sticky)
	}
	for p := range pol {
		if !strings.HasPrefix(p, "three-tier@") {
			t.Errorf("policy header %q, want three-tier@…", p)
		}
	}

	if roundRobinErr != nil {
		t.Fatalf("build examples/policies/round-robin: %v", roundRobinErr)
	}
	ctx := context.Background()
	up, err := g.UploadPolicy(ctx, "round-robin", roundRobinWasm)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.ActivatePolicy(ctx, model, string(up.Version), nil); err != nil {
		t.Fatal(err)
	}
	rr, pol := conversations(t, c, 20, 12)
	t.Logf("round-robin (%s): %d/20 sticky; policies %v", up.Version, rr, pol)
	for p := range pol {
		if !strings.HasPrefix(p, "round-robin@") || !strings.HasPrefix(string(up.Version), p) {
			t.Errorf("policy header %q, want a prefix of %s", p, up.Version)
		}
	}
	// Four endpoints in rotation: a second turn meets its first endpoint about one time in four.
	if rr > 10 || sticky-rr < 8 {
		t.Errorf("round-robin %d/20 sticky vs three-tier %d/20: not clearly worse", rr, sticky)
	}
}
