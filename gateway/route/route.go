// Package route is the gateway's routing pipeline for one request: tokenize (the model's chat template and
// tokenizer) → block keys → index match → snapshot (engine load from gateway/endpoints plus in-flight leases)
// → policy ranking → atomic reservation over the ranking (queued up to the model's queue_timeout) →
// speculative index entry for the chosen endpoint. Forwarding is the server's job; it calls Release.
//
// Every claim the router hands out is also counted in its own ledger, whatever store holds its lease. When the
// shared store fails, the router keeps serving: it routes on load alone (no index) and admits a request on
// an endpoint only while its own in-flight there stays within the store-down cap (at most
// store_down_limit_share of the limit, and at most what it held when the store went down plus its share of
// the capacity then free), reports itself degraded (StoreStatus) and probes the store until it answers. On
// recovery it re-registers every claim still running on the store (a store that restarted empty is detected
// by its epoch, see Epocher), then keeps to the store-down cap for a grace period while the other gateways do
// the same, and only then routes on the shared counters alone. gateway/RATIONALE.md explains the rule.
package route

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/gateway/chattemplate"
	"github.com/kvgate/kvgate/gateway/endpoints"
	"github.com/kvgate/kvgate/gateway/metrics"
	"github.com/kvgate/kvgate/gateway/openai"
	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/kvevents"
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

// ChatRequestEncoder is an Encoder that also encodes a chat body already decoded by openai.ParseRequest
// (openai.Request.Chat), so Plan does not scan the body a second time; gateway/model.Model implements it.
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

// Epocher reports the shared store's epoch: an opaque value that changes when the store loses its data (a
// Redis restart without persistence). A lease taken in one epoch is never renewed or released in another (a
// restarted Redis hands out the same lease IDs again).
type Epocher interface {
	Epoch(ctx context.Context) (string, error)
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
	// whose health and scraped load it shares ("" when the endpoint has one rank: ID itself), Rank its
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
	Endpoints    []Endpoint
	// MaxPromptTokens rejects longer prompts with 400 before routing (0: no limit).
	MaxPromptTokens int
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
	StoreProbeInterval  time.Duration        // default 500ms; also the epoch check and in-flight refresh period
	Epocher             Epocher              // nil: the store's epoch is not checked (memory)
	// RecoveryGrace is how long after the store returns this router still keeps to the store-down caps
	// (besides the store's own limit check), so gateways that notice the store later have re-registered their
	// claims before anyone routes on the shared counters alone. Default max(3 × StoreProbeInterval, 1 s).
	RecoveryGrace time.Duration
	NativeConfig  threetier.Config // config of the load-only fallback ranking
	// StoreTimeout bounds every store call on a request's path (match, in-flight read, reserve, renew,
	// release): a hung store fails the call after this long and the router switches to store-down routing.
	// Default 200ms.
	StoreTimeout time.Duration
	// HitTTL, if set, is how long a routed hit keeps the matched prefix counted on its endpoint (a Record of
	// the matched blocks, at most once per HitTTL/4 per endpoint and prefix): vLLM announces nothing on a
	// cache hit, so without it a hot prefix whose entries became unconfirmed (kvstore.Demoter) would age out
	// although every request keeps it warm on the engine. The gateway sets it to index_unconfirmed_ttl.
	HitTTL time.Duration
	// OnsetHold, if set, keeps this gateway within what it held when the store failed, for up to OnsetHold
	// or until the engine's load has been scraped after the failure (NoteLoad); the store-down caps then use
	// that scrape (gateway/route ledger.go, kvstore/RATIONALE.md "Index under faults"). The gateway sets it to
	// 2 × scrape_interval + 100 ms.
	OnsetHold time.Duration
}

