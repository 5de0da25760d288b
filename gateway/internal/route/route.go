// Package route is the gateway's routing pipeline for one request: tokenize (the model's chat template and
// tokenizer) → block keys → index match → snapshot (engine load from gateway/internal/endpoints plus in-flight leases)
// → policy ranking → atomic reservation over the ranking (queued up to the model's queue_timeout) →
// speculative index entry for the chosen endpoint. Forwarding is the server's job; it calls Release.
//
// The router knows no store: it calls kvstore.Index and kvstore.Reservations. Store failure is the store's
// (kvstore.Guarded: ledger, store-down caps, recovery, epoch): a Match that fails (kvstore.ErrUnavailable
// while the store is down) makes the plan load-only ("store_down" fallback), and Reserve is a queue loop
// over whatever the reservations answer. Errors are the typed values in errors.go; the server maps them to
// HTTP once.
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

	"github.com/kvgate/kvgate/gateway/internal/chattemplate"
	"github.com/kvgate/kvgate/gateway/internal/endpoints"
	"github.com/kvgate/kvgate/gateway/internal/metrics"
	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/kvevents"
	"github.com/kvgate/kvgate/plugins"
	"github.com/kvgate/kvgate/sdk"
)

// Encoder turns a request into the token IDs the engine will see (gateway/internal/model.Model implements it).
type Encoder interface {
	// EncodeChat renders an OpenAI chat body with the model's template and tokenizes it (no special tokens
	// added); errors are the client's (400).
	EncodeChat(body []byte) (prompt string, ids []uint32, err error)
	// EncodeCompletion tokenizes a completions prompt string, adding special tokens (BOS) as vLLM does.
	EncodeCompletion(prompt string) []uint32
}

// ChatRequestEncoder is an Encoder that also encodes a chat body already decoded (Request.ChatRequest, from
// openai.ParseRequest), so Plan does not scan the body a second time; gateway/internal/model.Model implements it.
// Its results and errors are EncodeChat's for the same body.
type ChatRequestEncoder interface {
	EncodeChatRequest(r *chattemplate.Request) (prompt string, ids []uint32, err error)
}

// RankInfo says which policy ranked a snapshot.
type RankInfo struct {
	// Policy is the version that was asked, "name@sha256-hex" (shown shortened by the server).
	Policy string
	// Fallback is "" when the policy answered, else why the native three-tier ranking was used (a
	// kvgate_policy_fallbacks_total reason).
	Fallback string
	// Partial says the ranking may be only the first Request.RankLimit entries of the policy's ranking
	// (plugins.RankInfo.Partial); ranking the same snapshot with RankLimit 0 gives all of it.
	Partial bool
}

// Ranker ranks a snapshot's endpoints, best first, as indices into s.Endpoints. It never fails: a policy in
// trouble falls back to a native ranking (plugins.Host via an adapter implements it). With
// s.Request.RankLimit L > 0 it may return only the first L entries, saying so in RankInfo.Partial.
type Ranker interface {
	Rank(ctx context.Context, model string, s *sdk.Snapshot) ([]int, RankInfo)
}

// Request is what routing needs of one client request; the server fills it from the parsed OpenAI body
// (gateway/internal/server routeRequest).
type Request struct {
	// Model is the "model" member as sent (a model or LoRA adapter name), for messages.
	Model string
	// Chat says a chat completion: ChatRequest (the parsed chat, or nil: the body is rendered) goes through
	// the model's template. Otherwise a completion of PromptIDs (PromptIsIDs) or PromptText.
	Chat        bool
	ChatRequest *chattemplate.Request
	PromptText  string
	PromptIDs   []uint32
	PromptIsIDs bool
	// BatchTexts and BatchIDTokens are a completions batch's other prompts (texts to tokenize, and the
	// token count of those sent as IDs); Prompts counts every prompt of the batch (1 for one prompt).
	BatchTexts    []string
	BatchIDTokens int64
	Prompts       int
	// CacheSalt is folded into block 0's key.
	CacheSalt string
	// Responses says a POST /v1/responses request: ChatRequest is the chat it maps onto (nil: it maps onto
	// none, routed on load with LoadOnlyReason "chat_template").
	Responses bool
	// LoadOnlyReason, when set, says why the request is routed on load alone without being tokenized
	// (embeddings, a Responses request that maps onto no chat: "previous_response_id", "tools", ...). Plan
	// sets it in Plan.Request when a Responses request's chat cannot be rendered.
	LoadOnlyReason string
	// MaxTokens is the output token limit (-1: not set), N and BestOf the sequences asked for.
	MaxTokens int64
	N, BestOf int64
}

