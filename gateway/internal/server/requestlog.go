package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	randv2 "math/rand/v2"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/tidwall/gjson"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvgate/kvgate/gateway/internal/metrics"
)

// HeaderRequestID carries a request's ID: taken from the client when it sent an acceptable one
// (ValidRequestID), else generated; returned on every response (errors included), sent to the engine and
// written in every log line about the request (request_id).
const HeaderRequestID = "X-Request-Id"

// MaxRequestIDLen bounds a client's request ID; a longer one is replaced by a generated one.
const MaxRequestIDLen = 128

// localRequestID is the Fiber Locals key of the request's ID.
type localRequestIDKey struct{}

var localRequestID = localRequestIDKey{}

// ValidRequestID says whether a client's X-Request-Id is kept: 1..MaxRequestIDLen bytes of ASCII letters,
// digits and "-_.:/+=@" (what UUIDs, ULIDs, W3C trace IDs and the usual proxies' IDs are made of; nothing
// that could break a log line or a header).
func ValidRequestID(b []byte) bool {
	if len(b) == 0 || len(b) > MaxRequestIDLen {
		return false
	}
	for _, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '-', c == '_', c == '.', c == ':', c == '/', c == '+', c == '=', c == '@':
		default:
			return false
		}
	}
	return true
}

// newRequestID returns 16 random bytes in hex (32 characters).
func newRequestID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// requestID returns c's request ID, deciding it (and setting the response header) on the first call.
func requestID(c *fiber.Ctx) string {
	if v, ok := c.Locals(localRequestID).(string); ok {
		return v
	}
	var id string
	if h := c.Request().Header.Peek(HeaderRequestID); ValidRequestID(h) {
		id = string(h)
	} else {
		id = newRequestID()
	}
	c.Locals(localRequestID, id)
	c.Response().Header.Set(HeaderRequestID, id)
	return id
}

// reqLog writes log lines about one request, each carrying its request_id (built only when a line is
// written: the request path pays nothing for it otherwise).
type reqLog struct {
	l  *slog.Logger
	id string
}

func (r reqLog) log(level slog.Level, msg string, attrs ...slog.Attr) {
	if !r.l.Enabled(context.Background(), level) {
		return
	}
	r.l.LogAttrs(context.Background(), level, msg, append([]slog.Attr{slog.String("request_id", r.id)}, attrs...)...)
}

func (r reqLog) Warn(msg string, attrs ...slog.Attr) { r.log(slog.LevelWarn, msg, attrs...) }

// usage is an engine's token usage of one response.
type usage struct {
	prompt, cached, completion int64
	ok                         bool // the engine reported usage
}

// parseUsage reads an OpenAI usage object (gjson result of "usage").
func parseUsage(u gjson.Result) usage {
	if !u.IsObject() {
		return usage{}
	}
	return usage{prompt: u.Get("prompt_tokens").Int(), completion: u.Get("completion_tokens").Int(),
		cached: u.Get("prompt_tokens_details.cached_tokens").Int(), ok: true}
}

// reqInfo is what the access log and the request metrics say about one generation request.
type reqInfo struct {
	id       string
	start    time.Time
	model    string // the client's model name (as served; "" until parsed)
	label    string // the model label (served base model or UnknownModel)
	endpoint string
	policy   string
	stream   bool
	chat     bool
	retries  int
	prompt   int // prompt tokens as the gateway tokenized them (0 before planning)
	// Stream timing: first and last byte read from the engine's stream, token events seen.
	first, last time.Time
	events      int
	use         usage
	// The request's span and its context (tracing on; nil otherwise).
	span trace.Span
	tctx context.Context
}

// end counts a finished generation request (kvgate_requests_total), observes its latency and usage
// (kvgate_request_duration_seconds and the rest, when an endpoint answered) and writes its access-log
// line. It is called once per request.
func (s *Server) end(ri *reqInfo, status int) {
	s.count(ri.label, ri.endpoint, status)
	now := time.Now()
	defer ri.endTrace(status, now)
	dur := now.Sub(ri.start)
	var ttft, itl time.Duration
	var tokens int64
	if ri.endpoint != "" {
		m := s.reqMetrics(ri.label, ri.endpoint)
		m.Duration.Observe(dur.Seconds())
		if ri.use.ok {
			m.Prompt.Add(float64(ri.use.prompt))
			m.Cached.Add(float64(ri.use.cached))
			m.Completion.Add(float64(ri.use.completion))
		}
		if ri.stream && !ri.first.IsZero() && status < 300 {
			ttft = ri.first.Sub(ri.start)
			m.TTFT.Observe(ttft.Seconds())
			tokens = int64(ri.events)
			if ri.chat {
				tokens-- // the role event that opens a chat stream carries no token
			}
			if ri.use.ok {
				tokens = ri.use.completion
			}
			if tokens >= 2 && ri.last.After(ri.first) {
				itl = ri.last.Sub(ri.first) / time.Duration(tokens-1)
				m.ITL.Observe(itl.Seconds())
			}
		}
	}
	if !s.accessLogged(status) {
		return
	}
	prompt := int64(ri.prompt)
	if ri.use.ok {
		prompt = ri.use.prompt
	}
	line := accessLine{id: ri.id, model: ri.model, endpoint: ri.endpoint, policy: ri.policy, status: status,
		stream: ri.stream, prompt: prompt, cached: ri.use.cached, completion: ri.use.completion,
		duration: dur.Seconds(), retries: ri.retries}
	if ri.stream && ttft > 0 {
		line.ttft = ttft.Seconds()
	}
	if itl > 0 {
		line.itl = itl.Seconds()
	}
	if writeAccess(s.o.Log, now, &line) {
		return
	}
	attrs := make([]slog.Attr, 0, 14)
	attrs = append(attrs, slog.String("request_id", line.id), slog.String("model", line.model), slog.String("endpoint_id", line.endpoint),
		slog.String("policy", line.policy), slog.Int("status", status), slog.Bool("stream", line.stream),
		slog.Int64("prompt_tokens", prompt), slog.Int64("cached_tokens", line.cached),
		slog.Int64("completion_tokens", line.completion))
	if line.ttft > 0 {
		attrs = append(attrs, slog.Float64("ttft_seconds", line.ttft))
	}
	if line.itl > 0 {
		attrs = append(attrs, slog.Float64("itl_seconds", line.itl))
	}
	attrs = append(attrs, slog.Float64("duration_seconds", line.duration), slog.Int("retries", line.retries))
	s.o.Log.LogAttrs(context.Background(), slog.LevelInfo, "request", attrs...)
}

