package route

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/gateway/internal/endpoints"
	"github.com/kvgate/kvgate/gateway/internal/metrics"
	"github.com/kvgate/kvgate/gateway/internal/model"
	"github.com/kvgate/kvgate/gateway/internal/openai"
	"github.com/kvgate/kvgate/kvstore"
)

func TestShortVersion(t *testing.T) {
	v := "three-tier@" + strings.Repeat("ab", 32)
	if got := ShortVersion(v); got != "three-tier@abababababab" {
		t.Fatal(got)
	}
	if got := ShortVersion("x@12"); got != "x@12" {
		t.Fatal(got)
	}
}

// parseChat parses a chat body as the server does (openai.ParseRequest, then server.RouteRequest's fields).
func parseChat(body []byte) (Request, error) {
	r, err := openai.ParseRequest(openai.Chat, body)
	if err != nil {
		return Request{}, err
	}
	return Request{Model: r.Model, Chat: true, ChatRequest: r.Chat, Prompts: r.Prompts, CacheSalt: r.CacheSalt,
		MaxTokens: r.MaxTokens, N: r.N, BestOf: r.BestOf}, nil
}

// guarded is a kvstore.Guarded over res and idx with the router tests' timings (probe every 20 ms),
// closed with the test.
func guarded(t testing.TB, res kvstore.Reservations, idx kvstore.Index, remote kvstore.Remote, share float64, opts ...func(*kvstore.GuardConfig)) *kvstore.Guarded {
	o := kvstore.GuardConfig{Reservations: res, Index: idx, Remote: remote, DownLimitShare: share,
		ProbeInterval: 20 * time.Millisecond, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, f := range opts {
		f(&o)
	}
	g := kvstore.NewGuarded(o)
	t.Cleanup(g.Close)
	return g
}

func fakeEngines(t testing.TB, n int) []Endpoint {
	var eps []Endpoint
	for i := range n {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/metrics" {
				fmt.Fprintf(w, "vllm:num_requests_waiting %d\n", i)
			}
		}))
		t.Cleanup(srv.Close)
		eps = append(eps, Endpoint{ID: fmt.Sprint("e", i), Engine: "vllm", URL: srv.URL,
			Limits: kvstore.Limits{MaxRequests: 4, MaxTokens: 1 << 20}})
	}
	return eps
}