// Endpoint is one endpoint of a model with its limits.
type Endpoint struct {
	ID     string
	Engine string
	URL    string
	Limits kvstore.Limits
	// Events says the endpoint's KV events feed the index (it has a kv_events address). Record then writes
	// speculative entries only past the prefix the index already matched on it (see Record).
	Events bool
	// Base, Rank and Ranks describe a data-parallel rank (see Ranked): Base is the configured endpoint ID
	// whose health it shares and whose scrape gives its load (endpoints.Load.Rank: the rank's own
	// engine="<r>" series, else an even share; "" when the endpoint has one rank: ID itself), Rank its
	// rank, Ranks the endpoint's data-parallel size.
	Base        string
	Rank, Ranks int
}

// EngineID returns the configured endpoint ID (the engine's health, load and metrics): Base for a rank.
func (e Endpoint) EngineID() string {
	if e.Base != "" {
		return e.Base
	}
	return e.ID
}

// DataParallelRank returns the rank to send in X-data-parallel-rank, or -1 for an endpoint without ranks.
func (e Endpoint) DataParallelRank() int {
	if e.Base == "" {
		return -1
	}
	return e.Rank
}

// Ranked returns the routing candidates of an endpoint with n data-parallel ranks: e itself when n ≤ 1,
// else one per rank, ID "<id>/dp<r>" (kvevents.RankEndpoint: the rank's index entries), each with
// 1/n of e's limits (rounded down, at least 1), so the ranks' caps sum to at most e's unless a limit is
// below n.
func Ranked(e Endpoint, n int) []Endpoint {
	if n <= 1 {
		return []Endpoint{e}
	}
	share := func(l int64) int64 {
		if l <= 0 {
			return l
		}
		return max(l/int64(n), 1)
	}
	out := make([]Endpoint, n)
	for r := range out {
		c := e
		c.ID, c.Base, c.Rank, c.Ranks = string(kvevents.RankEndpoint(kvstore.EndpointID(e.ID), r)), e.ID, r, n
		c.Limits = kvstore.Limits{MaxRequests: share(e.Limits.MaxRequests), MaxTokens: share(e.Limits.MaxTokens)}
		out[r] = c
	}
	return out
}

// RankIDs returns the lease and index IDs of an endpoint with n data-parallel ranks (id itself when n ≤ 1).
func RankIDs(id string, n int) []kvstore.EndpointID {
	if n <= 1 {
		return []kvstore.EndpointID{kvstore.EndpointID(id)}
	}
	out := make([]kvstore.EndpointID, n)
	for r := range out {
		out[r] = kvevents.RankEndpoint(kvstore.EndpointID(id), r)
	}
	return out
}

// Model is one served model as the router sees it.
type Model struct {
	Name         string
	BlockSize    int
	QueueTimeout time.Duration
	Encoder      Encoder
	// Endpoints are the model's endpoints when Live is nil.
	Endpoints []Endpoint
	// MaxPromptTokens rejects longer prompts with 400 before routing (0: no limit).
	MaxPromptTokens int
	// Live, when set, is the model's run-time endpoint list, replaced whole while the gateway runs
	// (endpoints added, removed, drained); it takes the place of Endpoints.
	Live *EndpointList
}

// Current returns the model's endpoints now: Live's list, else Endpoints. The slice must not be modified.
func (m *Model) Current() []Endpoint {
	if m.Live != nil {
		return m.Live.Load()
	}
	return m.Endpoints
}

// EndpointList is a model's run-time endpoint list: requests planned after a Store see the new list,
// requests already planned keep their candidates. Safe for concurrent use.
type EndpointList struct{ p atomic.Pointer[[]Endpoint] }

// NewEndpointList returns a list holding eps.
func NewEndpointList(eps []Endpoint) *EndpointList {
	l := &EndpointList{}
	l.Store(eps)
	return l
}

// Load returns the current list (not to be modified).
func (l *EndpointList) Load() []Endpoint { return *l.p.Load() }

// Store replaces the list; eps must not be modified afterwards.
func (l *EndpointList) Store(eps []Endpoint) { l.p.Store(&eps) }