// accessLogged decides whether a request answered status gets an access-log line: never when access_log is
// off or the logger drops info; always for status ≥ 400; else with the configured share.
func (s *Server) accessLogged(status int) bool {
	if s.logShare <= 0 || !s.o.Log.Enabled(context.Background(), slog.LevelInfo) {
		return false
	}
	return status >= 400 || s.logShare >= 1 || randv2.Float64() < s.logShare
}

// endRefused ends a generation request refused before its body was parsed (auth, framing, size).
func (s *Server) endRefused(c *fiber.Ctx, status int) {
	s.end(&reqInfo{id: requestID(c), start: time.Now(), label: UnknownModel}, status)
}

// reqMetrics returns the request collectors' children for (model, endpoint), resolved once.
func (s *Server) reqMetrics(model, endpoint string) *metrics.EndpointRequestMetrics {
	k := [2]string{model, endpoint}
	if m, ok := s.perEndpoint.Load(k); ok {
		return m.(*metrics.EndpointRequestMetrics)
	}
	m, _ := s.perEndpoint.LoadOrStore(k, s.o.Metrics.Req.Endpoint(model, endpoint))
	return m.(*metrics.EndpointRequestMetrics)
}

// streamTail keeps the last streamTailMax bytes of an engine's stream, where its usage event is (OpenAI
// streams send it after the last token, before [DONE]). It is a ring: add copies only the bytes it is
// given (at most streamTailMax), never shifts what it holds; usage puts the ring in order once, at the end.
type streamTail struct {
	ring []byte // len streamTailMax once anything was added
	pos  int    // where the next byte goes
	full bool   // the ring has wrapped: ring[pos:] then ring[:pos] are the bytes in order
}

const streamTailMax = 8 << 10

func (t *streamTail) add(p []byte) {
	if len(p) == 0 {
		return
	}
	if t.ring == nil {
		t.ring = make([]byte, streamTailMax)
	}
	if len(p) >= streamTailMax {
		copy(t.ring, p[len(p)-streamTailMax:])
		t.pos, t.full = 0, true
		return
	}
	n := copy(t.ring[t.pos:], p)
	if n < len(p) {
		t.pos = copy(t.ring, p[n:])
		t.full = true
		return
	}
	t.pos += n
	if t.pos == streamTailMax {
		t.pos, t.full = 0, true
	}
}

// bytes returns the kept bytes in stream order.
func (t *streamTail) bytes() []byte {
	if !t.full {
		return t.ring[:t.pos]
	}
	return append(append(make([]byte, 0, streamTailMax), t.ring[t.pos:]...), t.ring[:t.pos]...)
}

var (
	markUsage   = []byte(`"usage":{`)
	markUsageSp = []byte(`"usage": {`)
	markData    = []byte("data:")
)

// usage returns the usage object of the last event in the tail that carries one.
func (t *streamTail) usage() usage {
	b := t.bytes()
	i := max(bytes.LastIndex(b, markUsage), bytes.LastIndex(b, markUsageSp))
	if i < 0 {
		return usage{}
	}
	startData := bytes.LastIndex(b[:i], markData)
	if startData < 0 {
		return usage{}
	}
	ev := b[startData+len(markData):]
	if j := bytes.IndexByte(ev, '\n'); j >= 0 {
		ev = ev[:j]
	}
	return parseUsage(gjson.GetBytes(ev, "usage"))
}

// tokenEvents estimates the token events in an engine's stream bytes p: its data events less [DONE]
// (used for the inter-token latency only when the stream reports no usage).
func tokenEvents(p []byte) int {
	return bytes.Count(p, markData) - bytes.Count(p, markDone)
}
