package route

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/plugins"
	"github.com/kvgate/kvgate/sdk"
)

// recordingRanker is the gateway's adapter of plugins.Host (gateway/gateway.go), recording the RankLimit of
// every call.
type recordingRanker struct {
	h      *plugins.Host
	mu     sync.Mutex
	limits []uint32
}

func (r *recordingRanker) Rank(ctx context.Context, model string, s *sdk.Snapshot) ([]int, RankInfo) {
	r.mu.Lock()
	r.limits = append(r.limits, s.Request.RankLimit)
	r.mu.Unlock()
	rk, info := r.h.Rank(ctx, model, s)
	ri := RankInfo{Policy: string(info.Version), Partial: info.Partial}
	if info.Fallback {
		ri.Fallback = info.Reason.String()
	}
	return rk, ri
}

func (r *recordingRanker) take() []uint32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.limits
	r.limits = nil
	return l
}

// TestPartialRankingFallThrough: the router asks the built-in policy (real wazero) for its first 8 ranked
// endpoints; while one of them has room the claim is there with no second policy call, and once all 8
// are full (or excluded) it asks for the whole ranking and claims the first endpoint with room in it.
// Every claim is the one the whole ranking (the native three-tier ranking of the same snapshot) gives.
func TestPartialRankingFallThrough(t *testing.T) {
	eps := fakeEngines(t, 12) // e<i> waiting i
	for i := range eps {
		eps[i].Limits = kvstore.Limits{MaxRequests: 1, MaxTokens: 1 << 20}
	}
	h, err := plugins.New(context.Background(), plugins.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	rr := &recordingRanker{h: h}
	res := kvstore.NewMemoryReservations(nil)
	r, m := newRouter(t, eps, kvstore.NewMemoryIndex(kvstore.MemoryConfig{}), res, func(o *Options) { o.Ranker = rr })
	body := []byte(`{"model":"qwen3","messages":[{"role":"user","content":"hello"}]}`)
	claimed, falls := map[string]bool{}, 0
	ctx := context.Background()
	for k := range len(eps) {
		req, _ := parseChat(body)
		p, err := r.Plan(ctx, m, "", req, body)
		if err != nil {
			t.Fatal(err)
		}
		if !p.Info.Partial || len(p.Ranking) != rankLimit {
			t.Fatalf("claim %d: plan ranking %v %+v, want the first %d", k, p.Ranking, p.Info, rankLimit)
		}
		s := p.Snapshot
		s.Endpoints = slices.Clone(s.Endpoints)
		whole := plugins.RankThreeTier(plugins.DefaultThreeTierConfig(), &s, nil)
		if !slices.Equal(toInts(whole[:rankLimit]), p.Ranking) {
			t.Fatalf("claim %d: prefix %v, whole ranking %v", k, p.Ranking, whole)
		}
		var exclude map[int]bool
		if k == 2 { // the best 8 excluded (failed): the 9th of the whole ranking
			exclude = map[int]bool{}
			for _, i := range whole[:rankLimit] {
				exclude[int(i)] = true
			}
		}
		want := ""
		for _, i := range whole {
			if id := p.Candidates[i].ID; !claimed[id] && !exclude[int(i)] {
				want = id
				break
			}
		}
		c, err := r.Reserve(ctx, p, exclude)
		if err != nil {
			t.Fatalf("claim %d: %v", k, err)
		}
		got := p.Candidates[c.Index].ID
		if got != want || string(c.Endpoint()) != want {
			t.Fatalf("claim %d: %s (%s), want %s; whole ranking %v", k, got, c.Endpoint(), want, whole)
		}
		wantCalls, fell := []uint32{rankLimit}, true
		for _, i := range whole[:rankLimit] {
			fell = fell && (claimed[p.Candidates[i].ID] || exclude[int(i)])
		}
		claimed[got] = true
		if fell { // the prefix had no endpoint with room left: the whole ranking
			falls++
			wantCalls = append(wantCalls, 0)
			if p.Info.Partial || len(p.Ranking) != len(whole) {
				t.Fatalf("claim %d: ranking after fall-through %v %+v", k, p.Ranking, p.Info)
			}
		}
		if calls := rr.take(); !slices.Equal(calls, wantCalls) {
			t.Fatalf("claim %d: policy calls with RankLimit %v, want %v", k, calls, wantCalls)
		}
	}
	if falls < 1 || falls > len(eps)-rankLimit+1 { // claim 2 always falls through
		t.Fatalf("%d of %d claims fell through the prefix", falls, len(eps))
	}
	t.Logf("%d of %d claims fell through the first %d", falls, len(eps), rankLimit)
}

func toInts(v []uint32) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}

// TestPartialRankingWholeSetDecisions: a request of two sequences (n = 2: the batch fit) and one larger
// than an endpoint's token limit (the clamp) are decided over the whole candidate set, so Reserve ranks in
// full before its first reservation, and the claim is the whole ranking's first endpoint.
func TestPartialRankingWholeSetDecisions(t *testing.T) {
	eps := fakeEngines(t, 12)
	for i := range eps {
		eps[i].Limits = kvstore.Limits{MaxRequests: 4, MaxTokens: 1 << 20}
	}
	eps[5].Limits.MaxTokens = 1000
	h, err := plugins.New(context.Background(), plugins.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	rr := &recordingRanker{h: h}
	r, m := newRouter(t, eps, kvstore.NewMemoryIndex(kvstore.MemoryConfig{}), kvstore.NewMemoryReservations(nil),
		func(o *Options) { o.Ranker = rr })
	ctx := context.Background()
	for _, c := range []struct{ name, body string }{
		{"n=2", `{"model":"qwen3","n":2,"max_tokens":10,"messages":[{"role":"user","content":"hello"}]}`},
		{"clamp", `{"model":"qwen3","max_tokens":5000,"messages":[{"role":"user","content":"hello"}]}`},
		{"plain", `{"model":"qwen3","max_tokens":10,"messages":[{"role":"user","content":"hello"}]}`},
	} {
		body := []byte(c.body)
		req, err := parseChat(body)
		if err != nil {
			t.Fatal(err)
		}
		p, err := r.Plan(ctx, m, "", req, body)
		if err != nil {
			t.Fatal(err)
		}
		s := p.Snapshot
		s.Endpoints = slices.Clone(s.Endpoints)
		whole := plugins.RankThreeTier(plugins.DefaultThreeTierConfig(), &s, nil)
		cl, err := r.Reserve(ctx, p, nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		want := []uint32{rankLimit, 0}
		if c.name == "plain" {
			want = want[:1]
		}
		if calls := rr.take(); !slices.Equal(calls, want) {
			t.Fatalf("%s: policy calls with RankLimit %v, want %v", c.name, calls, want)
		}
		if cl.Index != int(whole[0]) {
			t.Fatalf("%s: claimed candidate %d, whole ranking %v", c.name, cl.Index, whole)
		}
		r.Release(cl)
	}
}