// Router runs the pipeline. Safe for concurrent use; create with New.
type Router struct {
	o      Options
	hasher kvstore.Hasher
	led    *ledger

	// modeMu orders store-down reservations (read lock) against recovery (write lock), so no claim taken
	// while the store is down escapes re-registration.
	modeMu sync.RWMutex
	// graceMu serializes reservations during the recovery grace (store reserve + ledger cap, as one step).
	graceMu    sync.Mutex
	graceUntil atomic.Int64 // unix nanoseconds
	epochMu    sync.Mutex
	epoch      string // the store epoch the store claims were taken in ("" when unknown or no Epocher)
	pendingMu  sync.Mutex
	pending    []pendingRelease

	seq atomic.Uint64
	// stage holds the latency observer of each stage, resolved once (WithLabelValues hashes and locks).
	stage map[string]prometheus.Observer
	// tokens caches each model's prompt and matched-token counters (Record runs on every request).
	tokens sync.Map // model name -> *tokenCounters

	hitMu sync.Mutex
	hits  map[hitKey]time.Time // last routed-hit refresh per (endpoint, last matched block)

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
	if o.StoreTimeout <= 0 {
		o.StoreTimeout = 200 * time.Millisecond
	}
	if o.StoreDownLimitShare <= 0 || o.StoreDownLimitShare > 1 {
		o.StoreDownLimitShare = 1
	}
	if o.NativeConfig == (threetier.Config{}) {
		o.NativeConfig = threetier.DefaultConfig()
	}
	if o.RecoveryGrace <= 0 {
		o.RecoveryGrace = max(3*o.StoreProbeInterval, time.Second)
	}
	led := newLedger(o.StoreDownLimitShare)
	led.hold, led.margin = o.OnsetHold, 50*time.Millisecond
	r := &Router{o: o, hasher: kvstore.Hasher{Seed: o.Seed}, led: led,
		stop: make(chan struct{}), stage: map[string]prometheus.Observer{}}
	for _, st := range []string{metrics.StageTokenize, metrics.StageKeys, metrics.StageMatch, metrics.StageSnapshot,
		metrics.StageRank, metrics.StageReserve, metrics.StageRecord} {
		r.stage[st] = o.Metrics.Stage.WithLabelValues(st)
	}
	if o.Reservations != nil && o.Pinger != nil {
		if o.Epocher != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			ep, err := o.Epocher.Epoch(ctx)
			cancel()
			if err != nil {
				r.storeFailed("epoch", err)
			} else {
				r.epoch = ep
			}
		}
		go r.watchStore()
	}
	return r
}

// NoteLoad records a scrape of endpoint id's engine load (running plus waiting requests, taken at), for the
// store-down caps at the onset of an outage (Options.OnsetHold). Safe from any goroutine.
func (r *Router) NoteLoad(id string, running, waiting float64, at time.Time) {
	r.led.noteEngine(kvstore.EndpointID(id), int64(math.Ceil(running+waiting)), at)
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
	IDs []uint32
	// BatchTokens are the prompt tokens of a completions batch's other prompts (0 for a single prompt).
	BatchTokens int64
	Keys        []kvstore.BlockKey
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
	// TokenIDsSkip, when set, says the chat could not be tokenized exactly, so it is routed on load alone
	// (no IDs) and must go with its original body: upstream.SkipMultimodal (a content part the template
	// cannot render, e.g. media on a template that takes string content) or upstream.SkipContinueFinal (a
	// continue_final_message the template cannot express). The engine answers such a request itself.
	TokenIDsSkip string
}

// ErrNoHealthy is wrapped by Plan's *openai.Error 503.
var errNoHealthy = errors.New("no healthy endpoint")

