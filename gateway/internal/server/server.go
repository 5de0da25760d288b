// Package server is the gateway's HTTP front: a Fiber v2 app serving the OpenAI API (POST
// /v1/chat/completions, POST /v1/completions, GET /v1/models; surface.go: GET /v1/models/{id}, POST
// /v1/responses, POST /v1/embeddings, vLLM's POST /tokenize and /detokenize), /healthz, /readyz and /metrics, with one auth
// middleware in front of every route and the admin API mounted under /admin/v1 (gateway/internal/admin). A generation
// request is planned and reserved by gateway/internal/route, forwarded by gateway/internal/upstream, streamed back event by
// event, and its lease released when the response ends or the client goes away.
package server

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/gateway/internal/endpoints"
	"github.com/kvgate/kvgate/gateway/internal/metrics"
	"github.com/kvgate/kvgate/gateway/internal/openai"
	"github.com/kvgate/kvgate/gateway/internal/route"
	"github.com/kvgate/kvgate/gateway/internal/upstream"
	"github.com/kvgate/kvgate/kvstore"
)

// Response headers set on every proxied response.
const (
	HeaderEndpoint = "x-kvgate-endpoint" // the endpoint ID that served the request
	HeaderPolicy   = "x-kvgate-policy"   // the policy version asked to rank it, name@sha256 (12 hex)
	// HeaderFallback is set only when the native three-tier ranking answered instead of that policy: its
	// value is the reason (the reason label of kvgate_policy_fallbacks_total, e.g. "timeout", "guest_error").
	HeaderFallback = "x-kvgate-policy-fallback"
)

// Labels of kvgate_requests_total beyond the served models and real HTTP statuses.
const (
	// UnknownModel is the model label of a request for a model the gateway does not serve, or whose body
	// names none (the label never takes a client's string, so its cardinality stays bounded).
	UnknownModel = "unknown"
	// StatusClientClosed is the status label of a request whose client went away before its response ended
	// (nginx's 499 "client closed request"); the client never sees it.
	StatusClientClosed = 499
)

// RetryAfterSeconds is the Retry-After header of a 429 (every endpoint at capacity for the queue timeout).
const RetryAfterSeconds = 1

// DisconnectPoll is how often a waiting request checks whether its client is still connected.
const DisconnectPoll = 100 * time.Millisecond

// ServedModel is one entry of the model table: the router's model and the adapter name ("" for the base).
type ServedModel struct {
	Model *route.Model // the base model's routing description
	LoRA  string       // adapter name, "" for the base model
}

// Options build a Server.
type Options struct {
	Config    *config.Config         // limits and timeouts (body size, idle timeouts)
	Secrets   config.Secrets         // admin token and client API keys
	Models    map[string]ServedModel // by client-facing name (models and LoRA adapters)
	Router    *route.Router          // plans and reserves each request
	Upstream  *upstream.Client       // forwards to the chosen endpoint
	Endpoints *endpoints.Set         // live endpoint load and health (/readyz, gauges, marking failures)
	Metrics   *metrics.Metrics       // collectors; Metrics.Registry is served on /metrics
	Log       *slog.Logger           // request and lifecycle logs
	// Admin mounts the admin API on the /admin/v1 group (nil: none, every /admin/ path 404s after auth).
	Admin func(r fiber.Router)
	// Ready adds details to /readyz (e.g. event ingestion stats); may be nil.
	Ready func() map[string]any
	// Tracer, if set, traces each generation request (gateway/internal/tracing; nil: off).
	Tracer trace.Tracer
	// TLS, if set, serves the listener over TLS (gateway/internal/tlsconf: the certificate reloads on change).
	TLS *tls.Config
	// EngineBody, if set, builds the body sent to candidate c for plan p of req from the client's body (the
	// gateway's chat token IDs and drift guard); nil: upstream.Body by engine kind.
	EngineBody func(req *openai.Request, p *route.Plan, c route.Candidate, body []byte) ([]byte, error)
	// Store reports the store's state for /readyz ("store", and "degraded" when it is down); nil: a store
	// that is never down.
	Store func() kvstore.GuardStatus
}

// StoreStatus is /readyz's "store": the store's state (kvstore.GuardStatus) and the requests routed on
// load alone because of it.
type StoreStatus struct {
	kvstore.GuardStatus
	// LoadOnlyRequests counts requests routed without the store since start.
	LoadOnlyRequests uint64 `json:"load_only_requests"`
}