// newRouter returns a router over idx and res (plain store parts, or a kvstore.Guarded passed as both).
func newRouter(t testing.TB, eps []Endpoint, idx kvstore.Index, res kvstore.Reservations, opts ...func(*Options)) (*Router, *Model) {
	m, err := model.Load("../../../examples/models/qwen3")
	if err != nil {
		t.Fatal(err)
	}
	var all []endpoints.Endpoint
	for _, e := range eps {
		all = append(all, endpoints.Endpoint{ID: e.ID, URL: e.URL, Engine: e.Engine, Model: "qwen3"})
	}
	set := endpoints.NewSet(all, http.DefaultClient, time.Hour, nil)
	set.ProbeAll(context.Background())
	o := Options{Index: idx, Reservations: res, SpeculativeTTL: 2 * time.Second,
		LeaseTTL: 10 * time.Second, DefaultOutputTokens: 16, Endpoints: set, Metrics: metrics.New(),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, f := range opts {
		f(&o)
	}
	r := New(o)
	return r, &Model{Name: "qwen3", BlockSize: 16, QueueTimeout: 50 * time.Millisecond, Encoder: m, Endpoints: eps}
}

// When the store fails, the router routes on load alone with the store's local reservations at the
// configured share, the store reports itself down, and both resume when the store answers again.
func TestStoreDownFallback(t *testing.T) {
	eps := fakeEngines(t, 2)
	fs := kvstore.NewFaultyStore(nil)
	cl := fs.Client()
	fs.Fail(errors.New("dial tcp: connection refused (injected)"))
	g := guarded(t, cl.Reservations(), cl.Index(), cl, 0.5)
	r, m := newRouter(t, eps, g, g)
	body := []byte(`{"model":"qwen3","messages":[{"role":"user","content":"hello there, this prompt is long enough to fill at least two blocks of sixteen tokens each for sure"}]}`)
	req, _ := parseChat(body)
	p, err := r.Plan(context.Background(), m, "", req, body)
	if err != nil {
		t.Fatal(err)
	}
	if !p.LoadOnly || p.Info.Fallback != "store_down" || !g.Status().Down || r.LoadOnlyRequests() != 1 {
		t.Fatalf("plan %+v status %+v", p.Info, g.Status())
	}
	if p.Candidates[p.Ranking[0]].ID != "e0" { // least loaded (waiting 0 vs 1)
		t.Fatalf("ranking %v", p.Ranking)
	}
	// Local share: 0.5 × 4 = 2 per endpoint, 4 in all, then 429.
	var claims []*Claim
	for range 4 {
		c, err := r.Reserve(context.Background(), p, nil)
		if err != nil {
			t.Fatal(err)
		}
		claims = append(claims, c)
	}
	_, err = r.Reserve(context.Background(), p, nil)
	if !errors.Is(err, ErrQueueTimeout) {
		t.Fatalf("fifth reservation: %v", err)
	}
	for _, c := range claims {
		r.Release(c)
	}
	if g.Status().LocalInFlight != 0 {
		t.Fatal("local leases not released")
	}
	fs.Heal()
	deadline := time.Now().Add(2 * time.Second)
	for g.Status().Down && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if g.Status().Down {
		t.Fatal("store never came back")
	}
	if p, err := r.Plan(context.Background(), m, "", req, body); err != nil || p.LoadOnly {
		t.Fatalf("plan after recovery: load only %v, %v", p != nil && p.LoadOnly, err)
	}
}

// BenchmarkPlanReserve measures the gateway's routing work per request on a warm prefix: a chat request of
// a 1.8k-token conversation prefix seen before plus ~200 new tokens, memory store, 4 endpoints.
func BenchmarkPlanReserve(b *testing.B) {
	eps := fakeEngines(b, 4)
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
	r, m := newRouter(b, eps, idx, kvstore.NewMemoryReservations(nil))
	var sys strings.Builder
	for i := 0; sys.Len() < 7000; i++ {
		fmt.Fprintf(&sys, "Policy %d: be precise, cite section %d, and keep answers short. ", i, i*3)
	}
	prefix := fmt.Sprintf(`{"model":"qwen3","max_tokens":1,"messages":[{"role":"system","content":%q},`, sys.String())
	q := strings.Repeat("Tell me about the refund rules for damaged items please. ", 18)
	body := []byte(prefix + fmt.Sprintf(`{"role":"user","content":%q}]}`, q))
	req, _ := parseChat(body)
	ctx := context.Background()
	p, err := r.Plan(ctx, m, "", req, body)
	if err != nil {
		b.Fatal(err)
	}
	idx.Add(ctx, "qwen3", "e2", kvstore.TierGPU, p.Keys[:len(p.Keys)*9/10])
	b.ReportMetric(float64(len(p.IDs)), "prompt_tokens")
	b.ResetTimer()
	for b.Loop() {
		req, _ := parseChat(body)
		p, err := r.Plan(ctx, m, "", req, body)
		if err != nil {
			b.Fatal(err)
		}
		c, err := r.Reserve(ctx, p, nil)
		if err != nil {
			b.Fatal(err)
		}
		r.Record(ctx, p, c)
		r.Release(c)
	}
}

// An endpoint with data-parallel ranks is one candidate per rank: each with its rank's index entries
// ("<id>/dp<r>"), half the limits (two ranks), half the engine's scraped waiting, and the engine's health;
// a rank that holds the prefix is ranked first and reserved under its own ID.
func TestDataParallelRankCandidates(t *testing.T) {
	eps := fakeEngines(t, 2) // e0 waiting 0, e1 waiting 1
	eps[1].Limits = kvstore.Limits{MaxRequests: 5, MaxTokens: 1 << 20}
	ranked := append([]Endpoint{eps[0]}, Ranked(eps[1], 2)...)
	if len(ranked) != 3 || ranked[1].ID != "e1/dp0" || ranked[2].ID != "e1/dp1" || ranked[2].EngineID() != "e1" ||
		ranked[2].DataParallelRank() != 1 || eps[0].DataParallelRank() != -1 || ranked[1].Limits.MaxRequests != 2 ||
		ranked[1].Limits.MaxTokens != 1<<19 {
		t.Fatalf("ranked %+v", ranked)
	}
	if got := Ranked(Endpoint{ID: "x", Limits: kvstore.Limits{MaxRequests: 1}}, 4); got[3].Limits.MaxRequests != 1 {
		t.Fatalf("a limit below the rank count: %+v", got[3].Limits)
	}
	if ids := RankIDs("e1", 2); len(ids) != 2 || ids[1] != "e1/dp1" || RankIDs("e0", 1)[0] != "e0" {
		t.Fatalf("rank IDs %v", ids)
	}
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
	r, m := newRouter(t, eps, idx, kvstore.NewMemoryReservations(nil))
	m.Endpoints = ranked
	body := []byte(`{"model":"qwen3","messages":[{"role":"user","content":"hello there, this prompt is long enough to fill at least two blocks of sixteen tokens each for sure"}]}`)
	req, _ := parseChat(body)
	p, err := r.Plan(context.Background(), m, "", req, body)
	if err != nil {
		t.Fatal(err)
	}
	if err := idx.Add(context.Background(), "qwen3", "e1/dp1", kvstore.TierGPU, p.Keys); err != nil {
		t.Fatal(err)
	}
	p, err = r.Plan(context.Background(), m, "", req, body)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Candidates) != 3 || p.Candidates[2].GPUBlocks != len(p.Keys) || p.Candidates[1].GPUBlocks != 0 ||
		p.Candidates[1].Load.Waiting != 0.5 || !p.Candidates[1].Load.Healthy {
		t.Fatalf("candidates %+v", p.Candidates)
	}
	c, err := r.Reserve(context.Background(), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release(c)
	if got := p.Candidates[c.Index]; got.ID != "e1/dp1" || got.DataParallelRank() != 1 {
		t.Fatalf("reserved %+v", got)
	}
}
