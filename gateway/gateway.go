package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/gateway/internal/endpoints"
	"github.com/kvgate/kvgate/gateway/internal/metrics"
	"github.com/kvgate/kvgate/gateway/internal/route"
	"github.com/kvgate/kvgate/gateway/internal/server"
	"github.com/kvgate/kvgate/gateway/internal/tlsconf"
	"github.com/kvgate/kvgate/gateway/internal/tracing"
	"github.com/kvgate/kvgate/gateway/internal/upstream"
	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/kvevents"
	"github.com/kvgate/kvgate/plugins"
	"github.com/kvgate/kvgate/sdk"
	"github.com/kvgate/kvgate/tpu"
)

// Options start a Gateway.
type Options struct {
	// Config is the parsed configuration; every model must list its endpoints (serve fills in simulated
	// ones before calling Start).
	Config *config.Config
	// Secrets are read from the environment by the caller (config.Config.Secrets).
	Secrets config.Secrets
	// LoadEncoder loads a model's tokenizer directory (gateway/internal/model.Load in production).
	LoadEncoder func(dir string) (route.Encoder, error)
	// Listener, if set, is served instead of listening on Config.Listen.
	Listener net.Listener
	// Log receives JSON logs; nil = slog.Default().
	Log *slog.Logger
	// PolicyCacheDir, if set, is wazero's on-disk compilation cache: the 2.6 MB built-in policy then
	// compiles once per machine instead of once per start (about 1 s).
	PolicyCacheDir string
	// ConfigPath, if set, is the file Config was read from: it is watched (config_watch_interval) and
	// Reload re-reads it; endpoint changes apply at run time (fleetendpoints.go).
	ConfigPath string
}

// Gateway is one running gateway: its server, router, store, policy host and event ingesters.
type Gateway struct {
	cfg    *config.Config
	log    *slog.Logger
	ln     net.Listener
	srv    *server.Server
	router *route.Router
	host   *plugins.Host
	store  *kvstore.Store
	// guard is the store's failure handling (ledger, store-down caps, recovery, epoch) over its index and
	// reservations: the router's store.
	guard     *kvstore.Guarded
	index     kvstore.Index
	res       kvstore.Reservations
	holder    string // this gateway's lease holder ID
	eps       *endpoints.Set
	metrics   *metrics.Metrics
	ingMu     sync.Mutex
	ingesters map[string]*kvevents.Ingester // endpoint → running ingester (this gateway holds its lease)
	// leaseRounds counts runIngestion's finished lease rounds (acquire, renew or fence check) by endpoint.
	// Only tests read it: "still nobody else ingests" waits for a round begun after its action, not a sleep.
	leaseRounds map[string]uint64
	models      map[string]server.ServedModel
	// policySync makes the policy host follow the store's fleet state and carries the admin API's policy
	// operations to it (memory or Redis).
	policySync *policySync
	// policyUnconfirmed is set while the gateway, started without its store, serves the config's policies
	// without having read what the store says is active (/readyz policy_unconfirmed).
	policyUnconfirmed atomic.Bool
	// upHTTP is the upstream client's HTTP client (scrapes and /tokenize checks share its pool).
	upHTTP *http.Client
	// tokens forwards chat token IDs and runs their drift guard.
	tokens *tokenIDs
	// tpu is the TPU slice allocator on the gateway's store (admin /admin/v1/tpu/...).
	tpu *tpu.Allocator
	// tpuCopy is the read-only copy of the store's TPU slices (Redis only), for requarantineTPUSlices.
	tpuCopy tpuSlices
	// epSync runs the store's run-time endpoint set here (fleetendpoints.go); configPath is the watched file.
	epSync     *endpointSync
	configPath string
	// runCtx lives until Close (run-time endpoints' ingestion runs under it).
	runCtx context.Context

	cancel context.CancelFunc
	wg     sync.WaitGroup
	// traces is the OpenTelemetry tracer provider (nil: tracing off).
	traces *tracing.Provider
	// ingCtx is the parent of every ingester's context; ingCancel stops event ingestion alone (drain hands
	// the ingestion leases over); ingWG waits for it.
	ingCtx    context.Context
	ingCancel context.CancelFunc
	ingWG     sync.WaitGroup
	closing   atomic.Bool
	// stopped receives one error if the server stopped serving while the gateway was not being closed.
	stopped chan error
	mln     net.Listener // metrics_listen, nil when unset
	msrv    *http.Server
	// up is the upstream client (engine forwarding, scrapes and /tokenize checks).
	up *upstream.Client
	// guardRef is guard once startGuard built it (the endpoint scrapes feed it the engines' loads).
	guardRef atomic.Pointer[kvstore.Guarded]
	// started are the components Start started (the one that failed included), in start order.
	started []component
}