// RouteRequest is what the router needs of a parsed request.
func RouteRequest(r *openai.Request) route.Request {
	return route.Request{Model: r.Model, Chat: r.API == openai.Chat, Responses: r.API == openai.Responses,
		LoadOnlyReason: r.LoadOnlyReason, ChatRequest: r.Chat, PromptText: r.PromptText,
		PromptIDs: r.PromptIDs, PromptIsIDs: r.PromptIsIDs, BatchTexts: r.BatchTexts, BatchIDTokens: r.BatchIDTokens,
		Prompts: r.Prompts, CacheSalt: r.CacheSalt, MaxTokens: r.MaxTokens, N: r.N, BestOf: r.BestOf}
}

// RouteError is the HTTP answer to a router error for the client-facing model name model: the one place
// the router's errors become statuses. Anything else is a 500.
func RouteError(model string, err error) *openai.Error {
	var oe *openai.Error
	if errors.As(err, &oe) {
		return oe
	}
	if re, ok := errors.AsType[*route.RequestError](err); ok {
		return openai.Errorf(http.StatusBadRequest, "invalid_request_error", re.Param, re.Code, "%s", re.Message)
	}
	switch {
	case errors.Is(err, route.ErrNoHealthy):
		return openai.Unavailable(model)
	case errors.Is(err, route.ErrQueueTimeout):
		return openai.NoCapacity(model)
	case errors.Is(err, route.ErrStoreRefused):
		return openai.Errorf(http.StatusInternalServerError, "server_error", "", "store_error", "The reservation store refused the request.")
	}
	return openai.Errorf(http.StatusInternalServerError, "server_error", "", "", "%v", err)
}

// Server is the HTTP front. Create with New, run with Listen or Serve, stop with Shutdown.
type Server struct {
	o       Options
	secrets config.Secrets
	app     *fiber.App
	base    context.Context
	stop    context.CancelFunc
	modelsJ []byte
	// total is the StageTotal observer, resolved once (WithLabelValues hashes and locks on every call).
	total prometheus.Observer
	// requests caches kvgate_requests_total children by requestKey (a per-request WithLabelValues hashes
	// three labels and formats the status).
	requests sync.Map
	// trusted are the trusted_proxies prefixes; clients caps requests per X-Forwarded-For address behind
	// them; retries is the retry budget.
	trusted []netip.Prefix
	clients *clientLimiter
	retries *retryBudget
	// refused remembers the requests refused on their headers for errorHandler.
	refused refusedSet
	// outl counts consecutive endpoint failures (passive outlier ejection).
	outl         outliers
	surfaceState // GET /v1/models/{id}'s index (surface.go)
	// perEndpoint caches the request metrics' children by [model, endpoint]; logShare is the access log's
	// share of successful requests (0: off).
	perEndpoint sync.Map
	logShare    float64
	// draining is set by SetDraining (shutdown); active counts the generation requests not yet ended.
	draining atomic.Bool
	active   atomic.Int64
}

// requestKey names one kvgate_requests_total child.
type requestKey struct {
	model, endpoint string
	status          int
}

