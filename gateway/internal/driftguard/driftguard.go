// Package driftguard proves, per endpoint, that the token IDs the gateway sends on chat are the engine's
// own: the gateway's render + tokenize of a chat must equal what the engine's /tokenize answers for the
// same body (vLLM: POST /tokenize; SGLang: POST /v1/tokenize; enginesim: its --api's). Only a verified
// endpoint gets token IDs (Allow); every other one gets original bodies, which are always correct.
//
// Life of an endpoint: unverified → (it is healthy and one round of probe chats matches) → verified →
// (a probe round or a sampled real request mismatches) → unverified, needing ResumeMatches consecutive
// matching checks → verified. Becoming unhealthy makes it unverified again (an engine restart may bring
// another template), and the next healthy probe round decides. Probe chats (system prompt, multi-turn,
// tool call) run for each model when the endpoint becomes healthy and every RecheckInterval while it is
// unverified; one in Every chat requests sent with token IDs is checked the same way in the background.
//
// A mismatch: kvgate_token_ids_mismatch_total{model,endpoint} counts it, one warning log line gives the
// first differing position and both token windows (not repeated while re-probes of a still-drifted
// endpoint find the same difference), and Status (in /readyz) shows it. Checks that fail for
// another reason (engine unreachable, /tokenize not served) count as kvgate_token_ids_checks_total
// {result="error"} and leave the endpoint unverified without counting a mismatch.
package driftguard

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Engine kinds (config.EngineSim, EngineVLLM, EngineSGLang); repeated here so the package depends on no
// other gateway package.
const (
	engineSGLang = "sglang"
)

// TokenizePath returns the engine's chat tokenize route for an engine kind.
func TokenizePath(engine string) string {
	if engine == engineSGLang {
		return "/v1/tokenize"
	}
	return "/tokenize"
}

// Encoder renders and tokenizes a chat body as the gateway does (gateway/internal/model.Model.EncodeChat).
type Encoder interface {
	EncodeChat(body []byte) (prompt string, ids []uint32, err error)
}

// Endpoint is one guarded endpoint.
type Endpoint struct {
	ID     string // endpoint ID
	Model  string // served model name (the "model" sent to /tokenize)
	Engine string // engine kind: decides the /tokenize route
	URL    string // engine base URL
}

// Options configure a Guard.
type Options struct {
	// Endpoints are the endpoints whose chat requests may carry token IDs.
	Endpoints []Endpoint
	// Encoders are the gateway's encoders by model name.
	Encoders map[string]Encoder
	// HTTP posts to the engines' /tokenize.
	HTTP *http.Client
	// Healthy reports an endpoint's current health (gateway/internal/endpoints.Set.Load(id).Healthy).
	Healthy func(id string) bool
	// Every checks one in this many chat requests sent with token IDs (0: none).
	Every int
	// ResumeMatches is the number of consecutive matching checks after a mismatch before Allow is true
	// again (at least 1).
	ResumeMatches int
	// RecheckInterval is how often an unverified healthy endpoint is probed (default 1s); Run also looks at
	// health this often, at most every 100ms.
	RecheckInterval time.Duration
	// Timeout bounds one /tokenize call (default 5s).
	Timeout time.Duration
	// Registry receives the metrics (nil: not registered).
	Registry prometheus.Registerer
	// Log receives the mismatch line and state changes (nil: slog.Default()).
	Log *slog.Logger
}

// Mismatch describes the last check whose tokens differed.
type Mismatch struct {
	Model string `json:"model"`
	// Check names what was compared: "probe:<name>" or "sample".
	Check string `json:"check"`
	// Position is the index of the first differing token (the shorter length when one is a prefix).
	Position int `json:"position"`
	// GatewayTokens and EngineTokens are the two token windows around Position (up to 8 before, 8 after).
	GatewayTokens []uint32 `json:"gateway_tokens"`
	EngineTokens  []uint32 `json:"engine_tokens"`
	// GatewayLen and EngineLen are the full lengths.
	GatewayLen int       `json:"gateway_len"`
	EngineLen  int       `json:"engine_len"`
	At         time.Time `json:"at"`
}