// StoreStatus is the store's state for /readyz.
type StoreStatus struct {
	Down bool `json:"down"`
	// Since is when it was found down (zero when up).
	Since time.Time `json:"since,omitzero"`
	// LastError is the last store error seen.
	LastError string `json:"last_error,omitempty"`
	// LoadOnlyRequests counts requests routed without the store since start.
	LoadOnlyRequests uint64 `json:"load_only_requests"`
	// Recovering says the store is back but this gateway still keeps to its store-down caps (the recovery
	// grace).
	Recovering bool `json:"recovering"`
	// OwnInFlight counts the requests this gateway has in flight (its ledger).
	OwnInFlight int `json:"own_inflight"`
	// LocalInFlight counts those of them with no lease on the current store (taken while it was down, or not
	// yet re-registered after it came back).
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
	s.Recovering = !s.Down && r.inGrace()
	s.OwnInFlight, s.LocalInFlight = r.led.counts(r.currentEpoch())
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
	case req.LoadOnlyReason != "":
		// Not tokenized (embeddings, a Responses request mapping onto no chat): no keys, routed on load.
	case req.API == openai.Responses && req.Chat != nil:
		// The chat the Responses request maps onto. A render failure routes it on load: the engine, not the
		// gateway, answers a request its template cannot take.
		if ce, ok := m.Encoder.(ChatRequestEncoder); ok {
			if _, ids, err := ce.EncodeChatRequest(req.Chat); err == nil {
				p.IDs = ids
			} else {
				req.LoadOnlyReason = "chat_template"
			}
		} else {
			req.LoadOnlyReason = "chat_template"
		}
	case req.API == openai.Chat:
		var ids []uint32
		var err error
		if ce, ok := m.Encoder.(ChatRequestEncoder); ok && req.Chat != nil {
			_, ids, err = ce.EncodeChatRequest(req.Chat)
		} else {
			_, ids, err = m.Encoder.EncodeChat(body)
		}
		if err != nil {
			if p.TokenIDsSkip = unrenderable(err); p.TokenIDsSkip == "" {
				return nil, chatError(err)
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
		return nil, err
	}
	p.BatchTokens = req.BatchIDTokens
	for _, txt := range req.BatchTexts {
		p.BatchTokens = satAdd(p.BatchTokens, int64(len(m.Encoder.EncodeCompletion(txt))))
	}
	t := stage(metrics.StageTokenize, t0)
	// 2. block keys
	p.Keys = r.hasher.Keys(p.IDs, m.BlockSize, kvstore.ExtraKeys{LoRA: lora, CacheSalt: req.CacheSalt})
	t = stage(metrics.StageKeys, t)
	// candidates: healthy endpoints
	ids := make([]kvstore.EndpointID, 0, len(m.Endpoints))
	for _, e := range m.Endpoints {
		ld := r.o.Endpoints.Load(e.EngineID())
		if !ld.Healthy {
			continue
		}
		if e.Ranks > 1 { // a rank's share of the engine's load (its metrics sum the ranks)
			ld.Waiting, ld.Running = ld.Waiting/float64(e.Ranks), ld.Running/float64(e.Ranks)
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
		sctx, cancel := context.WithTimeout(ctx, r.o.StoreTimeout)
		defer cancel()
		m, err := r.o.Reservations.InFlight(sctx, ids)
		return inflightResult{m, err}
	}
	if r.o.Pinger != nil {
		inflCh = make(chan inflightResult, 1)
		go func() { inflCh <- readInflight() }()
	}
	p.LoadOnly = r.o.Index == nil || !r.storeUp()
	if !p.LoadOnly && len(p.Keys) > 0 {
		sctx, cancel := context.WithTimeout(ctx, r.o.StoreTimeout)
		ms, err := r.o.Index.Match(sctx, m.Name, p.Keys)
		cancel()
		if err != nil && ctx.Err() == nil {
			r.storeError("match", err)
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
		r.storeError("inflight", ir.err)
		infl = nil
	}
	if infl != nil && r.storeUp() && !r.inGrace() {
		r.led.observe(ids, infl)
	}
	if infl == nil || !r.storeUp() {
		infl = r.led.ownCounts(ids)
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

// Claim is a reservation taken for a Plan: one request's count on one endpoint, held in the router's ledger
// until Release, with a lease on the shared store when the store was reachable (or once it is again).
type Claim struct {
	// Index is the chosen candidate's index in Plan.Candidates.
	Index int

	ep   kvstore.EndpointID
	cost kvstore.Cost

	mu       sync.Mutex
	lease    kvstore.Lease // the store lease when onStore
	onStore  bool
	epoch    string // the store epoch lease was taken in
	released bool
}

// Endpoint returns the claimed endpoint.
func (c *Claim) Endpoint() kvstore.EndpointID { return c.ep }

// Lease returns the claim's current store lease (zero while it has none: taken while the store was down).
// Re-registration after a store outage replaces it.
func (c *Claim) Lease() kvstore.Lease {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.onStore {
		return kvstore.Lease{}
	}
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
// Plan.Candidates that already failed). While every candidate is full it waits and retries until the
// model's queue timeout, then returns *openai.Error 429; ctx ending (client gone) returns ctx's error.
//
// With the store up the store's atomic reservation decides; with it down, the ledger's store-down cap; during
// the recovery grace both must agree.
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
			return nil, openai.Errorf(400, "invalid_request_error", "prompt", "batch_too_large",
				"The request needs %d sequences (prompts × max(n, best_of)); the endpoints serving `%s` run at most %d at once.",
				cost.Requests, p.Request.Model, most)
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
	for {
		cl, err := r.reserveOnce(ctx, ranked, cost)
		if err == nil {
			idx := order[0]
			for k, c := range ranked {
				if c.Endpoint == cl.ep {
					idx = order[k]
					break
				}
			}
			cl.Index = idx
			r.o.Metrics.InFlight.WithLabelValues(string(cl.ep)).Inc()
			return cl, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !errors.Is(err, kvstore.ErrNoCapacity) { // refused by a reachable store: waiting will not help
			return nil, fmt.Errorf("%w: %w", errStoreRefused(), err)
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

// reserveOnce makes one reservation attempt: a claim counted in the ledger, or kvstore.ErrNoCapacity.
func (r *Router) reserveOnce(ctx context.Context, ranked []kvstore.Candidate, cost kvstore.Cost) (*Claim, error) {
	if r.o.Reservations == nil {
		// No shared store: this gateway's share of every limit, as while a store is down.
		if cl, _ := r.led.reserveLocal(ranked, cost); cl != nil {
			return cl, nil
		}
		return nil, kvstore.ErrNoCapacity
	}
	for {
		// The read lock keeps recovery (write lock) from running between the mode check and the claim's
		// counting: every claim is either on the current store or seen by recovery.
		r.modeMu.RLock()
		if !r.storeUp() {
			cl, _ := r.led.reserveLocal(ranked, cost)
			r.modeMu.RUnlock()
			if cl == nil {
				return nil, kvstore.ErrNoCapacity
			}
			return cl, nil
		}
		grace := r.inGrace()
		if grace {
			r.graceMu.Lock()
		}
		cands := ranked
		if grace {
			cands = r.led.admissible(ranked, cost)
		}
		var cl *Claim
		var err error
		if len(cands) == 0 {
			err = kvstore.ErrNoCapacity
		} else {
			var l kvstore.Lease
			sctx, cancel := context.WithTimeout(ctx, r.o.StoreTimeout)
			l, err = r.o.Reservations.Reserve(sctx, cands, cost, r.o.LeaseTTL)
			cancel()
			if err == nil {
				cl = &Claim{ep: l.Endpoint, cost: cost, lease: l, onStore: true, epoch: r.currentEpoch()}
				if !r.led.addGranted(cl, cands, grace, r.storeUp) {
					// The store failed while its grant was on its way: the store-down reservations made
					// since did not see this claim, and it does not fit beside them. Give the lease back
					// and wait like any request over the cap.
					r.dropLease(l, cl.epoch)
					cl, err = nil, kvstore.ErrNoCapacity
				}
			}
		}
		if grace {
			r.graceMu.Unlock()
		}
		r.modeMu.RUnlock()
		if err != nil && !errors.Is(err, kvstore.ErrNoCapacity) && ctx.Err() == nil && r.storeError("reserve", err) {
			continue // the store is unreachable: once more, within the store-down cap
		}
		return cl, err
	}
}

// Record counts the routed prompt and matched tokens and writes the plan's block keys as a speculative entry
// for the claimed endpoint, in the background (best effort; a store error marks the store down). For an
// endpoint with Events, only the keys past its matched GPU prefix are written.
func (r *Router) Record(ctx context.Context, p *Plan, c *Claim) {
	cd := p.Candidates[c.Index]
	bs := p.Model.BlockSize
	tc := r.tokenCounters(p.Model.Name)
	tc.prompt.Add(float64(len(p.IDs)))
	tc.gpu.Add(float64(cd.GPUBlocks * bs))
	tc.cpu.Add(float64(cd.CPUBlocks * bs))
	if r.o.Index == nil || len(p.Keys) == 0 || !r.storeUp() {
		return
	}
	// Off the request's critical path: the entry only has to beat the engine's own events (tens of ms),
	// and it must be written even if the request ends first.
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
				if err := r.o.Index.Record(rctx, model, ep, matched, r.o.HitTTL); err != nil {
					r.storeError("record", err)
				}
			}()
		}
		keys = keys[len(matched):]
		if len(keys) == 0 {
			return
		}
	}
	go func() {
		start := r.o.Now()
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := r.o.Index.Record(rctx, model, ep, keys, r.o.SpeculativeTTL); err != nil {
			r.storeError("record", err)
		}
		r.stage[metrics.StageRecord].Observe(r.o.Now().Sub(start).Seconds())
	}()
}

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

// Renew extends c's store lease by the lease TTL; the server calls it every TTL/3 on long responses. A claim
// without a live store lease (taken while the store was down, or its store restarted) needs no renewal: the
// ledger counts it until Release, and recovery re-registers it. A lease the store no longer knows while the
// request still runs is registered again, without the limit check, so the shared count is not lost.
func (r *Router) Renew(ctx context.Context, c *Claim) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released || !c.onStore || !r.storeUp() || c.epoch != r.currentEpoch() {
		return nil
	}
	sctx, cancel := context.WithTimeout(ctx, r.o.StoreTimeout)
	l, err := r.o.Reservations.Renew(sctx, c.lease, r.o.LeaseTTL)
	cancel()
	if err == nil {
		c.lease = l
		return nil
	}
	if errors.Is(err, kvstore.ErrLeaseNotLive) {
		r.o.Log.Warn("lease lost on the store while its request runs: registering it again",
			slog.String("endpoint_id", string(c.ep)), slog.String("lease", c.lease.ID))
		return r.registerLocked(ctx, c, r.currentEpoch())
	}
	if ctx.Err() == nil {
		r.storeError("renew", err)
	}
	return err
}

// LeaseTTL returns the configured lease lifetime.
func (r *Router) LeaseTTL() time.Duration { return r.o.LeaseTTL }

// Release ends c (idempotent): the ledger stops counting it and its store lease, if it has one in the current
// store epoch, is released. A release the store cannot take now is retried when the store returns in the same
// epoch (otherwise the lease expires on its own).
func (r *Router) Release(c *Claim) {
	c.mu.Lock()
	if c.released {
		c.mu.Unlock()
		return
	}
	c.released = true
	onStore, epoch, l := c.onStore, c.epoch, c.lease
	c.mu.Unlock()
	if !r.led.remove(c) {
		return
	}
	r.o.Metrics.InFlight.WithLabelValues(string(c.ep)).Dec()
	if !onStore || r.o.Reservations == nil {
		return
	}
	if !r.storeUp() {
		r.deferRelease(l, epoch)
		return
	}
	if epoch != r.currentEpoch() {
		return // the store restarted: this lease ID may name another gateway's lease now
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.o.StoreTimeout)
	defer cancel()
	if err := r.o.Reservations.Release(ctx, l); err != nil {
		if r.storeError("release", err) {
			r.deferRelease(l, epoch) // retried when the store answers again
		}
	}
}

// dropLease gives back a store lease that no claim holds: at once while the store is up, else when it
// answers again in the same epoch (deferRelease).
func (r *Router) dropLease(l kvstore.Lease, epoch string) {
	if !r.storeUp() {
		r.deferRelease(l, epoch)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.o.StoreTimeout)
	defer cancel()
	if err := r.o.Reservations.Release(ctx, l); err != nil && r.storeError("release", err) {
		r.deferRelease(l, epoch)
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