// Options configure a Router.
type Options struct {
	Seed uint64 // block_key_seed
	// Index is the KV index (nil: no index, load-only routing always). The gateway passes its
	// kvstore.Guarded, which fails Match fast with kvstore.ErrUnavailable while the store is down.
	Index kvstore.Index
	// Reservations leases endpoint capacity (required; the gateway passes its kvstore.Guarded). Reserve
	// waits while it answers kvstore.ErrNoCapacity; any other error is ErrStoreRefused.
	Reservations        kvstore.Reservations
	SpeculativeTTL      time.Duration    // speculative Record TTL
	LeaseTTL            time.Duration    // reservation lifetime (renewed by the server)
	DefaultOutputTokens int64            // output estimate when a request sets no max_tokens
	Ranker              Ranker           // nil: native three-tier with default config
	Endpoints           *endpoints.Set   // live load and health
	Metrics             *metrics.Metrics // required
	Log                 *slog.Logger     // required
	Now                 func() time.Time // nil: time.Now
	// NativeConfig is the config of the load-only fallback ranking (zero: the defaults).
	NativeConfig plugins.ThreeTierConfig
	// HitTTL, if set, is how long a routed hit keeps the matched prefix counted on its endpoint (a Record of
	// the matched blocks, at most once per HitTTL/4 per endpoint and prefix): vLLM announces nothing on a
	// cache hit, so without it a hot prefix whose entries became unconfirmed (kvstore.Demoter) would age out
	// although every request keeps it warm on the engine. The gateway sets it to index_unconfirmed_ttl. The
	// engine's own clear (AllBlocksCleared, a restart) drops these refreshes with its confirmed entries
	// (kvstore.ClearKeepsHoldsWithin).
	HitTTL time.Duration
}

// Router runs the pipeline. Safe for concurrent use; create with New.
type Router struct {
	o      Options
	hasher kvstore.Hasher
	// remote says the store's calls are round trips (Options.Index or Reservations has IsRemote() true):
	// Plan then reads the in-flight counters concurrently with the match.
	remote bool

	seq atomic.Uint64
	// stage holds the latency observer of each stage, resolved once (WithLabelValues hashes and locks).
	stage map[string]prometheus.Observer
	// tokens caches each model's prompt and matched-token counters (Record runs on every request).
	tokens sync.Map // model name -> *tokenCounters

	hitMu sync.Mutex
	hits  map[hitKey]time.Time // last routed-hit refresh per (endpoint, last matched block)

	loadOnlyN atomic.Uint64 // requests routed without the index because the store failed
}

// New returns a Router.
func New(o Options) *Router {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.NativeConfig == (plugins.ThreeTierConfig{}) {
		o.NativeConfig = plugins.DefaultThreeTierConfig()
	}
	r := &Router{o: o, hasher: kvstore.Hasher{Seed: o.Seed}, stage: map[string]prometheus.Observer{}}
	type remoter interface{ IsRemote() bool }
	for _, v := range []any{o.Index, o.Reservations} {
		if rm, ok := v.(remoter); ok && rm.IsRemote() {
			r.remote = true
		}
	}
	for _, st := range []string{metrics.StageTokenize, metrics.StageKeys, metrics.StageMatch, metrics.StageSnapshot,
		metrics.StageRank, metrics.StageReserve, metrics.StageRecord} {
		r.stage[st] = o.Metrics.Stage.WithLabelValues(st)
	}
	return r
}

// LoadOnlyRequests counts the requests routed without the index since start because the store failed
// (/readyz store.load_only_requests).
func (r *Router) LoadOnlyRequests() uint64 { return r.loadOnlyN.Load() }

// Candidate is one endpoint of a Plan's snapshot.
type Candidate struct {
	Endpoint
	Load endpoints.Load
	// InFlight is the leased cost on this endpoint (all gateways; only this one's while the store is down:
	// kvstore.Guarded.InFlight).
	InFlight kvstore.Cost
	// GPUBlocks and CPUBlocks are the prefix match.
	GPUBlocks, CPUBlocks int
}

// Plan is one request's routing decision before reservation.
type Plan struct {
	Model   *Model
	LoRA    string
	Request Request
	// IDs are the prompt token IDs (for completions batches, the first prompt's).
	IDs []uint32
	// BatchTokens are the prompt tokens of a completions batch's other prompts (0 for a single prompt).
	BatchTokens int64
	Keys        []kvstore.BlockKey
	// Candidates are the healthy endpoints, in snapshot order.
	Candidates []Candidate
	Snapshot   sdk.Snapshot
	// Ranking lists Candidates indices, best first: only the first rankLimit of them while Info.Partial
	// (Reserve and CompleteRanking rank the rest when they are needed).
	Ranking []int
	Info    RankInfo
	// LoadOnly says the index was not consulted (store down or no index).
	LoadOnly bool
	// Stages are the durations of each stage (metrics.Stage* names).
	Stages map[string]time.Duration
	// TokenIDsSkip, when set, says the chat could not be tokenized exactly, so it is routed on load alone
	// (no IDs) and must go with its original body: upstream.SkipMultimodal (a content part the template
	// cannot render, e.g. media on a template that takes string content) or upstream.SkipContinueFinal (a
	// continue_final_message the template cannot express). The engine answers such a request itself.
	TokenIDsSkip string
}

