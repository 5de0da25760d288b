// Package route is the gateway's routing pipeline for one request: tokenize (the model's chat template and
// tokenizer) → block keys → index match → snapshot (engine load from gateway/endpoints plus in-flight leases)
// → policy ranking → atomic reservation over the ranking (queued up to the model's queue_timeout) →
// speculative index entry for the chosen endpoint. Forwarding is the server's job; it calls Release.
//
// When the shared store fails, the router keeps serving: it routes on load alone (no index), takes leases
// from LocalReservations limited to store_down_limit_share of every limit, reports itself degraded
// (StoreStatus) and probes the store until it answers again.
package route

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/gateway/endpoints"
	"github.com/kvgate/kvgate/gateway/metrics"
	"github.com/kvgate/kvgate/gateway/openai"
	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/plugins/threetier"
	"github.com/kvgate/kvgate/sdk"
)

// Encoder turns a request into the token IDs the engine will see (gateway/model.Model implements it).
type Encoder interface {
	// EncodeChat renders an OpenAI chat body with the model's template and tokenizes it (no special tokens
	// added); errors are the client's (400).
	EncodeChat(body []byte) (prompt string, ids []uint32, err error)
	// EncodeCompletion tokenizes a completions prompt string, adding special tokens (BOS) as vLLM does.
	EncodeCompletion(prompt string) []uint32
}

// RankInfo says which policy ranked a snapshot.
type RankInfo struct {
	// Policy is the version that was asked, "name@sha256-hex" (shown shortened by the server).
	Policy string
	// Fallback is "" when the policy answered, else why the native three-tier ranking was used (a
	// kvgate_policy_fallbacks_total reason).
	Fallback string
}

// Ranker ranks a snapshot's endpoints, best first, as indices into s.Endpoints. It never fails: a policy in
// trouble falls back to a native ranking (plugins.Host via an adapter implements it).
type Ranker interface {
	Rank(ctx context.Context, model string, s *sdk.Snapshot) ([]int, RankInfo)
}

// Pinger answers whether the shared store is reachable (nil error). The memory store needs none.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Endpoint is one endpoint of a model with its limits.
type Endpoint struct {
	ID     string
	Engine string
	URL    string
	Limits kvstore.Limits
}

// Model is one served model as the router sees it.
type Model struct {
	Name         string
	BlockSize    int
	QueueTimeout time.Duration
	Encoder      Encoder
	Endpoints    []Endpoint
}

// Options configure a Router.
type Options struct {
	Seed                uint64               // block_key_seed
	Index               kvstore.Index        // nil: no index (load-only routing always)
	Reservations        kvstore.Reservations // the store's reservations; nil: local only
	Pinger              Pinger               // nil: the store is never probed (memory)
	StoreDownLimitShare float64              // (0,1]
	SpeculativeTTL      time.Duration        // speculative Record TTL
	LeaseTTL            time.Duration        // reservation lifetime (renewed by the server)
	DefaultOutputTokens int64                // output estimate when a request sets no max_tokens
	Ranker              Ranker               // nil: native three-tier with default config
	Endpoints           *endpoints.Set       // live load and health
	Metrics             *metrics.Metrics     // required
	Log                 *slog.Logger         // required
	Now                 func() time.Time     // nil: time.Now
	StoreProbeInterval  time.Duration        // default 500ms
	NativeConfig        threetier.Config     // config of the load-only fallback ranking
}

// Router runs the pipeline. Safe for concurrent use; create with New.
type Router struct {
	o      Options
	hasher kvstore.Hasher
	local  *LocalReservations

	seq atomic.Uint64
	// stage holds the latency observer of each stage, resolved once (WithLabelValues hashes and locks).
	stage map[string]prometheus.Observer

	down     atomic.Bool
	downMu   sync.Mutex
	downErr  string
	downAt   time.Time
	downN    atomic.Uint64 // requests served while down
	probing  atomic.Bool
	stopOnce sync.Once
	stop     chan struct{}
}