// Start wires and starts a gateway: store, policy host (config policies activated), endpoint probes (one
// synchronous round before serving), event ingesters and the HTTP server. ctx bounds the start-up only.
//
// The gateway is a list of components (Gateway.components) started in order. When one fails, it and the
// ones before it are closed in reverse order (each close is safe on a component that started only in
// part), so a failed Start leaves no goroutine, listener or store connection behind
// (TestFailedStartLeaksNothing).
func Start(ctx context.Context, o Options) (*Gateway, error) {
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	if o.LoadEncoder == nil {
		return nil, errors.New("gateway: Options.LoadEncoder is required")
	}
	g := &Gateway{cfg: o.Config, log: log, metrics: metrics.New(), models: map[string]server.ServedModel{},
		ingesters: map[string]*kvevents.Ingester{}}
	runCtx, cancel := context.WithCancel(context.Background())
	g.cancel, g.runCtx, g.configPath = cancel, runCtx, o.ConfigPath
	for _, c := range g.components(o) {
		g.started = append(g.started, c)
		if err := c.start(ctx); err != nil {
			g.Close(context.Background())
			return nil, err
		}
	}
	log.Info("gateway listening", slog.String("addr", g.ln.Addr().String()), slog.Int("models", len(g.cfg.Models)),
		slog.Int("endpoints", len(g.eps.Endpoints())), slog.String("store", g.cfg.Store.Kind))
	return g, nil
}

// component is one part of a running gateway. start builds it (its goroutines run on g.wg under
// g.runCtx); close releases what start built, also when start failed part way (Caddy's rule: cleanup is
// safe after a failed provision). A nil close has nothing of its own to release.
type component struct {
	name  string
	start func(ctx context.Context) error
	close func(ctx context.Context) error
}

// components lists the gateway's parts in start order; Close runs their close in reverse order. The
// background goroutines (policy sync, scrapes, token-ID checks, ingestion) stop in the "background"
// component's close: after the servers stop, before the guard, host and store they use close. The closes
// of those three (and of the endpoints and ingestion) stop them first too, for a start that failed before
// "background" (stopBackground is idempotent).
func (g *Gateway) components(o Options) []component {
	afterBackground := func(f func(ctx context.Context) error) func(ctx context.Context) error {
		return func(ctx context.Context) error { g.stopBackground(); return f(ctx) }
	}
	none := func(context.Context) error { return nil }
	return []component{
		{name: "store", start: g.startStore(o), close: afterBackground(g.closeStore)},
		{name: "policies", start: g.startPolicies(o), close: afterBackground(g.closePolicies)},
		{name: "endpoints", start: g.startEndpoints(o), close: afterBackground(none)},
		{name: "ingestion", start: g.startIngestion, close: afterBackground(none)},
		{name: "guard", start: g.startGuard, close: afterBackground(g.closeGuard)},
		{name: "router", start: g.startRouter},
		{name: "background", start: none, close: func(context.Context) error { g.stopBackground(); return nil }},
		{name: "tracing", start: g.startTracing, close: g.closeTracing},
		{name: "server", start: g.startServer(o), close: g.closeServer},
		{name: "metrics server", start: g.startMetricsServer, close: g.closeMetricsServer},
	}
}

// stopBackground cancels g.runCtx and waits for the goroutines under it, the ingesters included (they
// close and release their leases as runIngestion returns). Safe to call more than once.
func (g *Gateway) stopBackground() {
	g.cancel()
	g.wg.Wait()
	g.ingWG.Wait()
}