// Plan runs tokenize → keys → match → snapshot → rank for req (parsed from body) on model m, for LoRA
// adapter lora (""). Errors: *RequestError (the request cannot be tokenized or is too long), ErrNoHealthy.
// A failed match (the store down) is no error: the plan is load-only.
func (r *Router) Plan(ctx context.Context, m *Model, lora string, req Request, body []byte) (*Plan, error) {
	p := &Plan{Model: m, LoRA: lora, Request: req, Stages: make(map[string]time.Duration, 8)}
	clock := stageClock{r: r, p: p, t: r.o.Now()}
	if err := r.tokenize(m, req, body, p); err != nil {
		return nil, err
	}
	clock.end(metrics.StageTokenize)
	p.Keys = r.hasher.Keys(p.IDs, m.BlockSize, kvstore.ExtraKeys{LoRA: lora, CacheSalt: req.CacheSalt})
	clock.end(metrics.StageKeys)
	ids, err := r.candidates(m, p)
	if err != nil {
		return nil, err
	}
	// The match and the in-flight leases for the snapshot: on a remote store the two calls run
	// concurrently (the in-flight read starts first, in its own goroutine), and on one Redis server their
	// first round trips are one pipeline (kvstore.SharedRound; each call leaves the round when it returns,
	// so one that sends nothing does not hold the other up).
	ictx, mctx := ctx, ctx
	if r.remote {
		sr := kvstore.NewSharedRound()
		ictx, mctx = sr.Join(ctx), sr.Join(ctx)
	}
	inflight := r.readInFlight(ictx, ids)
	r.match(mctx, m, p)
	kvstore.LeaveRound(mctx)
	clock.end(metrics.StageMatch)
	r.snapshot(m, lora, p, inflight())
	clock.end(metrics.StageSnapshot)
	r.rank(ctx, m, p)
	clock.end(metrics.StageRank)
	return p, nil
}

// stageClock records each stage's duration in Plan.Stages and in the stage histogram.
type stageClock struct {
	r *Router
	p *Plan
	t time.Time // the end of the previous stage
}

func (c *stageClock) end(name string) {
	now := c.r.o.Now()
	d := now.Sub(c.t)
	c.p.Stages[name] = d
	c.r.stage[name].Observe(d.Seconds())
	c.t = now
}

// tokenize is stage 1: the prompt's token IDs (p.IDs), the batch's other prompts' tokens (p.BatchTokens),
// and the prompt-length limit. A request routed on load alone is not tokenized; a Responses request its
// template cannot render is routed on load (the engine, not the gateway, answers it).
func (r *Router) tokenize(m *Model, req Request, body []byte, p *Plan) error {
	switch {
	case req.LoadOnlyReason != "":
		// Not tokenized (embeddings, a Responses request mapping onto no chat): no keys, routed on load.
	case req.Responses:
		ce, ok := m.Encoder.(ChatRequestEncoder)
		if ok && req.ChatRequest != nil {
			if _, ids, err := ce.EncodeChatRequest(req.ChatRequest); err == nil {
				p.IDs = ids
			} else {
				p.Request.LoadOnlyReason = "chat_template"
			}
		} else {
			p.Request.LoadOnlyReason = "chat_template"
		}
	case req.Chat:
		var ids []uint32
		var err error
		if ce, ok := m.Encoder.(ChatRequestEncoder); ok && req.ChatRequest != nil {
			_, ids, err = ce.EncodeChatRequest(req.ChatRequest)
		} else {
			_, ids, err = m.Encoder.EncodeChat(body)
		}
		if err != nil {
			if p.TokenIDsSkip = unrenderable(err); p.TokenIDsSkip == "" {
				return chatError(err)
			}
			ids = nil
		}
		p.IDs = ids
	case req.PromptIsIDs:
		p.IDs = req.PromptIDs
	default:
		p.IDs = m.Encoder.EncodeCompletion(req.PromptText)
	}
	if err := promptTooLong(m, req, len(p.IDs)); err != nil {
		return err
	}
	p.BatchTokens = req.BatchIDTokens
	for _, txt := range req.BatchTexts {
		p.BatchTokens = satAdd(p.BatchTokens, int64(len(m.Encoder.EncodeCompletion(txt))))
	}
	return nil
}