// New returns a Router.
func New(o Options) *Router {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.StoreProbeInterval == 0 {
		o.StoreProbeInterval = 500 * time.Millisecond
	}
	if o.StoreDownLimitShare <= 0 || o.StoreDownLimitShare > 1 {
		o.StoreDownLimitShare = 1
	}
	if o.NativeConfig == (threetier.Config{}) {
		o.NativeConfig = threetier.DefaultConfig()
	}
	r := &Router{o: o, hasher: kvstore.Hasher{Seed: o.Seed}, local: NewLocalReservations(o.StoreDownLimitShare),
		stop: make(chan struct{}), stage: map[string]prometheus.Observer{}}
	for _, st := range []string{metrics.StageTokenize, metrics.StageKeys, metrics.StageMatch, metrics.StageSnapshot,
		metrics.StageRank, metrics.StageReserve, metrics.StageRecord} {
		r.stage[st] = o.Metrics.Stage.WithLabelValues(st)
	}
	return r
}

// Close stops the store probe.
func (r *Router) Close() { r.stopOnce.Do(func() { close(r.stop) }) }

// Candidate is one endpoint of a Plan's snapshot.
type Candidate struct {
	Endpoint
	Load endpoints.Load
	// InFlight is the leased cost on this endpoint (all gateways, or this one's local leases while the store
	// is down).
	InFlight kvstore.Cost
	// GPUBlocks and CPUBlocks are the prefix match.
	GPUBlocks, CPUBlocks int
}

// Plan is one request's routing decision before reservation.
type Plan struct {
	Model   *Model
	LoRA    string
	Request *openai.Request
	// IDs are the prompt token IDs (for completions batches, the first prompt's).
	IDs  []uint32
	Keys []kvstore.BlockKey
	// Candidates are the healthy endpoints, in snapshot order.
	Candidates []Candidate
	Snapshot   sdk.Snapshot
	// Ranking lists Candidates indices, best first.
	Ranking []int
	Info    RankInfo
	// LoadOnly says the index was not consulted (store down or no index).
	LoadOnly bool
	// Stages are the durations of each stage (metrics.Stage* names).
	Stages map[string]time.Duration
}

// ErrNoHealthy is wrapped by Plan's *openai.Error 503.
var errNoHealthy = errors.New("no healthy endpoint")

func (r *Router) storeFailed(op string, err error) {
	r.o.Metrics.StoreErrors.WithLabelValues(op).Inc()
	r.downMu.Lock()
	r.downErr = op + ": " + err.Error()
	if !r.down.Load() {
		r.downAt = r.o.Now()
	}
	r.downMu.Unlock()
	if r.down.CompareAndSwap(false, true) {
		r.o.Metrics.StoreDown.Set(1)
		r.o.Log.Warn("store unreachable: routing on load only with local reservations",
			slog.String("op", op), slog.String("error", err.Error()))
		if r.o.Pinger != nil && r.probing.CompareAndSwap(false, true) {
			go r.probeStore()
		}
	}
}

func (r *Router) probeStore() {
	defer r.probing.Store(false)
	t := time.NewTicker(r.o.StoreProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), r.o.StoreProbeInterval)
		err := r.o.Pinger.Ping(ctx)
		cancel()
		if err == nil {
			r.down.Store(false)
			r.o.Metrics.StoreDown.Set(0)
			r.o.Log.Info("store reachable again: full routing resumed")
			return
		}
	}
}

// StoreStatus is the store's state for /readyz.
type StoreStatus struct {
	Down bool `json:"down"`
	// Since is when it was found down (zero when up).
	Since time.Time `json:"since,omitzero"`
	// LastError is the last store error seen.
	LastError string `json:"last_error,omitempty"`
	// LoadOnlyRequests counts requests routed without the store since start.
	LoadOnlyRequests uint64 `json:"load_only_requests"`
	// LocalInFlight counts leases held in the local fallback.
	LocalInFlight int `json:"local_inflight"`
}

// StoreStatus reports the store's state.
func (r *Router) StoreStatus() StoreStatus {
	r.downMu.Lock()
	s := StoreStatus{Down: r.down.Load(), LastError: r.downErr, LoadOnlyRequests: r.downN.Load()}
	if s.Down {
		s.Since = r.downAt
	}
	r.downMu.Unlock()
	r.local.mu.Lock()
	s.LocalInFlight = len(r.local.leases)
	r.local.mu.Unlock()
	return s
}

// storeUp says whether store operations should be tried.
func (r *Router) storeUp() bool { return !r.down.Load() }