// startStore opens the store and the TPU allocator on it. A Redis that does not answer at start does not
// stop the gateway: it serves the config's policy on load-only routing (degraded) and joins the fleet when
// Redis answers (storeWait).
func (g *Gateway) startStore(o Options) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		cfg := g.cfg
		var storeTLS *tls.Config
		if t := cfg.Store.TLS; t != nil {
			var err error
			if storeTLS, err = tlsconf.Client(t.CAFile, t.CertFile, t.KeyFile, t.ServerName); err != nil {
				return fmt.Errorf("gateway: store.tls: %w", err)
			}
		}
		st, err := kvstore.OpenStore(ctx, kvstore.StoreConfig{Kind: cfg.Store.Kind, Addrs: cfg.Store.Addrs,
			Cluster: cfg.Store.Cluster, DB: cfg.Store.DB, Username: cfg.Store.Username, Password: o.Secrets.StorePassword,
			TLS: storeTLS, AllowUnreachable: true, IndexLayout: cfg.Store.IndexLayout, Prefix: cfg.Store.Prefix,
			ReservationLayout: cfg.Store.ReservationLayout, MaxKeys: cfg.IndexMaxEntries, MaxKeysPerEndpoint: cfg.IndexPerEndpointCap()})
		if err != nil {
			return fmt.Errorf("gateway: store: %w", err)
		}
		if st.StartErr != nil {
			g.log.Warn("store unreachable at start: serving the config's policies on load-only routing until it answers",
				slog.String("error", st.StartErr.Error()))
			g.policyUnconfirmed.Store(true)
		}
		g.store = st
		g.index, g.res = st.Index, st.Reservations
		if st.Redis != nil {
			if g.tpu, err = tpu.NewRedis(st.Redis, tpu.RedisOptions{Prefix: cfg.Store.Prefix}); err != nil {
				return fmt.Errorf("gateway: tpu allocator: %w", err)
			}
		} else {
			g.tpu = tpu.NewMemory(nil)
		}
		g.metrics.Registry.MustRegister(g.tpu.Metrics())
		if mi, ok := st.Index.(*kvstore.MemoryIndex); ok {
			g.metrics.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvgate_index_entries",
				Help: "Entries (model, block key) in the in-memory KV index."}, func() float64 { return float64(mi.Len()) }))
		}
		return nil
	}
}

func (g *Gateway) closeStore(context.Context) error {
	if g.store == nil {
		return nil
	}
	return g.store.Close()
}

// startPolicies starts the policy host and its sync with the store: the store's fleet state is the one
// truth (policysync.go); the config's policy is each model's rollback floor. A version the host disables
// (a runaway or failing policy) has been rolled back locally; storing that rollback makes every gateway
// on the store follow and frees the version for unloading.
func (g *Gateway) startPolicies(o Options) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		var syncRef atomic.Pointer[policySync]
		onDisable := func(v plugins.Version, models []string) {
			ps := syncRef.Load()
			if ps == nil {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			ps.rolledBackDisabled(ctx, v, models)
		}
		host, err := plugins.New(ctx, plugins.Options{Logger: g.log, CacheDir: o.PolicyCacheDir, OnDisable: onDisable})
		if err != nil {
			return fmt.Errorf("gateway: policy host: %w", err)
		}
		g.host = host
		// The host's own counters (calls, swaps, replaced instances, fuel refills, interrupted calls) beside the gateway's.
		if err := host.RegisterMetrics(g.metrics.Registry); err != nil {
			return fmt.Errorf("gateway: policy host metrics: %w", err)
		}
		g.holder = holderID()
		ps := newPolicySync(g)
		g.policySync = ps
		syncRef.Store(ps)
		g.metrics.Registry.MustRegister(servingCollector{ps})
		if err := ps.start(ctx); err != nil {
			return err
		}
		if g.policyUnconfirmed.Load() {
			g.wg.Go(func() { g.storeWait(g.runCtx, ps) })
		}
		g.wg.Go(func() { ps.run(g.runCtx) })
		if g.store.Redis != nil {
			g.wg.Go(func() { g.copyTPUSlices(g.runCtx) })
		}
		return nil
	}
}

func (g *Gateway) closePolicies(ctx context.Context) error {
	if g.host == nil {
		return nil
	}
	return g.host.Close(ctx)
}

// startEndpoints builds the served models and the endpoint set, probes every endpoint once, starts the
// scrapes and the chat token-ID checks.
func (g *Gateway) startEndpoints(o Options) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		cfg := g.cfg
		var upTLS *tls.Config
		if t := cfg.UpstreamTLS; t != nil {
			var err error
			if upTLS, err = tlsconf.Client(t.CAFile, t.CertFile, t.KeyFile, t.ServerName); err != nil {
				return fmt.Errorf("gateway: upstream_tls: %w", err)
			}
		}
		g.up = upstream.NewWithOptions(upstream.Options{ConnectTimeout: cfg.UpstreamConnectTimeout,
			FirstByteTimeout: cfg.UpstreamFirstByteTimeout, TotalTimeout: cfg.UpstreamTotalTimeout,
			IdleTimeout: cfg.UpstreamIdleTimeout, ForwardCookies: cfg.ForwardCookies, TLS: upTLS})
		g.upHTTP = g.up.HTTP()
		encoders := map[string]route.Encoder{}
		var all []endpoints.Endpoint
		for i := range cfg.Models {
			m := &cfg.Models[i]
			enc, err := o.LoadEncoder(m.Tokenizer)
			if err != nil {
				return fmt.Errorf("gateway: model %s: tokenizer %s: %w", m.Name, m.Tokenizer, err)
			}
			encoders[m.Name] = enc
			all = append(all, g.serveModel(m, enc)...)
		}
		g.eps = endpoints.NewSet(all, g.up.HTTP(), cfg.ScrapeInterval, g.log)
		g.eps.OnScrape(func(id string, l endpoints.Load) {
			if l.StartTime != 0 {
				g.noteStartTime(id, l.StartTime)
			}
			if gd := g.guardRef.Load(); gd != nil {
				ep, _ := g.eps.Get(id)
				ranks := max(ep.DataParallelSize, 1)
				for r, rid := range route.RankIDs(id, ranks) { // each rank's own load, or an even share
					rl := l.Rank(r, ranks)
					gd.NoteLoad(rid, int64(math.Ceil(rl.Running+rl.Waiting)), l.Scraped)
				}
			}
		})
		probeCtx, pc := context.WithTimeout(ctx, 2*time.Second)
		g.eps.ProbeAll(probeCtx)
		pc()
		g.wg.Go(func() { g.eps.Run(g.runCtx) })
		g.tokens = newTokenIDs(g, cfg, encoders, g.eps)
		checkCtx, cc := context.WithTimeout(ctx, 5*time.Second)
		g.tokens.start(checkCtx, g.runCtx, g)
		cc()
		return nil
	}
}

