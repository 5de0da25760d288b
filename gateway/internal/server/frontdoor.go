package server

import (
	"bytes"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/gateway/internal/metrics"
	"github.com/kvgate/kvgate/gateway/internal/openai"
	"github.com/kvgate/kvgate/gateway/internal/route"
	"github.com/kvgate/kvgate/gateway/internal/upstream"
)

// smallBodyLimit is the body limit of routes that take no body (GET /v1/models, /healthz, ...) and of a
// request refused on its headers: fasthttp then refuses to read a larger body and closes the connection.
const smallBodyLimit = 64 << 10

// refusedBodyLimit is the body limit of a request refused on its headers (fasthttp takes 0 as "default").
const refusedBodyLimit = 1

// headerReceived runs after a request's headers and before its body is read (fasthttp's HeaderReceived):
// it sets the body-read deadline (client_body_timeout) and the body limit. A request that will be refused
// (no or wrong bearer token, ambiguous framing) gets a limit of one byte, so its body is never read: a
// larger declared body fails at once, and errorHandler answers the refusal (401/400) instead of the 413.
func (s *Server) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	rc := fasthttp.RequestConfig{ReadTimeout: s.o.Config.ClientBodyTimeout, WriteTimeout: s.o.Config.ClientWriteTimeout}
	p := pathOf(h)
	if e, gen := s.refusal(h, p); e != nil {
		rc.MaxRequestBodySize = refusedBodyLimit
		s.refused.put(h, refused{e, gen})
		return rc
	}
	s.refused.del(h)
	switch norm := p.norm; {
	case !p.ok:
		rc.MaxRequestBodySize = smallBodyLimit
	case isGeneratePath(norm), IsAdminPath(norm), isTokenizePath(norm):
		rc.MaxRequestBodySize = int(s.o.Config.MaxBodyBytes)
	default:
		rc.MaxRequestBodySize = smallBodyLimit
	}
	return rc
}

// refused is a request refused on its headers, remembered for errorHandler: a failed chunked body read
// resets the request, headers included, so the decision cannot be taken again there.
type refused struct {
	e        *openai.Error
	generate bool
}

// refusedSet maps a connection's request header (fasthttp reuses one per connection) to its refusal.
// Entries are removed when answered; a connection that vanished mid-body may leave one, so the set is
// emptied when it grows past refusedMax. n counts the entries so that the common case (nothing refused)
// takes no lock.
type refusedSet struct {
	n  atomic.Int64
	mu sync.Mutex
	m  map[*fasthttp.RequestHeader]refused
}

const refusedMax = 1 << 16

func (r *refusedSet) put(h *fasthttp.RequestHeader, v refused) {
	r.mu.Lock()
	if r.m == nil || len(r.m) >= refusedMax {
		r.m = map[*fasthttp.RequestHeader]refused{}
	}
	r.m[h] = v
	r.n.Store(int64(len(r.m)))
	r.mu.Unlock()
}

func (r *refusedSet) del(h *fasthttp.RequestHeader) { r.take(h) }

// take returns and forgets h's refusal.
func (r *refusedSet) take(h *fasthttp.RequestHeader) (refused, bool) {
	if r.n.Load() == 0 {
		return refused{}, false
	}
	r.mu.Lock()
	v, ok := r.m[h]
	delete(r.m, h)
	r.n.Store(int64(len(r.m)))
	r.mu.Unlock()
	return v, ok
}

