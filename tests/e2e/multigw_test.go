package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go"

	"github.com/kvgate/kvgate/cmd/kvgate-bench/harness"
	"github.com/kvgate/kvgate/gateway"
	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// Three gateways, one redis-server and four engines under concurrent load:
//   - requests with the same prefix sent through different gateways land on the same endpoint;
//   - no endpoint ever runs more requests than its in-flight limit (the simulator's own peak gauge), also
//     across a Redis restart, during which each gateway keeps to store_down_limit_share = 0.34 of it;
//   - the Redis restart loses no request (every request completes with all its tokens) and the outage is
//     visible in /readyz;
//   - a policy uploaded and activated on one gateway ranks requests on every gateway within 3 s
//     (x-kvgate-policy).
func TestMultiGatewayRedis(t *testing.T) {
	const (
		limit     = 6 // max_inflight_requests per endpoint: 3 gateways × floor(6 × 0.34) = 6 while Redis is down
		workers   = 30
		maxTokens = 16
	)
	redis := redistest.Start(t)
	env := newEnv(t)
	engines := env.Engines("e", 4, harness.EngineOptions{TimeScale: 0.3})
	m := env.Model(engines, limit, 1_000_000)
	m.QueueTimeout = 60 * time.Second // a request waits for capacity rather than failing: none may be lost
	cfg := config.Config{Store: config.Store{Kind: config.StoreRedis, Addrs: []string{redis.Addr}},
		// StoreTimeout 2s: on a loaded machine a store call over the default 200 ms puts one gateway on its
		// store-down caps while the others still reserve on Redis, and the limit then holds per gateway
		// only; the outage below is a stopped Redis (refused at once), not a slow one.
		StoreTimeout:        2 * time.Second,
		StoreDownLimitShare: 0.34, ScrapeInterval: 100 * time.Millisecond, LogLevel: "info", Models: []config.Model{m}}
	gws := env.Gateways(3, cfg)
	clients := make([]openai.Client, len(gws))
	for i, g := range gws {
		clients[i] = client(g)
	}
	ctx := context.Background()
	r := rand.New(rand.NewPCG(9, 9))

	// Same prefix through different gateways, one after the other: the same endpoint every time.
	for k := range 3 {
		prefix := fmt.Sprintf("Case file %d. ", k) + words(r, 250)
		var eps []string
		for j := range gws {
			gi := (k + j) % len(gws)
			res, err := chat(ctx, clients[gi], []openai.ChatCompletionMessageParamUnion{
				openai.SystemMessage(prefix), openai.UserMessage("Question " + words(r, 12))}, 4)
			if err != nil {
				t.Fatal(err)
			}
			if j > 0 && res.CachedTokens == 0 {
				t.Errorf("prefix %d via %s: no cached tokens on %s", k, gws[gi].Name, res.Endpoint)
			}
			eps = append(eps, gws[gi].Name+"→"+res.Endpoint)
			if !strings.HasSuffix(eps[0], "→"+res.Endpoint) {
				t.Errorf("prefix %d: %v: same prefix on different endpoints", k, eps)
			}
		}
		t.Logf("prefix %d: %v", k, eps)
	}

	// Concurrent load through all three gateways: 30 clients, 8 shared system prompts, streaming and not.
	systems := make([]string, 8)
	for i := range systems {
		systems[i] = fmt.Sprintf("Team %d handbook. ", i) + words(r, 200)
	}
	var (
		stop                atomic.Bool
		sent, ok            atomic.Int64
		mu                  sync.Mutex
		failures            []string
		activatedAt         atomic.Int64 // unix nanos once the new policy is active on g0
		newPolicy           atomic.Value // string: header prefix of the new policy
		staleAfterDeadline  atomic.Int64
		newPolicySeenByGate [3]atomic.Bool
	)
	newPolicy.Store("\x00")
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			gi := w % len(gws)
			rw := rand.New(rand.NewPCG(100, uint64(w)))
			for n := 0; !stop.Load(); n++ {
				msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(systems[rw.IntN(len(systems))]),
					openai.UserMessage("Worker " + words(rw, 10))}
				startedAt := time.Now().UnixNano()
				var res result
				var err error
				if n%2 == 0 {
					res, err = chat(ctx, clients[gi], msgs, maxTokens)
				} else {
					res, err = chatStream(ctx, clients[gi], msgs, maxTokens)
				}
				sent.Add(1)
				if err != nil || res.CompletionTokens != maxTokens {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%s: %v (completion tokens %d)", gws[gi].Name, err, res.CompletionTokens))
					mu.Unlock()
					continue
				}
				ok.Add(1)
				if pfx := newPolicy.Load().(string); strings.HasPrefix(res.Policy, pfx) {
					newPolicySeenByGate[gi].Store(true)
				} else if at := activatedAt.Load(); at > 0 && startedAt > at+int64(3*time.Second) {
					staleAfterDeadline.Add(1)
				}
			}
		})
	}

	// Let the load run, then restart Redis: 2 s down, then a fresh, empty server on the same port.
	time.Sleep(1500 * time.Millisecond)
	t.Logf("engine peak running requests before the Redis restart %v", engineSums(t, engines, harness.MetricPeakRunning))
	{
		sentBefore := sent.Load()
		redis.Stop()
		sawDegraded := false
		downUntil := time.Now().Add(2 * time.Second)
		for time.Now().Before(downUntil) {
			for _, g := range gws {
				if _, body, err := g.Ready(ctx); err == nil && body["degraded"] == true {
					sawDegraded = true
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		sentDuring := sent.Load() - sentBefore
		t.Logf("engine peak running requests at the end of the outage %v", engineSums(t, engines, harness.MetricPeakRunning))
		redis.Restart()
		t.Logf("redis down 2 s: %d requests completed during the outage", sentDuring)
		if !sawDegraded {
			t.Errorf("no gateway reported degraded in /readyz while Redis was down")
		}
		var loadOnly float64
		for _, g := range gws {
			s, err := g.Metrics(ctx)
			if err != nil {
				t.Fatal(err)
			}
			loadOnly += s.Sum("kvgate_load_only_routes_total")
		}
		t.Logf("requests routed on load alone during the outage: %v", loadOnly)
		if loadOnly == 0 {
			t.Errorf("kvgate_load_only_routes_total is 0 on every gateway after a 2 s outage under load")
		}
	}

	// Wait for every gateway to be back on the store, then upload round-robin on g0 only and activate it there.
	if !waitFor(10*time.Second, func() bool {
		for _, g := range gws {
			if _, body, err := g.Ready(ctx); err != nil || body["degraded"] != false {
				return false
			}
		}
		return true
	}) {
		t.Errorf("gateways still degraded 10 s after Redis came back")
	}
	t.Logf("engine peak running requests once every gateway is back on Redis %v", engineSums(t, engines, harness.MetricPeakRunning))
	if roundRobinErr != nil {
		t.Fatalf("build examples/policies/round-robin: %v", roundRobinErr)
	}
	up, err := gws[0].UploadPolicy(ctx, "round-robin", roundRobinWasm)
	if err != nil {
		t.Fatal(err)
	}
	// Every gateway loads (and compiles) the uploaded module through the store before it is activated;
	// the 3 s bound below is the activation's.
	uploaded := time.Now()
	for _, g := range gws {
		if !waitFor(30*time.Second, func() bool {
			l, err := g.Policies(ctx)
			return err == nil && slices.ContainsFunc(l.Versions, func(v gateway.AdminVersion) bool { return v.Version == up.Version })
		}) {
			t.Fatalf("%s never listed the uploaded %s", g.Name, up.Version)
		}
	}
	t.Logf("uploaded policy listed by every gateway after %v", time.Since(uploaded).Round(time.Millisecond))
	if err := gws[0].ActivatePolicy(ctx, model, string(up.Version), nil); err != nil {
		t.Fatal(err)
	}
	activated := time.Now()
	activatedAt.Store(activated.UnixNano())
	short := string(up.Version)[:len("round-robin@")+12]
	newPolicy.Store(short)
	// Every gateway ranks with the new version within 3 s (explain shows the version the routing asks).
	body := fmt.Appendf(nil, `{"model":%q,"messages":[{"role":"user","content":"which policy?"}]}`, model)
	for _, g := range gws {
		if !waitFor(3*time.Second-time.Since(activated), func() bool {
			ex, err := g.Explain(ctx, body)
			return err == nil && ex.Policy == string(up.Version)
		}) {
			ex, err := g.Explain(ctx, body)
			t.Errorf("%s still ranks with %q (%v) 3 s after activation on g0", g.Name, ex.Policy, err)
		}
	}
	// Keep the load on until every gateway's answers carried the new header (checked below) and requests sent
	// after the 3 s deadline have completed: each worker has at most one request in flight across the
	// deadline, so 2 × workers completions after it include at least workers sent after it.
	waitFor(30*time.Second, func() bool {
		return newPolicySeenByGate[0].Load() && newPolicySeenByGate[1].Load() && newPolicySeenByGate[2].Load()
	})
	time.Sleep(time.Until(activated.Add(3 * time.Second))) // the deadline itself
	afterDeadline := ok.Load()
	waitFor(30*time.Second, func() bool { return ok.Load() >= afterDeadline+int64(2*workers) })
	stop.Store(true)
	wg.Wait()

	for gi := range newPolicySeenByGate {
		if !newPolicySeenByGate[gi].Load() {
			t.Errorf("%s: no response carried x-kvgate-policy %s", gws[gi].Name, short)
		}
	}
	if n := staleAfterDeadline.Load(); n > 0 {
		t.Errorf("%d responses to requests sent > 3 s after activation still carried the old policy", n)
	}
	t.Logf("load: %d requests sent, %d complete", sent.Load(), ok.Load())
	if len(failures) > 0 {
		t.Errorf("%d of %d requests lost; first: %s", len(failures), sent.Load(), failures[0])
	}
	peaks := engineSums(t, engines, harness.MetricPeakRunning)
	t.Logf("engine peak running requests %v (limit %d)", peaks, limit)
	for i, p := range peaks {
		if p > limit {
			// Before, during and after the outage (Redis restarted empty): the gateways' ledgers and
			// epoch recovery keep every engine within its limit (gateway/RATIONALE.md).
			t.Errorf("engine %s ran %v requests at once, limit %d", engines[i].ID, p, limit)
		}
		if p == 0 {
			t.Errorf("engine %s got no load", engines[i].ID)
		}
	}
}