// Plan runs tokenize → keys → match → snapshot → rank for req (parsed from body) on model m, for LoRA
// adapter lora (""). Errors are *openai.Error (400 tokenization, 503 no healthy endpoint).
func (r *Router) Plan(ctx context.Context, m *Model, lora string, req *openai.Request, body []byte) (*Plan, error) {
	p := &Plan{Model: m, LoRA: lora, Request: req, Stages: make(map[string]time.Duration, 8)}
	t0 := r.o.Now()
	stage := func(name string, since time.Time) time.Time {
		now := r.o.Now()
		d := now.Sub(since)
		p.Stages[name] = d
		r.stage[name].Observe(d.Seconds())
		return now
	}
	// 1. tokenize
	switch {
	case req.API == openai.Chat:
		_, ids, err := m.Encoder.EncodeChat(body)
		if err != nil {
			return nil, openai.BadRequest("messages", "%v", err)
		}
		p.IDs = ids
	case req.PromptIsIDs:
		p.IDs = req.PromptIDs
	default:
		p.IDs = m.Encoder.EncodeCompletion(req.PromptText)
	}
	t := stage(metrics.StageTokenize, t0)
	// 2. block keys
	p.Keys = r.hasher.Keys(p.IDs, m.BlockSize, kvstore.ExtraKeys{LoRA: lora, CacheSalt: req.CacheSalt})
	t = stage(metrics.StageKeys, t)
	// candidates: healthy endpoints
	ids := make([]kvstore.EndpointID, 0, len(m.Endpoints))
	for _, e := range m.Endpoints {
		ld := r.o.Endpoints.Load(e.ID)
		if !ld.Healthy {
			continue
		}
		p.Candidates = append(p.Candidates, Candidate{Endpoint: e, Load: ld})
		ids = append(ids, kvstore.EndpointID(e.ID))
	}
	if len(p.Candidates) == 0 {
		return nil, fmt.Errorf("%w: %w", openai.Unavailable(req.Model), errNoHealthy)
	}
	// 3. match, and 4. the in-flight leases for the snapshot. On a remote store the two round trips run
	// concurrently (the in-flight read starts first, in its own goroutine).
	type inflightResult struct {
		m   map[kvstore.EndpointID]kvstore.Cost
		err error
	}
	var inflCh chan inflightResult
	readInflight := func() inflightResult {
		if r.o.Reservations == nil || !r.storeUp() {
			return inflightResult{}
		}
		m, err := r.o.Reservations.InFlight(ctx, ids)
		return inflightResult{m, err}
	}
	if r.o.Pinger != nil {
		inflCh = make(chan inflightResult, 1)
		go func() { inflCh <- readInflight() }()
	}
	p.LoadOnly = r.o.Index == nil || !r.storeUp()
	if !p.LoadOnly && len(p.Keys) > 0 {
		ms, err := r.o.Index.Match(ctx, m.Name, p.Keys)
		if err != nil && ctx.Err() == nil {
			r.storeFailed("match", err)
			p.LoadOnly = true
		}
		for _, mt := range ms {
			for i := range p.Candidates {
				if p.Candidates[i].ID == string(mt.Endpoint) {
					p.Candidates[i].GPUBlocks, p.Candidates[i].CPUBlocks = mt.GPUBlocks, mt.CPUBlocks
				}
			}
		}
	}
	t = stage(metrics.StageMatch, t)
	var ir inflightResult
	if inflCh != nil {
		ir = <-inflCh
	} else {
		ir = readInflight()
	}
	infl := ir.m
	if ir.err != nil && ctx.Err() == nil {
		r.storeFailed("inflight", ir.err)
		infl = nil
	}
	if infl == nil || !r.storeUp() {
		infl, _ = r.local.InFlight(ctx, ids)
	}
	p.Snapshot = sdk.Snapshot{Request: sdk.Request{
		Seq: r.seq.Add(1), PromptTokens: uint32(len(p.IDs)), PromptBlocks: uint32(len(p.Keys)),
		BlockSize: uint32(m.BlockSize), ModelHash: modelHash(m.Name, lora), Seed: rand.Uint64()}}
	p.Snapshot.Endpoints = make([]sdk.Endpoint, len(p.Candidates))
	for i := range p.Candidates {
		c := &p.Candidates[i]
		c.InFlight = infl[kvstore.EndpointID(c.ID)]
		if p.LoadOnly {
			c.GPUBlocks, c.CPUBlocks = 0, 0
		}
		p.Snapshot.Endpoints[i] = sdk.Endpoint{Index: uint32(i), Flags: sdk.FlagHealthy,
			GPUBlocks: uint32(c.GPUBlocks), CPUBlocks: uint32(c.CPUBlocks),
			Waiting: u32(c.Load.Waiting), Running: u32(c.Load.Running),
			InFlightRequests: uint32(max(c.InFlight.Requests, 0)), InFlightTokens: uint64(max(c.InFlight.Tokens, 0)),
			KVCacheUtilization: float32(c.Load.KVCacheUsage)}
	}
	t = stage(metrics.StageSnapshot, t)
	// 5. rank
	if p.LoadOnly || r.o.Ranker == nil {
		out, _ := threetier.New(r.o.NativeConfig).Rank(&p.Snapshot, make([]uint32, 0, len(p.Candidates)))
		p.Ranking = make([]int, len(out))
		for i, v := range out {
			p.Ranking[i] = int(v)
		}
		p.Info = RankInfo{Policy: "three-tier@native"}
		if p.LoadOnly && r.o.Index != nil {
			p.Info.Fallback = "store_down"
			r.downN.Add(1)
			r.o.Metrics.LoadOnlyRoutes.WithLabelValues(m.Name).Inc()
		}
	} else {
		p.Ranking, p.Info = r.o.Ranker.Rank(ctx, m.Name, &p.Snapshot)
		if p.Info.Fallback != "" {
			r.o.Metrics.PolicyFallbacks.WithLabelValues(m.Name, p.Info.Fallback).Inc()
		}
	}
	stage(metrics.StageRank, t)
	return p, nil
}