// refusal decides a request on its headers alone: ambiguous framing (400, the connection must be closed),
// or a missing or wrong bearer token (401). generate says the path is a generation API (for counting).
// p is h's path (pathOf).
func (s *Server) refusal(h *fasthttp.RequestHeader, p reqPath) (e *openai.Error, generate bool) {
	raw, norm, ok := p.raw, p.norm, p.ok
	generate = ok && isGeneratePath(norm)
	if msg := framingError(h.RawHeaders()); msg != "" {
		return openai.Errorf(fiber.StatusBadRequest, "invalid_request_error", "", "bad_framing", "%s", msg), generate
	}
	if s.corsPreflight(h) {
		return nil, false // answered by cors without a body; a preflight carries no credentials
	}
	authz := string(h.Peek(fiber.HeaderAuthorization))
	if !ok {
		// Undecodable: authenticate as admin if it might be one, else let routing 404 it.
		if strings.Contains(strings.ToLower(raw), "admin") && !tokenOK(bearerOf(authz), s.secrets.AdminToken) {
			return openai.Unauthorized(), false
		}
		return nil, false
	}
	if IsAdminPath(norm) {
		if !tokenOK(bearerOf(authz), s.secrets.AdminToken) {
			return openai.Unauthorized(), false
		}
		return nil, false
	}
	if norm == "/metrics" && s.metricsNeedToken() {
		got := bearerOf(authz)
		if !tokenOK(got, s.secrets.AdminToken) && !tokenOK(got, s.secrets.MetricsToken) {
			return openai.Unauthorized(), false
		}
		return nil, false
	}
	if len(s.secrets.ClientAPIKeys) > 0 && (norm == "/v1" || strings.HasPrefix(norm, "/v1/") || isTokenizePath(norm)) {
		got := bearerOf(authz)
		okKey := 0
		for _, k := range s.secrets.ClientAPIKeys {
			okKey |= subtle.ConstantTimeCompare([]byte(got), []byte(k))
		}
		if got == "" || okKey != 1 {
			return openai.Unauthorized(), generate && string(h.Method()) == fiber.MethodPost
		}
	}
	return nil, false
}

// metricsNeedToken says whether /metrics on listen needs a bearer token: when a metrics token is set, or
// when client keys are (an open /metrics beside closed /v1 routes would expose the traffic).
func (s *Server) metricsNeedToken() bool {
	return s.secrets.MetricsToken != "" || len(s.secrets.ClientAPIKeys) > 0
}

// reqPath is a request's path as sent (rawPath) and its NormalizePath form, computed once per request
// header: the front door's decisions read it twice or three times (headerReceived, refusal, auth), and
// parsing the request target and normalizing it each time was about 1% of a short request's CPU.
type reqPath struct {
	raw, norm string
	ok        bool
}

// pathOf returns h's reqPath.
func pathOf(h *fasthttp.RequestHeader) reqPath {
	raw := string(rawPath(h))
	norm, ok := NormalizePath(raw)
	return reqPath{raw, norm, ok}
}

// rawPath returns the request's path as sent (percent-escapes kept), as routing's URI().PathOriginal()
// sees it, also for an absolute-form request target.
func rawPath(h *fasthttp.RequestHeader) []byte {
	var u fasthttp.URI
	if err := u.Parse(h.Host(), h.RequestURI()); err != nil { // as fasthttp parses Request.URI()
		return h.RequestURI()
	}
	return u.PathOriginal()
}

func bearerOf(h string) string {
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// framingError returns why a request's body framing is ambiguous (RFC 9112 §6.1, §6.3), or "": both
// Content-Length and Transfer-Encoding, more than one Content-Length, or a Transfer-Encoding other than
// exactly one "chunked". raw is the request's header block as received.
func framingError(raw []byte) string {
	var cl, te int
	var teVal []byte
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			continue
		}
		name := line[:colon]
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			cl++
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			te++
			teVal = line[colon+1:]
		}
	}
	switch {
	case cl > 0 && te > 0:
		return "A request may not carry both Content-Length and Transfer-Encoding."
	case cl > 1:
		return "A request may carry one Content-Length header."
	case te > 1:
		return "A request may carry one Transfer-Encoding header."
	case te == 1 && !bytes.EqualFold(bytes.Trim(teVal, " "), []byte("chunked")):
		return "Transfer-Encoding must be exactly `chunked`."
	}
	return ""
}

// clientLimiter caps concurrent requests per X-Forwarded-For client address of trusted proxies (the
// proxies' own connections are not capped per address).
type clientLimiter struct {
	max     int
	trusted []netip.Prefix
	mu      sync.Mutex
	n       map[netip.Addr]int
}