// serveModel registers model m (and its LoRA adapters) with its encoder and metrics, and returns its
// endpoints for the endpoint set.
func (g *Gateway) serveModel(m *config.Model, enc route.Encoder) []endpoints.Endpoint {
	var all []endpoints.Endpoint
	rm := &route.Model{Name: m.Name, BlockSize: m.BlockSize, QueueTimeout: m.QueueTimeout, Encoder: enc,
		MaxPromptTokens: m.MaxPromptTokens}
	for _, e := range m.Endpoints {
		rm.Endpoints = append(rm.Endpoints, routeEndpoints(e)...)
		all = append(all, endpoints.Endpoint{ID: e.ID, Model: m.Name, Engine: e.Engine, URL: e.URL,
			DataParallelSize: e.Ranks()})
	}
	rm.Live = route.NewEndpointList(rm.Endpoints) // the run-time list (fleetendpoints.go)
	var ids []string
	for _, e := range m.Endpoints {
		ids = append(ids, e.ID)
	}
	var reasons []string
	for _, r := range plugins.FallbackReasons() {
		reasons = append(reasons, r.String())
	}
	g.metrics.InitModel(m.Name, ids, reasons)
	g.models[m.Name] = server.ServedModel{Model: rm}
	for _, l := range m.LoRAAdapters {
		g.models[l] = server.ServedModel{Model: rm, LoRA: l}
	}
	return all
}

// startIngestion checks every endpoint's event configuration and starts following the store's endpoint
// set: event ingestion runs one gateway at a time per endpoint, under a store lease. The configured
// endpoints run (ingestion included) until the store's set, read once now, says otherwise; then the
// gateway follows the store, the file and DNS.
func (g *Gateway) startIngestion(ctx context.Context) error {
	g.ingCtx, g.ingCancel = context.WithCancel(g.runCtx)
	for _, m := range g.cfg.Models {
		for _, e := range m.Endpoints {
			if e.KVEvents == "" {
				continue
			}
			if _, err := kvevents.NewIngester(g.ingesterConfig(m, e)); err != nil {
				return fmt.Errorf("gateway: endpoint %s events: %w", e.ID, err)
			}
		}
	}
	g.registerIngestMetrics()
	return g.startEndpointSync(ctx)
}

// startGuard wraps the store in its failure handling (kvstore.Guarded): the router only sees a store that
// answers, refuses, or is unavailable.
func (g *Gateway) startGuard(context.Context) error {
	cfg, st := g.cfg, g.store
	var remote kvstore.Remote
	if st.Epoch != nil {
		remote = st.Epoch
	}
	g.guard = kvstore.NewGuarded(kvstore.GuardConfig{Reservations: st.Reservations, Index: st.Index, Remote: remote,
		DownLimitShare: cfg.StoreDownLimitShare, StrictOnTimeout: cfg.StoreDownStrict, Timeout: cfg.StoreTimeout,
		OnsetHold: 2*cfg.ScrapeInterval + 100*time.Millisecond, Log: g.log,
		Endpoints: func() []kvstore.EndpointID {
			var ids []kvstore.EndpointID
			for _, e := range g.eps.Endpoints() {
				ids = append(ids, route.RankIDs(e.ID, e.DataParallelSize)...)
			}
			return ids
		},
		OnError: func(op string, _ error, _ bool) { g.metrics.StoreErrors.WithLabelValues(op).Inc() },
		OnDown: func(down bool) {
			if down {
				g.metrics.StoreDown.Set(1)
			} else {
				g.metrics.StoreDown.Set(0)
			}
		},
		OnEpochChange: g.storeRestartedEmpty})
	g.guardRef.Store(g.guard)
	if st.Epoch != nil {
		// A standalone Redis that restarted empty is refused on every new connection until the guard has
		// recovered onto it (kvstore.RedisEpoch); a cluster relies on the guard's periodic epoch check.
		st.Epoch.Expect(g.guard.ExpectedEpoch)
	}
	return nil
}