// Status is one endpoint's guard state, as /readyz shows it.
type Status struct {
	// Verified is true while the endpoint gets token IDs.
	Verified bool `json:"verified"`
	// Streak is the consecutive matching checks since the last mismatch or error; Needed how many make it
	// verified.
	Streak int `json:"streak"`
	Needed int `json:"needed"`
	// Mismatches counts mismatches since start.
	Mismatches int `json:"mismatches"`
	// Checks counts completed checks (probe rounds and samples) since start.
	Checks int `json:"checks"`
	// LastMismatch is the latest mismatch (nil: none).
	LastMismatch *Mismatch `json:"last_mismatch,omitempty"`
	// LastError is the latest check that could not compare ("" after a successful check).
	LastError string `json:"last_error,omitempty"`
	// WithdrawnBy names the check that last took token IDs away from the endpoint while it was verified
	// ("sample" or "probe:<name>"; "" if it never was): later probe rounds of the unverified endpoint
	// replace LastMismatch, this stays.
	WithdrawnBy string `json:"withdrawn_by,omitempty"`
}

type state struct {
	ep       Endpoint
	enc      Encoder
	allow    atomic.Bool
	seen     atomic.Uint64 // chat requests sent with token IDs (sampling)
	mu       sync.Mutex
	st       Status
	healthy  bool
	lastTry  time.Time
	checking bool // a probe round is running
}

// Guard is the drift guard of one gateway. Safe for concurrent use.
type Guard struct {
	o      Options
	eps    map[string]*state
	order  []*state
	log    *slog.Logger
	mism   *prometheus.CounterVec
	skip   *prometheus.CounterVec
	checks *prometheus.CounterVec
	wg     sync.WaitGroup
	// stopMu orders background checks (wg.Go under RLock) before Run's final wg.Wait (stopped under Lock).
	stopMu  sync.RWMutex
	stopped bool
}

// New returns a Guard; every endpoint starts unverified. Call Run (or CheckAll) to verify them.
func New(o Options) *Guard {
	if o.ResumeMatches < 1 {
		o.ResumeMatches = 1
	}
	if o.RecheckInterval <= 0 {
		o.RecheckInterval = time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.HTTP == nil {
		o.HTTP = http.DefaultClient
	}
	g := &Guard{o: o, eps: map[string]*state{}, log: o.Log}
	if g.log == nil {
		g.log = slog.Default()
	}
	g.mism = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_token_ids_mismatch_total",
		Help: "Checks where the gateway's chat token IDs differed from the engine's /tokenize (the endpoint then gets original bodies)."},
		[]string{"model", "endpoint"})
	g.skip = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_token_ids_skipped_total",
		Help: "Chat requests sent with their original body to an endpoint that takes token IDs, by reason (client_set, multimodal, continue_final_message, unverified, invalid_kv_transfer_params)."},
		[]string{"endpoint", "reason"})
	g.checks = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_token_ids_checks_total",
		Help: "Drift-guard checks (probe rounds and sampled requests) by result: match, mismatch, error."},
		[]string{"endpoint", "result"})
	for _, e := range o.Endpoints {
		s := &state{ep: e, enc: o.Encoders[e.Model]}
		s.st.Needed = 1
		g.eps[e.ID] = s
		g.order = append(g.order, s)
		g.mism.WithLabelValues(e.Model, e.ID)
		for _, r := range []string{"match", "mismatch", "error"} {
			g.checks.WithLabelValues(e.ID, r)
		}
	}
	if o.Registry != nil {
		o.Registry.MustRegister(g.mism, g.skip, g.checks, &verifiedCollector{g})
	}
	return g
}

// Allow reports whether chat requests to id may carry token IDs now (false for an unknown endpoint).
func (g *Guard) Allow(id string) bool {
	s, ok := g.eps[id]
	return ok && s.allow.Load()
}

// Skipped counts one chat request sent to id with its original body for reason.
func (g *Guard) Skipped(id, reason string) { g.skip.WithLabelValues(id, reason).Inc() }

// Sent records a chat request sent to id with token IDs ids, rendered from the client's body; one in
// Options.Every is checked against the engine in the background (the request is not delayed).
func (g *Guard) Sent(id string, body []byte, ids []uint32) {
	s, ok := g.eps[id]
	if !ok || g.o.Every <= 0 {
		return
	}
	if s.seen.Add(1)%uint64(g.o.Every) != 0 {
		return
	}
	g.stopMu.RLock()
	defer g.stopMu.RUnlock()
	if g.stopped {
		return
	}
	g.wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), g.o.Timeout)
		defer cancel()
		engine, err := g.tokenize(ctx, s.ep, body)
		g.record(s, "sample", ids, engine, err)
	})
}