// New builds the Fiber app.
func New(o Options) *Server {
	base, stop := context.WithCancel(context.Background())
	s := &Server{o: o, secrets: o.Secrets, base: base, stop: stop, retries: newRetryBudget(o.Config.RetryBudget),
		logShare: o.Config.AccessLogSample()}
	for _, p := range o.Config.TrustedProxies {
		if pr, err := config.ParseTrustedProxy(p); err == nil { // validated by config
			s.trusted = append(s.trusted, pr)
		}
	}
	s.clients = &clientLimiter{max: o.Config.MaxConnectionsPerIP, trusted: s.trusted, n: map[netip.Addr]int{}}
	s.app = fiber.New(fiber.Config{
		AppName:               "kvgate",
		BodyLimit:             int(o.Config.MaxBodyBytes),
		IdleTimeout:           o.Config.ClientIdleTimeout,
		ReadTimeout:           o.Config.ClientHeaderTimeout, // headers; the body gets client_body_timeout (headerReceived)
		WriteTimeout:          o.Config.ClientWriteTimeout,
		ReadBufferSize:        16 << 10,
		CaseSensitive:         true,
		StrictRouting:         false,
		DisableStartupMessage: true,
		ErrorHandler:          s.errorHandler,
	})
	s.app.Server().HeaderReceived = s.headerReceived
	// fasthttp calls its ErrorHandler (Fiber's, which calls errorHandler) only for a request it could not
	// read (413, a refusal on the headers, a parse error), and then closes the connection: with the rest
	// of the request possibly still arriving, that close gets a lingering close (listener.go). A request
	// of which nothing was read, or whose read timed out, sends nothing more worth waiting for.
	onReadError := s.app.Server().ErrorHandler
	s.app.Server().ErrorHandler = func(ctx *fasthttp.RequestCtx, err error) {
		var nothing fasthttp.ErrNothingRead
		var ne net.Error
		if !errors.As(err, &nothing) && !(errors.As(err, &ne) && ne.Timeout()) {
			lingerOnClose(ctx.Conn())
		}
		onReadError(ctx, err)
	}
	s.app.Use(s.cors) // preflights are answered before auth: they carry no credentials (cors.go)
	s.app.Use(s.auth)
	s.app.Post("/v1/chat/completions", s.generate(openai.Chat))
	s.app.Post("/v1/completions", s.generate(openai.Completions))
	s.app.Get("/v1/models", s.listModels)
	s.registerSurface() // /v1/models/{id}, /v1/responses, /v1/embeddings, /tokenize, /detokenize (surface.go)
	s.app.Get("/healthz", func(c *fiber.Ctx) error { return c.JSON(fiber.Map{"status": "ok"}) })
	s.app.Get("/readyz", s.readyz)
	if o.Config.MetricsListen == "" { // else served on its own listener only (ServeMetrics)
		prom := adaptor.HTTPHandler(promhttp.HandlerFor(o.Metrics.Registry, promhttp.HandlerOpts{}))
		s.app.Get("/metrics", func(c *fiber.Ctx) error { s.refreshGauges(); return prom(c) })
	}
	if o.Admin != nil {
		o.Admin(s.app.Group("/admin/v1"))
	}
	s.app.Use(func(c *fiber.Ctx) error {
		return sendError(c, openai.Errorf(fiber.StatusNotFound, "invalid_request_error", "", "not_found", "No route for %s %s.", c.Method(), c.Path()))
	})
	s.modelsJ = s.modelsJSON()
	s.total = o.Metrics.Stage.WithLabelValues(metrics.StageTotal)
	return s
}

// App returns the Fiber app (tests use App().Test; the admin package adds routes through Options.Admin).
func (s *Server) App() *fiber.App { return s.app }

// Serve serves on ln until Shutdown. Accept errors never end it (they are logged, counted and retried after
// a back-off); connections over max_connections / max_connections_per_ip are closed at once. It returns
// only after Shutdown or when ln is closed.
func (s *Server) Serve(ln net.Listener) error {
	cfg := s.o.Config
	var l net.Listener = newLimitListener(ln, cfg.MaxConnections, cfg.MaxConnectionsPerIP, s.trusted,
		lingerLimits{time: cfg.ClientLingeringTime, bytes: cfg.ClientLingeringBytes, max: cfg.MaxLingeringConnections}, s.o.Metrics.Front, s.o.Log)
	if s.o.TLS != nil {
		// The handshake runs on the connection's first read, inside client_header_timeout.
		l = tls.NewListener(l, s.o.TLS)
	}
	return s.app.Listener(l)
}

// MetricsHandler serves /metrics for a separate listener (metrics_listen).
func (s *Server) MetricsHandler() http.Handler {
	prom := promhttp.HandlerFor(s.o.Metrics.Registry, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		s.refreshGauges()
		prom.ServeHTTP(w, r)
	})
}

// SetDraining starts a drain: /readyz answers 503 {"ready":false,"draining":true} from now on, and every
// response closes its connection (keep-alive clients reconnect, through their load balancer, elsewhere).
// The server goes on serving until Shutdown.
func (s *Server) SetDraining() { s.draining.Store(true) }

// Draining says whether SetDraining was called.
func (s *Server) Draining() bool { return s.draining.Load() }

// Active returns the generation requests (streams included) that have not ended.
func (s *Server) Active() int64 { return s.active.Load() }

// cancelledGrace bounds the wait for cancelled requests to end (and release their leases) after Shutdown's
// ctx ended.
const cancelledGrace = 3 * time.Second