func (g *Gateway) closeGuard(context.Context) error {
	if g.guard != nil {
		g.guard.Close()
	}
	return nil
}

// startRouter builds the routing pipeline over the guarded store and the policy host.
func (g *Gateway) startRouter(context.Context) error {
	cfg := g.cfg
	g.router = route.New(route.Options{Seed: cfg.BlockKeySeed, Index: g.guard, Reservations: g.guard,
		SpeculativeTTL: cfg.SpeculativeTTL, LeaseTTL: cfg.LeaseTTL,
		DefaultOutputTokens: cfg.DefaultOutputTokens, Ranker: hostRanker{g.host}, Endpoints: g.eps,
		Metrics: g.metrics, Log: g.log, HitTTL: cfg.IndexUnconfirmedTTL})
	return nil
}

// startTracing starts the OpenTelemetry tracer provider when the config has tracing.
func (g *Gateway) startTracing(ctx context.Context) error {
	t := g.cfg.Tracing
	if t == nil {
		return nil
	}
	var err error
	if g.traces, err = tracing.New(ctx, tracing.Options{Endpoint: t.Endpoint, SampleRatio: t.SampleRatio,
		ServiceName: t.ServiceName, BatchTimeout: t.BatchTimeout}); err != nil {
		return fmt.Errorf("gateway: tracing: %w", err)
	}
	return nil
}

// closeTracing flushes the last requests' spans, even when ctx (the drain timeout) is already over.
func (g *Gateway) closeTracing(context.Context) error {
	if g.traces == nil {
		return nil
	}
	tctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return g.traces.Shutdown(tctx)
}

// startServer builds the HTTP server and serves on the listener (Options.Listener, or cfg.Listen).
func (g *Gateway) startServer(o Options) func(ctx context.Context) error {
	return func(context.Context) error {
		cfg, log := g.cfg, g.log
		var listenTLS *tls.Config
		if cfg.TLS != nil {
			ts, err := tlsconf.NewServer(cfg.TLS.CertFile, cfg.TLS.KeyFile, log)
			if err != nil {
				return fmt.Errorf("gateway: tls: %w", err)
			}
			listenTLS = ts.Config()
		}
		var tracer trace.Tracer
		if g.traces != nil {
			tracer = g.traces.Tracer()
		}
		g.srv = server.New(server.Options{Config: cfg, Secrets: o.Secrets, Models: g.models, Router: g.router, TLS: listenTLS, Tracer: tracer,
			Upstream: g.up, Endpoints: g.eps, Metrics: g.metrics, Log: log, Admin: g.mountAdmin, Ready: g.readyDetails,
			EngineBody: g.tokens.engineBody, Store: g.guard.Status})
		ln := o.Listener
		if ln == nil {
			var err error
			if ln, err = net.Listen("tcp", cfg.Listen); err != nil {
				return fmt.Errorf("gateway: listen: %w", err)
			}
		}
		g.ln = ln
		g.stopped = make(chan error, 2)
		go func() {
			err := g.srv.Serve(ln)
			if g.closing.Load() {
				return
			}
			if err == nil {
				err = errors.New("the listener was closed")
			}
			// Serving ended without Close: a gateway that no longer accepts must not idle on as a live process.
			log.Error("the server stopped serving; the process should exit", slog.String("error", err.Error()))
			g.stopped <- fmt.Errorf("gateway: stopped serving: %w", err)
		}()
		return nil
	}
}

// closeServer shuts the server down and closes its listener: a Shutdown that comes before Serve has
// registered the listener (a Start that failed right after) would otherwise leave it accepting.
func (g *Gateway) closeServer(ctx context.Context) error {
	if g.srv == nil {
		return nil
	}
	err := g.srv.Shutdown(ctx)
	if g.ln != nil {
		if cerr := g.ln.Close(); cerr != nil && !errors.Is(cerr, net.ErrClosed) && err == nil {
			err = cerr
		}
	}
	return err
}

