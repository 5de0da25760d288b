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
	"github.com/kvgate/kvgate/kvstore/kvevents"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// TestDataParallelRanksEndToEnd (#11 item 2): two gateways on one real Redis in front of one enginesim with
// --data-parallel-size 2 (endpoint data_parallel_size: 2). A long system prompt P is cached on rank 1 only
// (a request sent to the engine with X-data-parallel-rank: 1); its events index it under e0/dp1. A request
// with P through gateway A must go to rank 1 and get cached tokens: the router scores the ranks separately
// and the forwarded request carries X-data-parallel-rank: 1 (without the header the engine's balancer would
// serve it on idle rank 0, cached_tokens 0). Explain through gateway B shows both ranks, P matched on dp1
// only, and a follow-up with P through gateway B lands on the same rank with cached tokens too.
func TestDataParallelRanksEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	rs := redistest.Start(t)
	engines := startSims(t, 1, func(c *sim.Config) { c.DataParallelSize = 2 })
	e := engines[0]
	eps := fmt.Sprintf("      - {id: e0, engine: enginesim, url: \"http://%s\", kv_events: %q, kv_replay: %q, max_inflight_requests: 64, max_inflight_tokens: 1000000, data_parallel_size: 2}\n",
		e.HTTPAddr(), e.EventsAddr(), e.ReplayAddr())
	yaml := gwYAML(eps, fmt.Sprintf("store: {kind: redis, addrs: [%q]}\nspeculative_ttl: 100ms\n", rs.Addr))
	gws := []*Gateway{startGateway(t, yaml), startGateway(t, yaml)}
	if !waitFor(10*time.Second, func() bool { return len(e.EventSubscriptions()) > 0 }) {
		t.Fatal("the engine's ranks have no event subscriber")
	}
	rankStats := func() []kvevents.Stats {
		for _, g := range gws {
			g.ingMu.Lock()
			in := g.ingesters["e0"]
			g.ingMu.Unlock()
			if in != nil {
				return in.RankStats()
			}
		}
		return nil
	}
	direct := func(rank int, body string) []byte {
		t.Helper()
		st, _, b := post(t, "http://"+e.HTTPAddr()+"/v1/chat/completions", body, sim.DataParallelRankHeader, fmt.Sprint(rank))
		if st != 200 {
			t.Fatalf("direct to rank %d: %d %s", rank, st, b)
		}
		return b
	}
	// Prime both ranks' event streams (an ingester clears a rank on its first message).
	for r := range 2 {
		direct(r, fmt.Sprintf(`{"model":"qwen3","max_tokens":1,"messages":[{"role":"user","content":"prime rank %d with a few words"}]}`, r))
	}
	if !waitFor(10*time.Second, func() bool { rs := rankStats(); return len(rs) == 2 && rs[0].HaveSeq && rs[1].HaveSeq }) {
		t.Fatalf("ranks' first events never applied: %+v", rankStats())
	}
	sys := longSystemPrompt(48)
	body := func(q string) string {
		return fmt.Sprintf(`{"model":"qwen3","max_tokens":1,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, sys, q)
	}
	direct(1, body("warm up"))
	if !waitFor(5*time.Second, func() bool { g, _ := promptScore(t, gws[0], body("warm up"), "e0/dp1"); return g >= 40 }) {
		g, n := promptScore(t, gws[0], body("warm up"), "e0/dp1")
		t.Fatalf("P scores %d of %d blocks on e0/dp1, want ≥ 40", g, n)
	}
	if g, _ := promptScore(t, gws[0], body("warm up"), "e0/dp0"); g != 0 {
		t.Fatalf("P scores %d blocks on e0/dp0, which never saw it", g)
	}
	st, h, b := post(t, "http://"+gws[0].Addr()+"/v1/chat/completions", body("first question"))
	if st != 200 {
		t.Fatalf("%d %s", st, b)
	}
	if ep, c := h.Get("x-kvgate-endpoint"), cachedTokens(t, b); ep != "e0/dp1" || c < 640 {
		t.Fatalf("P through gateway A: endpoint %q, cached_tokens %d; want e0/dp1 with ≥ 640 cached", ep, c)
	}
	// Explain through gateway B: both ranks are candidates, P matched on rank 1 only.
	var ex struct {
		Blocks    int    `json:"blocks"`
		Chosen    string `json:"chosen"`
		Endpoints []struct {
			ID        string `json:"id"`
			GPUBlocks int    `json:"gpu_blocks"`
			MaxReqs   int64  `json:"max_inflight_requests"`
		} `json:"endpoints"`
	}
	st, _, b = post(t, "http://"+gws[1].Addr()+"/admin/v1/route", body("second question"), "Authorization", "Bearer admintok")
	if st != 200 || json.Unmarshal(b, &ex) != nil {
		t.Fatalf("explain: %d %s", st, b)
	}
	got := map[string]int{}
	for _, c := range ex.Endpoints {
		got[c.ID] = c.GPUBlocks
		if c.MaxReqs != 32 {
			t.Fatalf("rank %s max_inflight_requests %d, want 32 (64 split over 2 ranks)", c.ID, c.MaxReqs)
		}
	}
	if len(got) != 2 || got["e0/dp1"] < 40 || got["e0/dp0"] != 0 || ex.Chosen != "e0/dp1" {
		t.Fatalf("explain: chosen %q, matches %v (prompt %d blocks)\n%s", ex.Chosen, got, ex.Blocks, b)
	}
	st, h, b = post(t, "http://"+gws[1].Addr()+"/v1/chat/completions", body("second question"))
	if ep, c := h.Get("x-kvgate-endpoint"), cachedTokens(t, b); st != 200 || ep != "e0/dp1" || c < 640 {
		t.Fatalf("P through gateway B: %d endpoint %q, cached_tokens %d", st, ep, c)
	}
	if rk := e.RankStats(); rk[1].GPUCachedBlocks < 45 || rk[0].GPUCachedBlocks > 5 {
		t.Fatalf("engine rank caches %+v: P should be on rank 1 only", rk)
	}
	// Each rank's ingestion is reported under its own ID (readiness and metrics).
	ing, _ := ingesterOf(gws, "e0/dp1")
	if ing == nil {
		t.Fatal("no gateway reports rank e0/dp1's ingestion")
	}
	resp, err := getReadyz(ing)
	if err != nil {
		t.Fatal(err)
	}
	rb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(rb), `"e0/dp0"`) || !strings.Contains(string(rb), `"e0/dp1"`) {
		t.Fatalf("/readyz does not show the ranks' ingestion: %s", rb)
	}
}

// A data-parallel engine that refuses a request (503) is left out of the retry as a whole: the request is
// retried on the next engine, not on the failed engine's other rank (one API server fronts all ranks). The
// forwarded request names its rank.
func TestRetrySkipsOtherRanks(t *testing.T) {
	var mu sync.Mutex
	ranks := map[string]bool{}
	flaky := newFakeEngine(t, 0, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		mu.Lock()
		ranks[r.Header.Get("X-data-parallel-rank")] = true
		mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable) // a refusal: retried on another engine (retry_on)
	})
	good := newFakeEngine(t, 5, okCompletion)
	eps := fmt.Sprintf("      - {id: flaky, engine: vllm, url: %q, data_parallel_size: 2}\n      - {id: good, engine: vllm, url: %q}\n", flaky.srv.URL, good.srv.URL)
	g := startGateway(t, gwYAML(eps, ""))
	st, h, b := post(t, "http://"+g.Addr()+"/v1/chat/completions", `{"model":"qwen3","messages":[{"role":"user","content":"hi"}]}`)
	if st != 200 || h.Get("x-kvgate-endpoint") != "good" {
		t.Fatalf("%d %s %v", st, b, h)
	}
	// (The upstream client may resend once on a fresh connection when a reused keep-alive one dies: same rank.)
	mu.Lock()
	defer mu.Unlock()
	if len(ranks) != 1 || !(ranks["0"] || ranks["1"]) {
		t.Fatalf("the failed engine saw X-data-parallel-rank %v, want one rank (its other rank must not be tried)", ranks)
	}
	good.mu.Lock()
	defer good.mu.Unlock()
	if len(good.bodies) != 1 {
		t.Fatalf("good got %d requests", len(good.bodies))
	}
}

// TestDataParallelRankLoad (#11 item 2, per-rank load): one enginesim with --data-parallel-size 2 and
// --max-num-seqs 1 behind endpoint e0 (data_parallel_size: 2). Six long requests sent straight to rank 1
// (X-data-parallel-rank: 1) leave it with 1 running and 5 waiting; rank 0 is idle. The engine publishes
// per-engine series (engine="0", engine="1") as vLLM does, and the gateway must route on them: ten fresh
// prompts (a miss: least load) all go to e0/dp0. With the old even split both ranks showed 2.5 waiting and
// ties sent about half to the busy rank.
func TestDataParallelRankLoad(t *testing.T) {
	engines := startSims(t, 1, func(c *sim.Config) { c.DataParallelSize, c.MaxNumSeqs, c.TimeScale = 2, 1, 1 })
	e := engines[0]
	eps := fmt.Sprintf("      - {id: e0, engine: enginesim, url: \"http://%s\", max_inflight_requests: 64, max_inflight_tokens: 10000000, data_parallel_size: 2}\n", e.HTTPAddr())
	g := startGateway(t, gwYAML(eps, ""))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for i := range 6 {
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":"qwen3","max_tokens":4000,"ignore_eos":true,"prompt":"keep rank one busy %d"}`, i)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+e.HTTPAddr()+"/v1/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(sim.DataParallelRankHeader, "1")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	if !waitFor(10*time.Second, func() bool {
		l := g.eps.Load("e0")
		return len(l.Engines) == 2 && l.Engines[1].Waiting == 5 && l.Engines[1].Running == 1 && l.Engines[0].Waiting == 0
	}) {
		t.Fatalf("the gateway never scraped rank 1's queue: %+v", g.eps.Load("e0"))
	}
	for i := range 10 {
		st, h, b := post(t, "http://"+g.Addr()+"/v1/completions", fmt.Sprintf(`{"model":"qwen3","max_tokens":1,"prompt":"a fresh prompt number %d"}`, i))
		if st != 200 || h.Get("x-kvgate-endpoint") != "e0/dp0" {
			t.Fatalf("request %d: %d on %q (want e0/dp0, the idle rank): %s; load %+v", i, st, h.Get("x-kvgate-endpoint"), b, g.eps.Load("e0"))
		}
	}
}