// candidates fills p.Candidates with the model's healthy endpoints (each rank with its own load, or an
// even share) and returns their IDs; ErrNoHealthy when there are none.
func (r *Router) candidates(m *Model, p *Plan) ([]kvstore.EndpointID, error) {
	current := m.Current()
	ids := make([]kvstore.EndpointID, 0, len(current))
	for _, e := range current {
		ld := r.o.Endpoints.Load(e.EngineID())
		if !ld.Healthy {
			continue
		}
		ld = ld.Rank(e.Rank, e.Ranks) // a rank's own load (vLLM's engine="<rank>" series), else an even share
		p.Candidates = append(p.Candidates, Candidate{Endpoint: e, Load: ld})
		ids = append(ids, kvstore.EndpointID(e.ID))
	}
	if len(p.Candidates) == 0 {
		return nil, fmt.Errorf("route: model %s: %w", m.Name, ErrNoHealthy)
	}
	return ids, nil
}

// readInFlight reads the in-flight leases of ids: at once in its own goroutine on a remote store, when
// the returned function is called otherwise. The result is nil after an error (the store, not the router,
// reports it).
func (r *Router) readInFlight(ctx context.Context, ids []kvstore.EndpointID) func() map[kvstore.EndpointID]kvstore.Cost {
	read := func() map[kvstore.EndpointID]kvstore.Cost {
		m, _ := r.o.Reservations.InFlight(ctx, ids)
		kvstore.LeaveRound(ctx)
		return m
	}
	if !r.remote {
		return read
	}
	ch := make(chan map[kvstore.EndpointID]kvstore.Cost, 1)
	go func() { ch <- read() }()
	return func() map[kvstore.EndpointID]kvstore.Cost { return <-ch }
}

// match is stage 3: each candidate's matched GPU and CPU blocks from the index. Without an index, or when
// the match fails, the plan is load-only (the store, kvstore.Guarded, reports and handles its own failure).
func (r *Router) match(ctx context.Context, m *Model, p *Plan) {
	p.LoadOnly = r.o.Index == nil
	if p.LoadOnly || len(p.Keys) == 0 {
		return
	}
	ms, err := r.o.Index.Match(ctx, m.Name, p.Keys)
	if err != nil {
		p.LoadOnly = true
		if !errors.Is(err, kvstore.ErrUnavailable) && ctx.Err() == nil {
			r.o.Log.Warn("index match failed: routing on load only", slog.String("error", err.Error()))
		}
	}
	for _, mt := range ms {
		for i := range p.Candidates {
			if p.Candidates[i].ID == string(mt.Endpoint) {
				p.Candidates[i].GPUBlocks, p.Candidates[i].CPUBlocks = mt.GPUBlocks, mt.CPUBlocks
			}
		}
	}
}

// snapshot is stage 4: the policy's view of the request and of each candidate (matches dropped on a
// load-only plan), with the in-flight counts infl.
func (r *Router) snapshot(m *Model, lora string, p *Plan, infl map[kvstore.EndpointID]kvstore.Cost) {
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
}

// rank is stage 5: the policy's ranking, or the native three-tier one on a load-only plan (counted as a
// store_down fallback when there is an index) or without a ranker.
func (r *Router) rank(ctx context.Context, m *Model, p *Plan) {
	if p.LoadOnly || r.o.Ranker == nil {
		out := plugins.RankThreeTier(r.o.NativeConfig, &p.Snapshot, make([]uint32, 0, len(p.Candidates)))
		p.Ranking = make([]int, len(out))
		for i, v := range out {
			p.Ranking[i] = int(v)
		}
		p.Info = RankInfo{Policy: "three-tier@native"}
		if p.LoadOnly && r.o.Index != nil {
			p.Info.Fallback = "store_down"
			r.loadOnlyN.Add(1)
			r.o.Metrics.LoadOnlyRoutes.WithLabelValues(m.Name).Inc()
		}
		return
	}
	p.Snapshot.Request.RankLimit = rankLimit
	p.Ranking, p.Info = r.o.Ranker.Rank(ctx, m.Name, &p.Snapshot)
	p.Snapshot.Request.RankLimit = 0
	if p.Info.Fallback != "" {
		r.o.Metrics.PolicyFallbacks.WithLabelValues(m.Name, p.Info.Fallback).Inc()
	}
}

// rankLimit is how many ranked endpoints the router asks the policy for first: Reserve tries them in one
// reservation and asks for the whole ranking only when none of them can take the request (then it
// reserves over the whole ranking, those first, in one step). gateway/RATIONALE.md "Why the router asks
// for the first eight ranked endpoints".
const rankLimit = 8

