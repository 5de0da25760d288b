package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/cmd/enginesim/sim"
	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// Issue #11 reproductions through a fleet of gateways on one real Redis with simulated engines.

// cachedTokens reads usage.prompt_tokens_details.cached_tokens from a chat completion body.
func cachedTokens(t *testing.T, b []byte) int {
	t.Helper()
	var r struct {
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return r.Usage.PromptTokensDetails.CachedTokens
}

// promptScore is endpoint ep's GPU prefix match for a chat body in g's index.
func promptScore(t *testing.T, g *Gateway, body, ep string) (blocks, total int) {
	t.Helper()
	if _, err := testEncoder(""); err != nil {
		t.Fatal(err)
	}
	_, ids, err := qwen.EncodeChat([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	keys := kvstore.Hasher{Seed: 0}.Keys(ids, 16, kvstore.ExtraKeys{})
	ms, err := g.Index().Match(context.Background(), "qwen3", keys)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if string(m.Endpoint) == ep {
			return m.GPUBlocks, len(keys)
		}
	}
	return 0, len(keys)
}

// ingesterOf returns the gateway among gws that ingests endpoint ep, and its stats.
func ingesterOf(gws []*Gateway, ep string) (*Gateway, bool) {
	for _, g := range gws {
		for _, s := range g.IngestStats() {
			if string(s.Endpoint) == ep {
				return g, s.HaveSeq
			}
		}
	}
	return nil, false
}

// TestTakeoverKeepsAffinity (#11 item 1): engines with buffer_steps 50; a 45-block prefix P cached on one
// engine; 600 other requests; the gateway ingesting that engine stops. The gateway that takes over must
// keep P's score (the engine still holds it: the next request with P gets cached_tokens ≥ 720 from it),
// although the engine's replay buffer no longer reaches seq 0. Before the fix the new ingester cleared the
// endpoint on its first message and P scored 0.
func TestTakeoverKeepsAffinity(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	rs := redistest.Start(t)
	engines := startSims(t, 2, func(c *sim.Config) { c.KVEvents.BufferSteps = 50 })
	// A short speculative TTL, so that only the engine's confirmed entries can carry P's score.
	yaml := gwYAML(simEndpointsYAML(engines, 64), fmt.Sprintf("store: {kind: redis, addrs: [%q]}\nspeculative_ttl: 100ms\n", rs.Addr))
	gws := []*Gateway{startGateway(t, yaml), startGateway(t, yaml)}
	waitSubscribed(t, engines, gws...)

	sys := longSystemPrompt(48)
	body := func(q string) string {
		return fmt.Sprintf(`{"model":"qwen3","max_tokens":1,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, sys, q)
	}
	st, h, b := post(t, "http://"+gws[0].Addr()+"/v1/chat/completions", body("first"))
	if st != 200 {
		t.Fatalf("%d %s", st, b)
	}
	ep := h.Get("x-kvgate-endpoint")
	var eng *sim.Engine
	for i, e := range engines {
		if ep == fmt.Sprintf("e%d", i) {
			eng = e
		}
	}
	if eng == nil {
		t.Fatalf("routed to %q", ep)
	}
	if !waitFor(5*time.Second, func() bool { g, _ := promptScore(t, gws[1], body("first"), ep); return g >= 45 }) {
		g, n := promptScore(t, gws[1], body("first"), ep)
		t.Fatalf("P scores %d of %d blocks on %s before the takeover, want ≥ 45", g, n, ep)
	}
	// 600 other requests straight to that engine push P's events out of its 50-batch replay buffer.
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < 600; i += 8 {
				post(t, "http://"+eng.HTTPAddr()+"/v1/completions", fmt.Sprintf(`{"model":"qwen3","max_tokens":1,"prompt":"other request %d with some words to fill a block or two of tokens for the cache"}`, i))
			}
		})
	}
	wg.Wait()
	ing, _ := ingesterOf(gws, ep)
	if ing == nil {
		t.Fatal("nobody ingests " + ep)
	}
	other := gws[0]
	if other == ing {
		other = gws[1]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	ing.Close(ctx) // the ingesting gateway stops; the other takes the lease over
	cancel()
	if !waitFor(IngestLeaseTTL+3*IngestLeaseTick, func() bool { g, _ := ingesterOf([]*Gateway{other}, ep); return g != nil }) {
		t.Fatal("no takeover")
	}
	// The engine's next event is the new ingester's first message (catch-up replay from seq 0); until its
	// subscription has arrived, events are lost to ZMQ's slow joiner, so send until one is applied.
	n := 0
	if !waitFor(10*time.Second, func() bool {
		_, have := ingesterOf([]*Gateway{other}, ep)
		if !have {
			n++
			post(t, "http://"+eng.HTTPAddr()+"/v1/completions", fmt.Sprintf(`{"model":"qwen3","max_tokens":1,"prompt":"after the takeover, new request %d, long enough to fill one whole block of sixteen tokens"}`, n))
		}
		return have
	}) {
		t.Fatalf("the new ingester never applied a message: %+v (engine subscriptions %v)", other.IngestStats(), eng.EventSubscriptions())
	}
	var s any
	for _, x := range other.IngestStats() {
		if string(x.Endpoint) == ep {
			s = x
		}
	}
	time.Sleep(150 * time.Millisecond) // any speculative entry of P has expired
	score, blocks := promptScore(t, other, body("first"), ep)
	t.Logf("after the takeover P scores %d of %d blocks on %s; ingester %+v", score, blocks, ep, s)
	if score < 45 {
		t.Fatalf("after the takeover P scores %d blocks on %s, want ≥ 45 (the engine still holds it)", score, ep)
	}
	st, h, b = post(t, "http://"+other.Addr()+"/v1/chat/completions", body("second"))
	if st != 200 {
		t.Fatalf("%d %s", st, b)
	}
	ct := cachedTokens(t, b)
	t.Logf("next request with P: endpoint %s, cached_tokens %d", h.Get("x-kvgate-endpoint"), ct)
	if h.Get("x-kvgate-endpoint") != ep || ct < 720 {
		t.Fatalf("next request with P went to %s with cached_tokens %d, want %s and ≥ 720", h.Get("x-kvgate-endpoint"), ct, ep)
	}
}

// TestRestartSeenInMetrics (#11 item 3): an engine that restarts with an empty cache says nothing on its
// event stream until it stores something; its new process_start_time_seconds, read by the gateway's probe,
// drops its entries at once. Before the fix the index still gave it the prefix and the first request routed
// there got cached_tokens 0.
func TestRestartSeenInMetrics(t *testing.T) {
	engines := startSims(t, 2, nil)
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), ""))
	waitSubscribed(t, engines, g)
	sys := longSystemPrompt(48)
	body := fmt.Sprintf(`{"model":"qwen3","max_tokens":1,"messages":[{"role":"system","content":%q},{"role":"user","content":"hi"}]}`, sys)
	st, h, b := post(t, "http://"+g.Addr()+"/v1/chat/completions", body)
	if st != 200 {
		t.Fatalf("%d %s", st, b)
	}
	ep := h.Get("x-kvgate-endpoint")
	var eng *sim.Engine
	for i, e := range engines {
		if ep == fmt.Sprintf("e%d", i) {
			eng = e
		}
	}
	if !waitFor(5*time.Second, func() bool { n, _ := promptScore(t, g, body, ep); return n >= 45 }) {
		t.Fatal("prefix never confirmed")
	}
	time.Sleep(10 * time.Millisecond) // a start time of another millisecond
	if err := eng.SetFaults(sim.Faults{RestartEventSeq: true}); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	if !waitFor(3*time.Second, func() bool { n, _ := promptScore(t, g, body, ep); return n == 0 }) {
		n, _ := promptScore(t, g, body, ep)
		t.Fatalf("a restarted engine still scores %d blocks", n)
	}
	t.Logf("entries dropped %v after the restart (scrape interval 100ms)", time.Since(restarted).Round(time.Millisecond))
}

// TestHungRedisDegradesQuickly (#11 item 4): two gateways on one Redis that is paused (kill -STOP): every
// request is still answered, none waits more than 2.5 × store_timeout (a call, then a confirming PING) beyond the slowest request before the
// pause, and both gateways switch to store-down routing. Before the fix the first requests took ~10 s
// (go-redis's 3 s read timeout, retried).
func TestHungRedisDegradesQuickly(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	const storeTimeout = 200 * time.Millisecond
	rs := redistest.Start(t)
	engines := startSims(t, 2, nil)
	yaml := gwYAML(simEndpointsYAML(engines, 64), fmt.Sprintf("store: {kind: redis, addrs: [%q]}\nstore_timeout: %v\n", rs.Addr, storeTimeout))
	gws := []*Gateway{startGateway(t, yaml), startGateway(t, yaml)}
	waitSubscribed(t, engines, gws...)
	timed := func(g *Gateway, q string) time.Duration {
		t0 := time.Now()
		st, _, b := post(t, "http://"+g.Addr()+"/v1/chat/completions", chatBody(false, 1, q))
		if st != 200 {
			t.Fatalf("%s: %d %s", q, st, b)
		}
		return time.Since(t0)
	}
	var base time.Duration
	for i := range 6 {
		base = max(base, timed(gws[i%2], fmt.Sprint("before the pause ", i)))
	}
	rs.Pause()
	defer rs.Resume()
	paused := time.Now()
	var worst time.Duration
	for i := range 8 {
		worst = max(worst, timed(gws[i%2], fmt.Sprint("while paused ", i)))
	}
	t.Logf("slowest request before the pause %v; while paused %v (store_timeout %v); all answered %v after the pause",
		base.Round(time.Millisecond), worst.Round(time.Millisecond), storeTimeout, time.Since(paused).Round(time.Millisecond))
	// A failed call marks the store down only after a PING bounded by store_timeout/2 fails too
	// (kvstore/RATIONALE.md, "Partial outages"): the first request can pay a call and a PING.
	if bound := base + 2*storeTimeout + storeTimeout/2; worst > bound {
		t.Fatalf("a request took %v while Redis was paused, want at most %v", worst, bound)
	}
	for i, g := range gws {
		if !g.StoreStatus().Down {
			t.Fatalf("gateway %d did not switch to store-down routing", i)
		}
	}
	rs.Resume()
	for i, g := range gws {
		if !waitFor(10*time.Second, func() bool { return !g.StoreStatus().Down }) {
			t.Fatalf("gateway %d never saw the store again", i)
		}
	}
}

// TestStartWithoutRedis (#11 item 4): a gateway started while Redis is unreachable starts in degraded mode
// (the config's policy on load-only routing; /readyz says policy_unconfirmed) and joins when Redis answers:
// the flag clears, the router is back on the store and it ingests the engines' events. Before the fix it
// exited ("redis ping ... connection refused").
func TestStartWithoutRedis(t *testing.T) {
	t.Parallel() // waits on its own redis-server, engines and gateway only; asserts no latency bound
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	rs := redistest.Start(t)
	rs.Stop()
	engines := startSims(t, 2, nil)
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), fmt.Sprintf("store: {kind: redis, addrs: [%q]}\n", rs.Addr)))
	st, h, b := post(t, "http://"+g.Addr()+"/v1/chat/completions", chatBody(false, 1, "no redis yet"))
	if st != 200 || h.Get("x-kvgate-policy") == "" {
		t.Fatalf("without redis: %d %s", st, b)
	}
	if rz := readyz(t, g); rz["policy_unconfirmed"] != true || rz["degraded"] != true {
		t.Fatalf("readyz without redis: %v", rz)
	}
	rs.Restart()
	if !waitFor(10*time.Second, func() bool {
		rz := readyz(t, g)
		return rz["policy_unconfirmed"] == nil && rz["degraded"] == false && len(g.IngestStats()) == 2
	}) {
		t.Fatalf("never joined: readyz %v, %d ingesters", readyz(t, g), len(g.IngestStats()))
	}
}

// TestOutageOnsetCapsHold (#11 item 5): three gateways, 48 clients, limit 8 per engine, store_down_limit_share
// 0.34; Redis is killed (kill -9) and restarted empty, 20 times. No engine may ever hold more than 8 requests
// (enginesim's peak in flight). Before the fix an engine ran 9 in 2 of 5 outages: at the onset each gateway's
// cap took a share of the capacity its last read of the shared counters showed free, which another gateway
// might have filled since.
func TestOutageOnsetCapsHold(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	const limit, outages = 8, 20
	rs := redistest.Start(t)
	engines := startSims(t, 2, func(c *sim.Config) { c.TimeScale = 0.5 })
	yaml := gwYAML(simEndpointsYAML(engines, limit), fmt.Sprintf("store: {kind: redis, addrs: [%q]}\nstore_down_limit_share: 0.34\nstore_timeout: 2s\n", rs.Addr)) // the outages are a stopped Redis; no slow call on a loaded machine counts as one
	gws := []*Gateway{startGateway(t, yaml), startGateway(t, yaml), startGateway(t, yaml)}
	waitSubscribed(t, engines, gws...)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var served, refused sync.Map
	for c := range 48 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				g := gws[(c+i)%3]
				body := fmt.Sprintf(`{"model":"qwen3","max_tokens":8,"prompt":"client %d request %d"}`, c, i)
				req, _ := http.NewRequest(http.MethodPost, "http://"+g.Addr()+"/v1/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				m := &served
				if resp.StatusCode != 200 {
					m = &refused
				}
				v, _ := m.LoadOrStore(c, new(int))
				*(v.(*int))++
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	peaks := func() []int {
		var out []int
		for _, e := range engines {
			out = append(out, e.Stats().PeakInFlight)
		}
		return out
	}
	time.Sleep(500 * time.Millisecond)
	for o := range outages {
		rs.Stop()
		time.Sleep(300 * time.Millisecond)
		rs.Restart()
		for i, g := range gws {
			if !waitFor(10*time.Second, func() bool { return !g.StoreStatus().Down }) {
				t.Fatalf("outage %d: gateway %d never saw the store again", o, i)
			}
		}
		time.Sleep(200 * time.Millisecond)
		for i, p := range peaks() {
			if p > limit {
				t.Fatalf("outage %d of %d: engine e%d ran %d requests at once, limit %d", o+1, outages, i, p, limit)
			}
		}
	}
	t.Logf("peak in flight over %d outages: %v (limit %d)", outages, peaks(), limit)
}