func u32(f float64) uint32 {
	if f <= 0 {
		return 0
	}
	if f > 1<<31 {
		return 1 << 31
	}
	return uint32(f + 0.5)
}

// modelHash is the 64-bit model/LoRA hash of the snapshot header (FNV-1a of "model\x00lora").
func modelHash(model, lora string) uint64 {
	h := uint64(14695981039346656037)
	for _, s := range []string{model, "\x00", lora} {
		for i := 0; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= 1099511628211
		}
	}
	return h
}

// Claim is a reservation taken for a Plan.
type Claim struct {
	Lease kvstore.Lease
	// Index is the chosen candidate's index in Plan.Candidates.
	Index int
	local bool
}

// Cost returns what the plan's request reserves: 1 request and prompt + expected output tokens.
func (r *Router) Cost(p *Plan) kvstore.Cost {
	out := p.Request.MaxTokens
	if out < 0 {
		out = r.o.DefaultOutputTokens
	}
	return kvstore.Cost{Requests: 1, Tokens: int64(len(p.IDs)) + out}
}

// Reserve leases the first ranked candidate with capacity, skipping candidates in exclude (indices of
// Plan.Candidates that already failed). While every candidate is full it waits and retries until the
// model's queue timeout, then returns *openai.Error 429; ctx ending (client gone) returns ctx's error.
func (r *Router) Reserve(ctx context.Context, p *Plan, exclude map[int]bool) (*Claim, error) {
	start := r.o.Now()
	defer func() {
		r.stage[metrics.StageReserve].Observe(r.o.Now().Sub(start).Seconds())
	}()
	ranked := make([]kvstore.Candidate, 0, len(p.Ranking))
	order := make([]int, 0, len(p.Ranking))
	for _, i := range p.Ranking {
		if exclude[i] {
			continue
		}
		c := p.Candidates[i]
		ranked = append(ranked, kvstore.Candidate{Endpoint: kvstore.EndpointID(c.ID), Limits: c.Limits})
		order = append(order, i)
	}
	if len(ranked) == 0 {
		return nil, openai.Unavailable(p.Request.Model)
	}
	cost := r.Cost(p)
	// A request larger than an endpoint's whole token limit would never fit: it claims the whole limit
	// (the engine itself rejects prompts over its context length).
	for _, c := range ranked {
		if c.Limits.MaxTokens > 0 && cost.Tokens > c.Limits.MaxTokens {
			cost.Tokens = c.Limits.MaxTokens
		}
	}
	deadline := start.Add(p.Model.QueueTimeout)
	wait := 5 * time.Millisecond
	for {
		var l kvstore.Lease
		var err error
		local := r.o.Reservations == nil || !r.storeUp()
		if !local {
			l, err = r.o.Reservations.Reserve(ctx, ranked, cost, r.o.LeaseTTL)
			if err != nil && !errors.Is(err, kvstore.ErrNoCapacity) && ctx.Err() == nil {
				r.storeFailed("reserve", err)
				local = true
			}
		}
		if local {
			l, err = r.local.Reserve(ctx, ranked, cost, r.o.LeaseTTL)
		}
		if err == nil {
			idx := order[0]
			for k, c := range ranked {
				if c.Endpoint == l.Endpoint {
					idx = order[k]
					break
				}
			}
			r.o.Metrics.InFlight.WithLabelValues(string(l.Endpoint)).Inc()
			return &Claim{Lease: l, Index: idx, local: local}, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		r.o.Metrics.ReservationRefusals.WithLabelValues(p.Model.Name).Inc()
		now := r.o.Now()
		if !now.Before(deadline) {
			r.o.Metrics.QueueTimeouts.WithLabelValues(p.Model.Name).Inc()
			return nil, openai.NoCapacity(p.Request.Model)
		}
		sl := min(wait, deadline.Sub(now))
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(sl):
		}
		wait = min(wait*2, 50*time.Millisecond)
	}
}