// Shutdown stops accepting and waits up to ctx for in-flight requests (streams included) to end; then it
// cancels the rest (their engine requests are cancelled) and waits up to cancelledGrace more for them to
// end, so that their leases are released before the caller closes the store.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.app.ShutdownWithContext(ctx)
	s.stop()
	deadline := time.Now().Add(cancelledGrace)
	for s.active.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	return err
}

func sendError(c *fiber.Ctx, e *openai.Error) error {
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Status(e.Status).Send(e.JSON())
}

func (s *Server) errorHandler(c *fiber.Ctx, err error) error {
	var oe *openai.Error
	if errors.As(err, &oe) {
		return sendError(c, oe)
	}
	requestID(c)
	var fe *fiber.Error
	if errors.As(err, &fe) {
		// A request refused on its headers had a one-byte body limit (headerReceived): answer the refusal,
		// not the 413 (or the timeout). fasthttp closes the connection after this answer.
		if r, ok := s.refused.take(&c.Request().Header); ok {
			if r.generate {
				s.endRefused(c, r.e.Status)
			}
			return sendError(c, r.e)
		}
		if fe.Code == fiber.StatusRequestEntityTooLarge {
			if norm, ok := NormalizePath(string(c.Request().URI().PathOriginal())); ok && isGeneratePath(norm) {
				s.endRefused(c, fe.Code) // the body was never read: its model is unknown
			}
			return sendError(c, openai.TooLarge(s.o.Config.MaxBodyBytes))
		}
		typ := "invalid_request_error"
		if fe.Code >= 500 {
			typ = "server_error"
		}
		return sendError(c, openai.Errorf(fe.Code, typ, "", "", "%s", fe.Message))
	}
	s.o.Log.Error("handler error", slog.String("request_id", requestID(c)), slog.String("error", err.Error()), slog.String("path", c.Path()))
	return sendError(c, openai.Errorf(500, "server_error", "", "", "internal error"))
}

func (s *Server) modelsJSON() []byte {
	type entry struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
		Root    string `json:"root"`
		Parent  any    `json:"parent"`
	}
	var data []entry
	now := time.Now().Unix()
	for _, m := range s.o.Config.Models {
		data = append(data, entry{ID: m.Name, Object: "model", Created: now, OwnedBy: "kvgate", Root: m.Name})
		for _, l := range m.LoRAAdapters {
			data = append(data, entry{ID: l, Object: "model", Created: now, OwnedBy: "kvgate", Root: l, Parent: m.Name})
		}
	}
	b, _ := json.Marshal(map[string]any{"object": "list", "data": data})
	return b
}

func (s *Server) listModels(c *fiber.Ctx) error {
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Send(s.modelsJ)
}

func (s *Server) refreshGauges() {
	m := s.o.Metrics
	for _, e := range s.o.Endpoints.Endpoints() {
		l := s.o.Endpoints.Load(e.ID)
		m.EndpointWaiting.WithLabelValues(e.ID).Set(l.Waiting)
		m.EndpointRunning.WithLabelValues(e.ID).Set(l.Running)
		m.EndpointKVCacheUsage.WithLabelValues(e.ID).Set(l.KVCacheUsage)
		h := 0.0
		if l.Healthy {
			h = 1
		}
		m.EndpointHealthy.WithLabelValues(e.ID).Set(h)
		ej := 0.0
		if l.Ejected {
			ej = 1
		}
		m.Front.EndpointEjected.WithLabelValues(e.ID).Set(ej)
	}
}