// startMetricsServer serves /metrics on metrics_listen when set.
func (g *Gateway) startMetricsServer(context.Context) error {
	cfg := g.cfg
	if cfg.MetricsListen == "" {
		return nil
	}
	var err error
	if g.mln, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
		return fmt.Errorf("gateway: metrics_listen: %w", err)
	}
	g.msrv = &http.Server{Handler: g.srv.MetricsHandler(), ReadHeaderTimeout: cfg.ClientHeaderTimeout,
		ReadTimeout: cfg.ClientBodyTimeout, WriteTimeout: cfg.ClientWriteTimeout, IdleTimeout: cfg.ClientIdleTimeout}
	go func() {
		if err := g.msrv.Serve(g.mln); err != nil && !errors.Is(err, http.ErrServerClosed) && !g.closing.Load() {
			g.log.Error("the metrics server stopped serving", slog.String("error", err.Error()))
			g.stopped <- fmt.Errorf("gateway: metrics server stopped: %w", err)
		}
	}()
	return nil
}

func (g *Gateway) closeMetricsServer(context.Context) error {
	if g.msrv != nil {
		g.msrv.Close()
	} else if g.mln != nil {
		g.mln.Close()
	}
	return nil
}

// configPolicy returns the entry the config names for m (its stack's floor): the built-in three-tier, or a
// module already uploaded to the store, loaded here, with the config's JSON config. The name is resolved
// by plugins.ResolveVersion with bare names: "name" is that name's only version, "name@" plus at least 8 hex
// digits (any case) a unique digest prefix; the built-in is a candidate like the stored modules.
func (g *Gateway) configPolicy(ctx context.Context, m config.Model) (kvstore.PolicyEntry, error) {
	name := m.Policy.Name
	builtin := g.host.BuiltinVersion()
	cfg := compactJSON(m.Policy.ConfigJSON())
	if name == config.DefaultPolicyName {
		return kvstore.PolicyEntry{Version: string(builtin), Config: cfg}, nil
	}
	blobs, err := g.store.Blobs.ListBlobs(ctx)
	if err != nil {
		return kvstore.PolicyEntry{}, fmt.Errorf("gateway: model %s: policy %q: list stored policies: %w", m.Name, name, err)
	}
	candidates := []plugins.Version{builtin}
	for _, b := range blobs {
		if plugins.IsVersion(b.Name) {
			candidates = append(candidates, plugins.Version(b.Name))
		}
	}
	v, err := plugins.ResolveVersion(candidates, name, true)
	if err != nil {
		return kvstore.PolicyEntry{}, fmt.Errorf("gateway: model %s: policy: %w (upload it with `kvgate policy upload`, or pin name@sha256)", m.Name, err)
	}
	if v == builtin {
		return kvstore.PolicyEntry{Version: string(builtin), Config: cfg}, nil
	}
	if err := g.policySync.ensureLoaded(ctx, string(v)); err != nil {
		return kvstore.PolicyEntry{}, fmt.Errorf("gateway: model %s: policy %s: %w", m.Name, v, err)
	}
	return kvstore.PolicyEntry{Version: string(v), Config: cfg}, nil
}

// ID is this gateway's ID: its ingestion lease holder name and the key of its serving report.
func (g *Gateway) ID() string { return g.holder }

// Addr is the address the server listens on.
func (g *Gateway) Addr() string { return g.ln.Addr().String() }

// MetricsAddr is the metrics_listen address ("" when unset).
func (g *Gateway) MetricsAddr() string {
	if g.mln == nil {
		return ""
	}
	return g.mln.Addr().String()
}

// Stopped delivers an error when the gateway stopped serving without Close (its listener failed for good):
// the process should exit non-zero so that a supervisor restarts it (`kvgate serve` does).
func (g *Gateway) Stopped() <-chan error { return g.stopped }

// Router returns the routing pipeline (explain and tests).
func (g *Gateway) Router() *route.Router { return g.router }

// Host returns the policy host.
func (g *Gateway) Host() *plugins.Host { return g.host }

// Metrics returns the gateway's metrics.
func (g *Gateway) Metrics() *metrics.Metrics { return g.metrics }

// StoreStatus returns the store's state as its guard sees it (/readyz "store").
func (g *Gateway) StoreStatus() kvstore.GuardStatus { return g.guard.Status() }

// Reservations returns the store's own reservations (the fleet's counters, without this gateway's guard).
func (g *Gateway) Reservations() kvstore.Reservations { return g.res }

// TPU returns the TPU slice allocator on the gateway's store.
func (g *Gateway) TPU() *tpu.Allocator { return g.tpu }

// Index returns the KV index.
func (g *Gateway) Index() kvstore.Index { return g.index }