// acquire takes a slot for the client behind c; ok is false over the cap. release must be called once
// when ok.
func (l *clientLimiter) acquire(c *fiber.Ctx) (release func(), ok bool) {
	if l == nil || l.max <= 0 || len(l.trusted) == 0 {
		return func() {}, true
	}
	peer := peerAddr(c.Context().RemoteAddr())
	if !trustedPeer(l.trusted, peer) {
		return func() {}, true
	}
	ip, found := forwardedClient(string(c.Request().Header.Peek(fiber.HeaderXForwardedFor)), l.trusted)
	if !found {
		return func() {}, true
	}
	l.mu.Lock()
	if l.n[ip] >= l.max {
		l.mu.Unlock()
		return nil, false
	}
	l.n[ip]++
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			if l.n[ip]--; l.n[ip] <= 0 {
				delete(l.n, ip)
			}
			l.mu.Unlock()
		})
	}, true
}

// forwardedClient returns the client address of an X-Forwarded-For chain: the right-most entry that is not
// a trusted proxy (entries left of it could be written by the client).
func forwardedClient(xff string, trusted []netip.Prefix) (netip.Addr, bool) {
	parts := strings.Split(xff, ",")
	for i := len(parts) - 1; i >= 0; i-- {
		a, err := netip.ParseAddr(strings.TrimSpace(parts[i]))
		if err != nil {
			return netip.Addr{}, false
		}
		a = a.Unmap()
		if !trustedPeer(trusted, a) {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// retryBudget allows retries to be at most a share of requests: each request deposits share, each retry
// withdraws one, and the bucket holds at most retryBudgetMax (it starts full).
type retryBudget struct {
	share float64
	mu    sync.Mutex
	level float64
}

const retryBudgetMax = 10

func newRetryBudget(share float64) *retryBudget {
	return &retryBudget{share: share, level: retryBudgetMax}
}

func (b *retryBudget) deposit() {
	b.mu.Lock()
	b.level = min(b.level+b.share, retryBudgetMax)
	b.mu.Unlock()
}

func (b *retryBudget) withdraw() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.level < 1 {
		return false
	}
	b.level--
	return true
}

// upstreamTimeout is 504: the engine did not answer (or finish) within an upstream timeout.
func upstreamTimeout(model string) *openai.Error {
	return openai.Errorf(fiber.StatusGatewayTimeout, "server_error", "", "upstream_timeout",
		"The engine serving `%s` did not respond in time.", model)
}

// timeoutKind names an upstream timeout error for kvgate_upstream_timeouts_total.
func timeoutKind(err error) string {
	switch {
	case errors.Is(err, upstream.ErrConnectTimeout):
		return metrics.TimeoutConnect
	case errors.Is(err, upstream.ErrFirstByteTimeout):
		return metrics.TimeoutFirstByte
	case errors.Is(err, upstream.ErrTotalTimeout):
		return metrics.TimeoutTotal
	}
	return metrics.TimeoutIdle
}

// bodyTimeout returns the upstream timeout that ended a response body read, or nil.
func bodyTimeout(err error) error {
	switch {
	case errors.Is(err, upstream.ErrTotalTimeout):
		return upstream.ErrTotalTimeout
	case errors.Is(err, upstream.ErrIdle):
		return upstream.ErrIdle
	}
	return nil
}

// outliers counts consecutive failures (5xx answers, connection failures) per endpoint for passive
// outlier ejection.
type outliers struct {
	mu sync.Mutex
	n  map[string]int
}

// outlierSuccess resets id's consecutive failures.
func (s *Server) outlierSuccess(id string) {
	s.outl.mu.Lock()
	delete(s.outl.n, id)
	s.outl.mu.Unlock()
}

// outlierFailure counts a failure of id (serving m); at outlier_consecutive_failures it ejects id for
// outlier_ejection_time, unless that would leave m without an endpoint that is healthy and not ejected
// (ejecting the last one would only turn errors into 503s).
func (s *Server) outlierFailure(m *route.Model, id string) {
	cfg := s.o.Config
	s.outl.mu.Lock()
	if s.outl.n == nil {
		s.outl.n = map[string]int{}
	}
	s.outl.n[id]++
	hit := s.outl.n[id] >= cfg.OutlierConsecutiveFailures
	if hit {
		delete(s.outl.n, id)
	}
	s.outl.mu.Unlock()
	if !hit {
		return
	}
	others := 0
	for _, e := range m.Current() {
		if e.ID != id && s.o.Endpoints.Load(e.ID).Healthy {
			others++
		}
	}
	if others == 0 {
		return
	}
	until := time.Now().Add(cfg.OutlierEjectionTime)
	s.o.Endpoints.Eject(id, until)
	s.o.Metrics.Front.Ejections.WithLabelValues(id).Inc()
	s.o.Metrics.Front.EndpointEjected.WithLabelValues(id).Set(1)
	s.o.Log.Warn("endpoint ejected after consecutive failures", slog.String("endpoint_id", id),
		slog.Int("failures", cfg.OutlierConsecutiveFailures), slog.Time("until", until))
}

// streamScan watches the bytes of an SSE stream for its end markers: "data: [DONE]", a non-null
// "finish_reason", and error events (`data: {"error"...` or `"object":"error"`). Markers split across
// reads are found through the kept tail of the previous read.
type streamScan struct {
	tail               []byte
	sawDone, sawFinish bool
	sawError           bool
	// responses: the stream is a Responses event stream (POST /v1/responses), which ends with a
	// response.completed or response.incomplete event, and fails with response.failed or error events.
	responses bool
}

var (
	markDone     = []byte("[DONE]")
	markFinish   = []byte(`"finish_reason":"`)
	markFinishSp = []byte(`"finish_reason": "`)
	markErr      = []byte(`data: {"error"`)
	markErrNoSp  = []byte(`data:{"error"`)
	markErrObj   = []byte(`"object":"error"`)
	// Responses events: the event line names the type (vLLM and OpenAI both send one before each data line).
	markRespDone       = []byte("event: response.completed")
	markRespIncomplete = []byte("event: response.incomplete")
	markRespFailed     = []byte("event: response.failed")
	markRespError      = []byte("event: error")
	// The same in the data line, for a server that sends no event lines.
	markRespDoneData = [][]byte{[]byte(`"type":"response.completed"`), []byte(`"type": "response.completed"`),
		[]byte(`"type":"response.incomplete"`), []byte(`"type": "response.incomplete"`)}
	markRespErrData = [][]byte{[]byte(`"type":"response.failed"`), []byte(`"type": "response.failed"`),
		[]byte(`"type":"error"`), []byte(`"type": "error"`)}
)

func (s *streamScan) scan(b []byte) {
	const keep = 32 // longer than every marker
	s.look(b)
	if len(s.tail) > 0 { // markers split between the previous read and this one
		var join [2 * keep]byte
		s.look(append(append(join[:0], s.tail...), b[:min(len(b), keep)]...))
	}
	if len(b) >= keep {
		s.tail = append(s.tail[:0], b[len(b)-keep:]...)
	} else {
		s.tail = append(s.tail, b...)
		if len(s.tail) > keep {
			s.tail = append(s.tail[:0], s.tail[len(s.tail)-keep:]...)
		}
	}
}

func (s *streamScan) look(b []byte) {
	s.sawDone = s.sawDone || bytes.Contains(b, markDone)
	s.sawFinish = s.sawFinish || bytes.Contains(b, markFinish) || bytes.Contains(b, markFinishSp)
	s.sawError = s.sawError || bytes.Contains(b, markErr) || bytes.Contains(b, markErrNoSp) || bytes.Contains(b, markErrObj)
	if s.responses {
		s.sawFinish = s.sawFinish || bytes.Contains(b, markRespDone) || bytes.Contains(b, markRespIncomplete)
		s.sawError = s.sawError || bytes.Contains(b, markRespFailed) || bytes.Contains(b, markRespError)
		for _, m := range markRespDoneData {
			s.sawFinish = s.sawFinish || bytes.Contains(b, m)
		}
		for _, m := range markRespErrData {
			s.sawError = s.sawError || bytes.Contains(b, m)
		}
	}
}

// finished says the stream reached its end: [DONE] or a finish reason.
func (s *streamScan) finished() bool { return s.sawDone || s.sawFinish }