// Status returns every endpoint's state by endpoint ID.
func (g *Guard) Status() map[string]Status {
	out := make(map[string]Status, len(g.order))
	for _, s := range g.order {
		s.mu.Lock()
		st := s.st
		s.mu.Unlock()
		st.Verified = s.allow.Load()
		out[s.ep.ID] = st
	}
	return out
}

// CheckAll runs one probe round on every healthy endpoint that is not verified, concurrently, and returns
// when they are done or ctx ends (start-up: the first requests can then carry token IDs).
func (g *Guard) CheckAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, s := range g.order {
		if g.o.Healthy != nil && !g.o.Healthy(s.ep.ID) {
			continue
		}
		s.mu.Lock()
		s.healthy = true
		s.mu.Unlock()
		wg.Go(func() { g.probeRound(ctx, s) })
	}
	wg.Wait()
}

// Run watches health and re-probes unverified endpoints until ctx ends; then it waits for background
// checks to finish.
func (g *Guard) Run(ctx context.Context) {
	tick := min(max(g.o.RecheckInterval/4, 20*time.Millisecond), 100*time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	defer func() {
		g.stopMu.Lock()
		g.stopped = true
		g.stopMu.Unlock()
		g.wg.Wait()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		for _, s := range g.order {
			healthy := g.o.Healthy == nil || g.o.Healthy(s.ep.ID)
			s.mu.Lock()
			was := s.healthy
			s.healthy = healthy
			due := false
			switch {
			case !healthy:
				if was {
					g.setAllow(s, false, "endpoint unhealthy")
					s.st.Streak, s.st.Needed = 0, 1
				}
			case !was:
				due = true // became healthy: probe now
			case !s.allow.Load() && now.Sub(s.lastTry) >= g.o.RecheckInterval:
				due = true
			}
			if due && !s.checking {
				s.checking, s.lastTry = true, now
				g.wg.Go(func() {
					rctx, cancel := context.WithTimeout(ctx, g.o.Timeout*4)
					defer cancel()
					g.probeRound(rctx, s)
				})
			}
			s.mu.Unlock()
		}
	}
}

// probeRound checks every probe chat for s's model; all matching counts as one matching check.
func (g *Guard) probeRound(ctx context.Context, s *state) {
	defer func() {
		s.mu.Lock()
		s.checking = false
		s.lastTry = time.Now()
		s.mu.Unlock()
	}()
	if s.enc == nil {
		g.record(s, "probe", nil, nil, fmt.Errorf("no encoder for model %s", s.ep.Model))
		return
	}
	compared := 0
	for _, p := range probes {
		body := p.body(s.ep.Model)
		_, ids, err := s.enc.EncodeChat(body)
		if err != nil {
			continue // the model's template cannot render this probe (e.g. no tool support): not applicable
		}
		engine, err := g.tokenize(ctx, s.ep, body)
		if err != nil || !equal(ids, engine) {
			g.record(s, "probe:"+p.name, ids, engine, err)
			return
		}
		compared++
	}
	if compared == 0 {
		g.record(s, "probe", nil, nil, fmt.Errorf("the model's template renders none of the probe chats"))
		return
	}
	g.record(s, "probe", nil, nil, nil) // a matching round
}

// record applies one check's result: err (could not compare), or the comparison of gw with engine (a nil
// gw with a nil err is a match already established by the caller).
func (g *Guard) record(s *state, check string, gw, engine []uint32, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.Checks++
	if s.allow.Load() && (err != nil || (gw != nil && !equal(gw, engine))) {
		s.st.WithdrawnBy = check
	}
	switch {
	case err != nil:
		g.checks.WithLabelValues(s.ep.ID, "error").Inc()
		if s.st.LastError == "" {
			g.log.Warn("token-ID check failed: endpoint gets original chat bodies until a check succeeds",
				slog.String("endpoint_id", s.ep.ID), slog.String("model", s.ep.Model), slog.String("check", check),
				slog.String("error", err.Error()))
		}
		s.st.LastError = err.Error()
		s.st.Streak = 0
		g.setAllow(s, false, "check failed")
	case gw != nil && !equal(gw, engine):
		g.checks.WithLabelValues(s.ep.ID, "mismatch").Inc()
		g.mism.WithLabelValues(s.ep.Model, s.ep.ID).Inc()
		m := diff(gw, engine)
		m.Model, m.Check, m.At = s.ep.Model, check, time.Now()
		// One line per mismatch the operator has not seen yet: an endpoint that stays drifted is re-probed
		// every RecheckInterval and would otherwise log the same line each time (the metric counts them).
		repeat := !s.allow.Load() && s.st.LastMismatch != nil && sameMismatch(*s.st.LastMismatch, m)
		s.st.LastMismatch, s.st.LastError = &m, ""
		s.st.Mismatches++
		s.st.Streak, s.st.Needed = 0, g.o.ResumeMatches
		if repeat {
			g.setAllow(s, false, "")
			return
		}
		g.log.Warn("token-ID mismatch: the engine tokenizes chat differently from the gateway; endpoint gets original chat bodies",
			slog.String("endpoint_id", s.ep.ID), slog.String("model", s.ep.Model), slog.String("check", check),
			slog.Int("position", m.Position), slog.Any("gateway_tokens", m.GatewayTokens), slog.Any("engine_tokens", m.EngineTokens),
			slog.Int("gateway_len", m.GatewayLen), slog.Int("engine_len", m.EngineLen),
			slog.Int("resume_after_matches", g.o.ResumeMatches))
		g.setAllow(s, false, "")
	default:
		g.checks.WithLabelValues(s.ep.ID, "match").Inc()
		s.st.LastError = ""
		if s.allow.Load() {
			return
		}
		s.st.Streak++
		if s.st.Streak >= s.st.Needed {
			g.setAllow(s, true, "")
		}
	}
}

// setAllow changes s's verdict (s.mu held), logging a change when why is set or the endpoint is verified.
func (g *Guard) setAllow(s *state, v bool, why string) {
	if s.allow.Swap(v) == v {
		return
	}
	if v {
		g.log.Info("token IDs verified: endpoint gets chat token IDs", slog.String("endpoint_id", s.ep.ID),
			slog.String("model", s.ep.Model), slog.Int("matches", s.st.Streak))
	} else if why != "" {
		g.log.Info("endpoint gets original chat bodies", slog.String("endpoint_id", s.ep.ID), slog.String("reason", why))
	}
}

// tokenize asks the engine's /tokenize for the tokens of a chat body.
func (g *Guard) tokenize(ctx context.Context, ep Endpoint, body []byte) ([]uint32, error) {
	ctx, cancel := context.WithTimeout(ctx, g.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(ep.URL, "/")+TokenizePath(ep.Engine), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := g.o.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %d: %.200s", TokenizePath(ep.Engine), resp.StatusCode, b)
	}
	var out struct {
		Tokens json.RawMessage `json:"tokens"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("%s: %w", TokenizePath(ep.Engine), err)
	}
	var ids []uint32
	if err := json.Unmarshal(out.Tokens, &ids); err != nil {
		return nil, fmt.Errorf("%s: tokens: %w", TokenizePath(ep.Engine), err)
	}
	if ids == nil {
		ids = []uint32{}
	}
	return ids, nil
}

// sameMismatch reports whether two mismatches are the same finding (check, position, windows, lengths).
func sameMismatch(a, b Mismatch) bool {
	return a.Check == b.Check && a.Position == b.Position && a.GatewayLen == b.GatewayLen && a.EngineLen == b.EngineLen &&
		slices.Equal(a.GatewayTokens, b.GatewayTokens) && slices.Equal(a.EngineTokens, b.EngineTokens)
}

func equal(a, b []uint32) bool {
	if len(a) != len(b) || a == nil || b == nil {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// diff locates the first differing token and cuts both windows around it.
func diff(gw, engine []uint32) Mismatch {
	p := 0
	for p < len(gw) && p < len(engine) && gw[p] == engine[p] {
		p++
	}
	win := func(s []uint32) []uint32 {
		lo, hi := max(0, p-8), min(len(s), p+8)
		if lo >= hi {
			return []uint32{}
		}
		return append([]uint32(nil), s[lo:hi]...)
	}
	return Mismatch{Position: p, GatewayTokens: win(gw), EngineTokens: win(engine), GatewayLen: len(gw), EngineLen: len(engine)}
}

// verifiedCollector exports kvgate_token_ids_verified{endpoint} (1 while the endpoint gets token IDs).
type verifiedCollector struct{ g *Guard }

var descVerified = prometheus.NewDesc("kvgate_token_ids_verified",
	"1 while the endpoint's chat requests carry token IDs (the drift guard verified its engine's tokens).", []string{"endpoint"}, nil)

// Describe implements prometheus.Collector.
func (c *verifiedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descVerified }

// Collect implements prometheus.Collector.
func (c *verifiedCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.g.order {
		v := 0.0
		if s.allow.Load() {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descVerified, prometheus.GaugeValue, v, s.ep.ID)
	}
}