// IngestStats returns every ingester's stats, sorted by endpoint; a data-parallel endpoint's ranks follow
// it as endpoints "<id>/dp<r>" (their sequences, gaps, replays and resyncs; the endpoint's own entry
// counts its connection and frames).
func (g *Gateway) IngestStats() []kvevents.Stats {
	g.ingMu.Lock()
	defer g.ingMu.Unlock()
	out := make([]kvevents.Stats, 0, len(g.ingesters))
	for _, in := range g.ingesters {
		out = append(out, in.Stats())
		out = append(out, in.RankStats()...)
	}
	slices.SortFunc(out, func(a, b kvevents.Stats) int { return strings.Compare(string(a.Endpoint), string(b.Endpoint)) })
	return out
}

// Close stops serving, cancels in-flight requests, stops probes and ingestion, and closes the policy host.
func (g *Gateway) Close(ctx context.Context) error {
	g.closing.Store(true)
	var errs []error
	for i := len(g.started) - 1; i >= 0; i-- {
		if c := g.started[i]; c.close != nil {
			if err := c.close(ctx); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", c.name, err))
			}
		}
	}
	g.stopBackground() // also when no component started
	return errors.Join(errs...)
}

// hostRanker adapts plugins.Host to route.Ranker.
type hostRanker struct{ h *plugins.Host }

// Rank asks the host and maps its RankInfo (version, fallback reason) to the router's.
func (r hostRanker) Rank(ctx context.Context, model string, s *sdk.Snapshot) ([]int, route.RankInfo) {
	rk, info := r.h.Rank(ctx, model, s)
	ri := route.RankInfo{Policy: string(info.Version), Partial: info.Partial}
	if info.Fallback {
		ri.Fallback = info.Reason.String()
	}
	return rk, ri
}

func (g *Gateway) readyDetails() map[string]any {
	type ing struct {
		Connected  bool    `json:"connected"`
		LagSeconds float64 `json:"lag_seconds"`
		Gaps       uint64  `json:"gaps"`
		Replays    uint64  `json:"replays"`
		Resyncing  bool    `json:"resyncing"`
		Demotions  uint64  `json:"demotions"`
		Restarts   uint64  `json:"engine_restarts"`
		Error      string  `json:"config_error,omitempty"`
	}
	out := map[string]ing{}
	for _, s := range g.IngestStats() {
		out[string(s.Endpoint)] = ing{s.Connected, s.Lag.Seconds(), s.Gaps, s.Replays, s.Resyncing, s.Demotions, s.Restarts, s.ConfigError}
	}
	pools := []string{}
	if g.tpu != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if p, err := g.tpu.Pools(ctx); err == nil && p != nil {
			pools = p
		}
		cancel()
	}
	d := map[string]any{"ingestion": out, "policies": g.policySync.serving(), "token_ids": g.tokens.guard.Status(), "tpu_pools": pools,
		"endpoints": g.epSync.ready()}
	if g.policyUnconfirmed.Load() {
		d["policy_unconfirmed"] = true
	}
	return d
}