// Record counts the routed prompt and matched tokens and writes the plan's block keys as a speculative entry
// for the claimed endpoint, in the background (best effort; a store error marks the store down).
func (r *Router) Record(ctx context.Context, p *Plan, c *Claim) {
	cd := p.Candidates[c.Index]
	bs := p.Model.BlockSize
	r.o.Metrics.PromptTokens.WithLabelValues(p.Model.Name).Add(float64(len(p.IDs)))
	r.o.Metrics.MatchedTokens.WithLabelValues(p.Model.Name, "GPU").Add(float64(cd.GPUBlocks * bs))
	r.o.Metrics.MatchedTokens.WithLabelValues(p.Model.Name, "CPU").Add(float64(cd.CPUBlocks * bs))
	if r.o.Index == nil || len(p.Keys) == 0 || !r.storeUp() {
		return
	}
	// Off the request's critical path: the entry only has to beat the engine's own events (tens of ms),
	// and it must be written even if the request ends first.
	model, ep, keys := p.Model.Name, c.Lease.Endpoint, p.Keys
	go func() {
		start := r.o.Now()
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := r.o.Index.Record(rctx, model, ep, keys, r.o.SpeculativeTTL); err != nil {
			r.storeFailed("record", err)
		}
		r.stage[metrics.StageRecord].Observe(r.o.Now().Sub(start).Seconds())
	}()
}

// Renew extends c's lease by the lease TTL; the server calls it every TTL/3 on long responses.
func (r *Router) Renew(ctx context.Context, c *Claim) error {
	var err error
	var l kvstore.Lease
	if c.local {
		l, err = r.local.Renew(ctx, c.Lease, r.o.LeaseTTL)
	} else {
		l, err = r.o.Reservations.Renew(ctx, c.Lease, r.o.LeaseTTL)
	}
	if err == nil {
		c.Lease = l
	}
	return err
}

// LeaseTTL returns the configured lease lifetime.
func (r *Router) LeaseTTL() time.Duration { return r.o.LeaseTTL }

// Release ends c's lease; it uses a fresh context so a cancelled request still releases.
func (r *Router) Release(c *Claim) {
	r.o.Metrics.InFlight.WithLabelValues(string(c.Lease.Endpoint)).Dec()
	if c.local {
		r.local.Release(context.Background(), c.Lease)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := r.o.Reservations.Release(ctx, c.Lease); err != nil {
		r.storeFailed("release", err) // the lease expires on its own
	}
}

// ShortVersion shortens "name@<64 hex>" to "name@<12 hex>" for headers and logs.
func ShortVersion(v string) string {
	for i := len(v) - 1; i >= 0; i-- {
		if v[i] == '@' {
			if len(v)-i-1 > 12 {
				return v[:i+13]
			}
			return v
		}
	}
	return v
}