// readyz answers 200 when every model has a healthy endpoint, else 503 (open: probes need the status). The
// body says {"ready","degraded"}; with the admin token it details endpoints (ejections included), the store
// (degraded while it is unreachable) and whatever Options.Ready adds — raw errors stay behind the token.
func (s *Server) readyz(c *fiber.Ctx) error {
	type epState struct {
		Healthy      bool       `json:"healthy"`
		Waiting      float64    `json:"waiting"`
		Running      float64    `json:"running"`
		KVCacheUsage float64    `json:"kv_cache_utilization"`
		Error        string     `json:"error,omitempty"`
		Ejected      bool       `json:"ejected,omitempty"`
		EjectedUntil *time.Time `json:"ejected_until,omitempty"`
	}
	if s.draining.Load() {
		c.Context().SetConnectionClose()
		return c.Status(fiber.StatusServiceUnavailable).JSON(fiber.Map{"ready": false, "draining": true})
	}
	ready := true
	models := map[string]map[string]epState{}
	for _, m := range s.o.Config.Models {
		rm := s.o.Models[m.Name].Model
		eps := map[string]epState{}
		any := false
		for _, e := range rm.Current() {
			l := s.o.Endpoints.Load(e.ID)
			st := epState{Healthy: l.Healthy, Waiting: l.Waiting, Running: l.Running, KVCacheUsage: l.KVCacheUsage, Error: l.Err, Ejected: l.Ejected}
			if l.Ejected {
				st.EjectedUntil = &l.EjectedUntil
			}
			eps[e.ID] = st
			any = any || l.Healthy
		}
		ready = ready && any
		models[m.Name] = eps
	}
	st := StoreStatus{LoadOnlyRequests: s.o.Router.LoadOnlyRequests()}
	if s.o.Store != nil {
		st.GuardStatus = s.o.Store()
	}
	if !ready {
		c.Status(fiber.StatusServiceUnavailable)
	}
	if !tokenOK(bearerOf(c.Get(fiber.HeaderAuthorization)), s.secrets.AdminToken) {
		return c.JSON(fiber.Map{"ready": ready, "degraded": st.Down})
	}
	body := map[string]any{"ready": ready, "degraded": st.Down, "store": st, "models": models}
	if s.o.Ready != nil {
		for k, v := range s.o.Ready() {
			body[k] = v
		}
	}
	if !ready {
		c.Status(fiber.StatusServiceUnavailable)
	}
	return c.JSON(body)
}

// watch cancels cancel when the client connection closes; stop ends the watch. The poll runs on a timer
// callback every DisconnectPoll, not on a goroutine per request (see RATIONALE.md "Per-request overhead").
func watch(conn net.Conn, cancel context.CancelFunc) (stop func()) {
	if conn == nil {
		return func() {}
	}
	if !canPoll(conn) {
		return func() {}
	}
	return every(DisconnectPoll, func() bool {
		if closed, _ := peerClosed(conn); closed {
			cancel()
			return false
		}
		return true
	})
}

// every calls f every d on a timer callback (no goroutine in between) until f returns false or stop is
// called. A call already due when stop is called may still run once; none is scheduled after it.
func every(d time.Duration, f func() bool) (stop func()) {
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(d, func() {
		mu.Lock()
		if stopped {
			mu.Unlock()
			return
		}
		mu.Unlock()
		if !f() {
			return
		}
		mu.Lock()
		if !stopped {
			t.Reset(d)
		}
		mu.Unlock()
	})
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
	}
}

// clientHeaders copies the request headers to forward.
func clientHeaders(c *fiber.Ctx) http.Header {
	h := make(http.Header, 8)
	c.Request().Header.VisitAll(func(k, v []byte) {
		key := http.CanonicalHeaderKey(string(k))
		h[key] = append(h[key], string(v))
	})
	return h
}

var skipRespHeader = map[string]bool{"Content-Length": true, "Transfer-Encoding": true, "Connection": true,
	"Keep-Alive": true, "Date": true, "Server": true, HeaderRequestID: true}

// clip bounds a client's string written to a log line.
func clip(s string) string {
	if len(s) > 256 {
		return s[:256]
	}
	return s
}

// modelLabel returns the model label for a client-facing model name: the served base model's name (a LoRA
// adapter counts under its base model), or UnknownModel.
func (s *Server) modelLabel(name string) string {
	if sm, ok := s.o.Models[name]; ok {
		return sm.Model.Name
	}
	return UnknownModel
}

// count adds one finished client request to kvgate_requests_total.
func (s *Server) count(model, endpoint string, status int) {
	k := requestKey{model, endpoint, status}
	if c, ok := s.requests.Load(k); ok {
		c.(prometheus.Counter).Inc()
		return
	}
	c := s.o.Metrics.Requests.WithLabelValues(model, endpoint, strconv.Itoa(status))
	s.requests.Store(k, c)
	c.Inc()
}

// isGeneratePath says whether a normalized path is one of the generation APIs (the requests
// kvgate_requests_total counts).
func isGeneratePath(norm string) bool {
	return norm == openai.Chat.Path() || norm == openai.Completions.Path() || norm == openai.Responses.Path() ||
		norm == openai.Embeddings.Path()
}