// storeWait, for a gateway started while its store was unreachable, pings the store every second until it
// answers, then reads the fleet's policy state from it (policySync.reconcile) and clears policy_unconfirmed.
// Routing and ingestion join by themselves: the router probes the store back up, ingesters take leases.
func (g *Gateway) storeWait(ctx context.Context, ps *policySync) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := g.store.Ping(pctx)
		if err == nil {
			ps.reconcile(pctx)
		}
		cancel()
		if err == nil {
			g.policyUnconfirmed.Store(false)
			g.log.Info("store reachable: fleet policy state read")
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// registerIngestMetrics exposes event lag, gaps and replays per endpoint from the ingesters' stats.
func (g *Gateway) registerIngestMetrics() {
	g.metrics.Registry.MustRegister(&ingestCollector{g: g})
}

var (
	descLag = prometheus.NewDesc("kvgate_event_lag_seconds", "Receive time minus batch timestamp of the last applied KV-event batch.", []string{"endpoint"}, nil)
	descGap = prometheus.NewDesc("kvgate_event_gaps_total", "KV-event sequence gaps.", []string{"endpoint"}, nil)
	descRep = prometheus.NewDesc("kvgate_event_replays_total", "Replays that closed a KV-event gap.", []string{"endpoint"}, nil)
	descRF  = prometheus.NewDesc("kvgate_event_replay_failures_total", "Replays that failed (endpoint cleared).", []string{"endpoint"}, nil)
	descEv  = prometheus.NewDesc("kvgate_events_total", "KV events applied.", []string{"endpoint"}, nil)
	descCon = prometheus.NewDesc("kvgate_event_connected", "1 while the KV-event subscriber is connected.", []string{"endpoint"}, nil)
	// What ingestion rejected or repaired (issue #11 item 7).
	descDecErr   = prometheus.NewDesc("kvgate_event_decode_errors_total", "KV-event batches that did not decode (re-fetched through replay when configured).", []string{"endpoint"}, nil)
	descBadFrame = prometheus.NewDesc("kvgate_event_bad_frames_total", "ZMQ messages that are not [topic, seq(8 bytes), payload].", []string{"endpoint"}, nil)
	descOrphan   = prometheus.NewDesc("kvgate_event_orphans_total", "BlockStored events whose parent block is unknown (not indexed).", []string{"endpoint"}, nil)
	descBSErr    = prometheus.NewDesc("kvgate_event_block_size_errors_total", "BlockStored events whose block size differs from the model's (not indexed).", []string{"endpoint"}, nil)
	descBadTS    = prometheus.NewDesc("kvgate_event_bad_timestamps_total", "KV-event batches whose timestamp is not a believable time (lag not updated).", []string{"endpoint"}, nil)
	descDemote   = prometheus.NewDesc("kvgate_event_demotions_total", "Times an endpoint's index entries became unconfirmed (takeover past the replay buffer, unrepaired gap).", []string{"endpoint"}, nil)
	descRestart  = prometheus.NewDesc("kvgate_event_engine_restarts_total", "Engine restarts seen (sequence back to 0, or a new process start time).", []string{"endpoint"}, nil)
	descRecov    = prometheus.NewDesc("kvgate_event_recovered_batches_total", "Undecodable KV-event batches recovered through replay.", []string{"endpoint"}, nil)
	descIdxErr   = prometheus.NewDesc("kvgate_event_index_errors_total", "Failed or refused index writes of the endpoint's ingestion.", []string{"endpoint"}, nil)
	descResync   = prometheus.NewDesc("kvgate_event_resyncs_total", "Rebuilds of an endpoint's index entries after a failed index write.", []string{"endpoint"}, nil)
	descHashEv   = prometheus.NewDesc("kvgate_event_hash_evictions_total", "Engine hashes evicted from the ingester's map at index_max_engine_hashes_per_endpoint (their blocks removed from the index).", []string{"endpoint"}, nil)
	descCfgErr   = prometheus.NewDesc("kvgate_event_config_error", "1 while the endpoint's KV events disagree with the configuration (see /readyz).", []string{"endpoint"}, nil)
)

type ingestCollector struct{ g *Gateway }

// Describe implements prometheus.Collector.
func (c *ingestCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLag, descGap, descRep, descRF, descEv, descCon, descDecErr, descBadFrame,
		descOrphan, descBSErr, descBadTS, descDemote, descRestart, descRecov, descCfgErr, descIdxErr, descResync, descHashEv} {
		ch <- d
	}
}

// Collect implements prometheus.Collector from the running ingesters' stats.
func (c *ingestCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.g.IngestStats() {
		ep := string(s.Endpoint)
		conn := 0.0
		if s.Connected {
			conn = 1
		}
		ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, s.Lag.Seconds(), ep)
		ch <- prometheus.MustNewConstMetric(descGap, prometheus.CounterValue, float64(s.Gaps), ep)
		ch <- prometheus.MustNewConstMetric(descRep, prometheus.CounterValue, float64(s.Replays), ep)
		ch <- prometheus.MustNewConstMetric(descRF, prometheus.CounterValue, float64(s.ReplayFailures), ep)
		ch <- prometheus.MustNewConstMetric(descEv, prometheus.CounterValue, float64(s.Events), ep)
		ch <- prometheus.MustNewConstMetric(descCon, prometheus.GaugeValue, conn, ep)
		for d, v := range map[*prometheus.Desc]uint64{descDecErr: s.DecodeErrors, descBadFrame: s.BadFrames,
			descOrphan: s.Orphans, descBSErr: s.BlockSizeErrors, descBadTS: s.BadTimestamps, descDemote: s.Demotions,
			descRestart: s.Restarts, descRecov: s.RecoveredBatches, descIdxErr: s.IndexErrors, descResync: s.Resyncs, descHashEv: s.HashEvictions} {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), ep)
		}
		cfgErr := 0.0
		if s.ConfigError != "" {
			cfgErr = 1
		}
		ch <- prometheus.MustNewConstMetric(descCfgErr, prometheus.GaugeValue, cfgErr, ep)
	}
}

// NewLogHandler returns the slog handler kvgate serve logs through: slog's JSON handler writing to w at
// level, durations in seconds, whose access lines the server writes with its own encoder (same keys, order
// and format; gateway/RATIONALE.md, the access-log section). A logger derived with With or WithGroup still works,
// through slog.
func NewLogHandler(w io.Writer, level slog.Leveler) slog.Handler {
	return server.NewLogHandler(w, level)
}