// CompleteRanking replaces a partial ranking (Info.Partial) by the policy's whole ranking of the same
// snapshot, which begins with the same entries; with a complete one it does nothing. Reserve calls it
// when it needs more than the first entries; the admin explain view calls it to show every endpoint.
func (r *Router) CompleteRanking(ctx context.Context, p *Plan) {
	if !p.Info.Partial {
		return
	}
	p.Snapshot.Request.RankLimit = 0
	p.Ranking, p.Info = r.o.Ranker.Rank(ctx, p.Model.Name, &p.Snapshot)
	if p.Info.Fallback != "" {
		r.o.Metrics.PolicyFallbacks.WithLabelValues(p.Model.Name, p.Info.Fallback).Inc()
	}
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

// Claim is a reservation taken for a Plan: one request's lease on one endpoint, until Release.
type Claim struct {
	// Index is the chosen candidate's index in Plan.Candidates.
	Index int

	ep kvstore.EndpointID

	mu       sync.Mutex
	lease    kvstore.Lease
	released bool
}

// Endpoint returns the claimed endpoint.
func (c *Claim) Endpoint() kvstore.EndpointID { return c.ep }

// Lease returns the claim's current lease (as its last renewal returned it).
func (c *Claim) Lease() kvstore.Lease {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lease
}

// Cost returns what the plan's request reserves: one request per sequence the engine runs — prompts ×
// max(n, best_of), a batch of P prompts being P sequence groups — and every prompt's tokens plus each
// sequence's expected output tokens (a prompt's sequences share its KV blocks; each generates its own
// output). Saturating: never negative.
func (r *Router) Cost(p *Plan) kvstore.Cost {
	out := p.Request.MaxTokens
	if out < 0 {
		out = r.o.DefaultOutputTokens
	}
	seqs := satMul(int64(max(p.Request.Prompts, 1)), max(p.Request.N, p.Request.BestOf, 1))
	return kvstore.Cost{Requests: seqs, Tokens: satAdd(satAdd(int64(len(p.IDs)), p.BatchTokens), satMul(seqs, out))}
}

// Reserve leases the first ranked candidate with capacity, skipping candidates in exclude (indices of
// Plan.Candidates that already failed). While every candidate is full (kvstore.ErrNoCapacity) it waits and
// retries until the model's queue timeout, then returns ErrQueueTimeout; ctx ending (client gone) returns
// ctx's error. Other errors: ErrNoHealthy (every candidate excluded), *RequestError (a batch no endpoint
// can run), ErrStoreRefused (the reservations refused otherwise). Whether the store is up, down or
// recovering is the reservations' business (kvstore.Guarded).
func (r *Router) Reserve(ctx context.Context, p *Plan, exclude map[int]bool) (*Claim, error) {
	start := r.o.Now()
	defer func() {
		r.stage[metrics.StageReserve].Observe(r.o.Now().Sub(start).Seconds())
	}()
	if p.Info.Partial {
		cl, done, err := r.reservePrefix(ctx, p, exclude)
		if done {
			return cl, err
		}
		r.CompleteRanking(ctx, p)
	}
	ranked, order := rankedCandidates(p, exclude, len(p.Ranking),
		make([]kvstore.Candidate, 0, len(p.Ranking)), make([]int, 0, len(p.Ranking)))
	if len(ranked) == 0 {
		return nil, fmt.Errorf("route: model %s: every candidate failed: %w", p.Model.Name, ErrNoHealthy)
	}
	cost := r.Cost(p)
	if cost.Requests > 1 {
		// A batch (or n / best_of) needing more sequences than an endpoint runs at once could never be
		// reserved there: only endpoints that can take it stay; none is a clear 400, not a 429 later.
		fit, fitOrder, most := ranked[:0:0], order[:0:0], int64(0)
		for k, c := range ranked {
			if c.Limits.MaxRequests <= 0 || cost.Requests <= c.Limits.MaxRequests {
				fit, fitOrder = append(fit, c), append(fitOrder, order[k])
			}
			most = max(most, c.Limits.MaxRequests)
		}
		if len(fit) == 0 {
			return nil, &RequestError{Param: "prompt", Code: "batch_too_large", Message: fmt.Sprintf(
				"The request needs %d sequences (prompts × max(n, best_of)); the endpoints serving `%s` run at most %d at once.",
				cost.Requests, p.Request.Model, most)}
		}
		ranked, order = fit, fitOrder
	}
	// A request larger than an endpoint's whole token limit would never fit: it claims the whole limit
	// (the engine itself rejects prompts over its context length).
	for _, c := range ranked {
		if c.Limits.MaxTokens > 0 && cost.Tokens > c.Limits.MaxTokens {
			cost.Tokens = c.Limits.MaxTokens
		}
	}
	deadline := start.Add(p.Model.QueueTimeout)
	wait := 5 * time.Millisecond
	queued := false
	defer func() {
		if queued {
			r.o.Metrics.Queued.WithLabelValues(p.Model.Name).Dec()
		}
	}()
	for {
		l, err := r.o.Reservations.Reserve(ctx, ranked, cost, r.o.LeaseTTL)
		if err == nil {
			return r.claimOf(l, ranked, order), nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !errors.Is(err, kvstore.ErrNoCapacity) { // refused otherwise: waiting will not help
			return nil, fmt.Errorf("%w: %w", ErrStoreRefused, err)
		}
		r.o.Metrics.ReservationRefusals.WithLabelValues(p.Model.Name).Inc()
		now := r.o.Now()
		if !now.Before(deadline) {
			r.o.Metrics.QueueTimeouts.WithLabelValues(p.Model.Name).Inc()
			return nil, fmt.Errorf("route: model %s: %w", p.Model.Name, ErrQueueTimeout)
		}
		if !queued {
			queued = true
			r.o.Metrics.Queued.WithLabelValues(p.Model.Name).Inc()
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

// reservePrefix is Reserve's first attempt on a partial ranking: one reservation over its entries (those
// not in exclude). done says the attempt answered (a claim, or an error waiting would not change); when
// none of them has room now, or the attempt could differ from one over the whole ranking, done is false
// and Reserve goes on with the whole ranking. A reservation takes the first candidate in order with
// room, so the prefix's claim is the one the whole ranking would have given at that moment. The two
// things Reserve decides over the whole candidate set, the batch fit (more than one sequence) and the
// token clamp (a request larger than some endpoint's token limit), make the prefix attempt step aside.
func (r *Router) reservePrefix(ctx context.Context, p *Plan, exclude map[int]bool) (*Claim, bool, error) {
	cost := r.Cost(p)
	if cost.Requests > 1 {
		return nil, false, nil
	}
	for i, c := range p.Candidates {
		if !exclude[i] && c.Limits.MaxTokens > 0 && cost.Tokens > c.Limits.MaxTokens {
			return nil, false, nil
		}
	}
	var buf [rankLimit]kvstore.Candidate
	var ord [rankLimit]int
	ranked, order := rankedCandidates(p, exclude, rankLimit, buf[:0], ord[:0])
	if len(ranked) == 0 {
		return nil, false, nil
	}
	l, err := r.o.Reservations.Reserve(ctx, ranked, cost, r.o.LeaseTTL)
	switch {
	case err == nil:
		return r.claimOf(l, ranked, order), true, nil
	case ctx.Err() != nil:
		return nil, true, ctx.Err()
	case !errors.Is(err, kvstore.ErrNoCapacity):
		return nil, true, fmt.Errorf("%w: %w", ErrStoreRefused, err)
	}
	return nil, false, nil
}

// rankedCandidates appends to ranked and order the store candidates of p.Ranking's entries not in exclude,
// best first, at most limit of them, with each one's position in p.Candidates.
func rankedCandidates(p *Plan, exclude map[int]bool, limit int, ranked []kvstore.Candidate, order []int) ([]kvstore.Candidate, []int) {
	for _, i := range p.Ranking {
		if len(ranked) == limit {
			break
		}
		if exclude[i] {
			continue
		}
		c := p.Candidates[i]
		ranked = append(ranked, kvstore.Candidate{Endpoint: kvstore.EndpointID(c.ID), Limits: c.Limits})
		order = append(order, i)
	}
	return ranked, order
}

// claimOf is the claim of lease l, granted over ranked (order: their positions in p.Candidates), counted
// in flight.
func (r *Router) claimOf(l kvstore.Lease, ranked []kvstore.Candidate, order []int) *Claim {
	cl := &Claim{Index: order[0], ep: l.Endpoint, lease: l}
	for k, c := range ranked {
		if c.Endpoint == l.Endpoint {
			cl.Index = order[k]
			break
		}
	}
	r.o.Metrics.InFlight.WithLabelValues(string(cl.ep)).Inc()
	return cl
}

// Record counts the routed prompt and matched tokens and writes the plan's block keys as a speculative entry
// for the claimed endpoint, in the background (best effort: the index reports its own failures; while the
// store is down kvstore.Guarded refuses at once). Not for a load-only plan. For an endpoint with Events, only
// the keys past its matched GPU prefix are written.
func (r *Router) Record(ctx context.Context, p *Plan, c *Claim) {
	cd := p.Candidates[c.Index]
	bs := p.Model.BlockSize
	tc := r.tokenCounters(p.Model.Name)
	tc.prompt.Add(float64(len(p.IDs)))
	tc.gpu.Add(float64(cd.GPUBlocks * bs))
	tc.cpu.Add(float64(cd.CPUBlocks * bs))
	if r.o.Index == nil || len(p.Keys) == 0 || p.LoadOnly {
		return
	}
	// On a remote store off the request's critical path: the entry only has to beat the engine's own
	// events (tens of ms), and it must be written even if the request ends first.
	model, ep, keys := p.Model.Name, c.ep, p.Keys
	if cd.Events && cd.GPUBlocks > 0 {
		// The matched GPU prefix is in the index already, confirmed by the engine's events or speculative
		// from a request whose events are on their way: re-recording it would only cost a shard lock per
		// block (most of a warm request's blocks). Endpoints without events keep refreshing it, since
		// speculative entries are all the index knows of them. RATIONALE.md "Per-request overhead".
		matched := keys[:min(cd.GPUBlocks, len(keys))]
		if r.o.HitTTL > 0 && r.hitDue(ep, matched[len(matched)-1]) {
			go func() {
				rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				_ = r.o.Index.Record(rctx, model, ep, matched, r.o.HitTTL)
			}()
		}
		keys = keys[len(matched):]
		if len(keys) == 0 {
			return
		}
	}
	record := func(ctx context.Context) {
		start := r.o.Now()
		_ = r.o.Index.Record(ctx, model, ep, keys, r.o.SpeculativeTTL)
		r.stage[metrics.StageRecord].Observe(r.o.Now().Sub(start).Seconds())
	}
	if !r.remote && len(keys) <= inlineRecordMax {
		// An in-process index records a few blocks in about a microsecond and cannot hang; a goroutine
		// for it woke a thread per request (10-20 µs of CPU on a 2-core VM: gateway/RATIONALE.md "Where
		// a short request's CPU goes").
		record(context.Background())
		return
	}
	go func() {
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		record(rctx)
	}()
}

// inlineRecordMax is the most blocks (4k tokens at 16 per block) an in-process index's speculative Record
// writes on the request's goroutine; longer ones, and every Record on a remote store, run in their own.
const inlineRecordMax = 256

// hitKey names one routed prefix on one endpoint (by its last matched block key).
type hitKey struct {
	ep  kvstore.EndpointID
	key kvstore.BlockKey
}

// maxHits bounds the routed-hit refresh memory; beyond it the map starts over (a few extra refreshes).
const maxHits = 1 << 16

// hitDue says whether the routed hit on (ep, last) should refresh its prefix now, and notes it.
func (r *Router) hitDue(ep kvstore.EndpointID, last kvstore.BlockKey) bool {
	now := r.o.Now()
	k := hitKey{ep, last}
	r.hitMu.Lock()
	defer r.hitMu.Unlock()
	if t, ok := r.hits[k]; ok && now.Sub(t) < r.o.HitTTL/4 {
		return false
	}
	if r.hits == nil || len(r.hits) >= maxHits {
		r.hits = map[hitKey]time.Time{}
	}
	r.hits[k] = now
	return true
}

// tokenCounters are one model's children of kvgate_prompt_tokens_total and kvgate_matched_tokens_total.
type tokenCounters struct{ prompt, gpu, cpu prometheus.Counter }

// tokenCounters returns model's counters, resolving them on first use.
func (r *Router) tokenCounters(model string) *tokenCounters {
	if v, ok := r.tokens.Load(model); ok {
		return v.(*tokenCounters)
	}
	m := r.o.Metrics
	tc := &tokenCounters{prompt: m.PromptTokens.WithLabelValues(model),
		gpu: m.MatchedTokens.WithLabelValues(model, "GPU"), cpu: m.MatchedTokens.WithLabelValues(model, "CPU")}
	v, _ := r.tokens.LoadOrStore(model, tc)
	return v.(*tokenCounters)
}

// Renew extends c's lease by the lease TTL; the server calls it every TTL/3 on long responses. What a
// renewal means while the store is down, or when the store lost the lease, is the reservations' business
// (kvstore.Guarded keeps the claim and registers it again).
func (r *Router) Renew(ctx context.Context, c *Claim) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return nil
	}
	l, err := r.o.Reservations.Renew(ctx, c.lease, r.o.LeaseTTL)
	if err != nil {
		return err
	}
	c.lease = l
	return nil
}

// LeaseTTL returns the configured lease lifetime.
func (r *Router) LeaseTTL() time.Duration { return r.o.LeaseTTL }

// Release ends c (idempotent).
func (r *Router) Release(c *Claim) {
	c.mu.Lock()
	if c.released {
		c.mu.Unlock()
		return
	}
	c.released = true
	l := c.lease
	c.mu.Unlock()
	r.o.Metrics.InFlight.WithLabelValues(string(c.ep)).Dec()
	if err := r.o.Reservations.Release(context.Background(), l); err != nil {
		r.o.Log.Warn("lease release failed", slog.String("endpoint_id", string(c.ep)), slog.String("error", err.Error()))
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
