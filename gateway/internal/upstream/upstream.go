// Package upstream sends a routed request to one endpoint: it builds the body the endpoint's engine kind
// takes (token IDs spliced in out of band where the engine accepts them, the client's bytes otherwise) and
// posts it over pooled keep-alive connections, cancellable through its context (a cancelled context closes
// the upstream connection, which makes vLLM/SGLang abort the generation).
//
// The client is net/http's http.Client over this package's own HTTP/1.1 transport (connTransport), not fasthttp's:
// see gateway/RATIONALE.md "Why our own HTTP/1.1 transport upstream".
package upstream

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/gateway/internal/openai"
)

// Body returns the bytes to send to an engine of kind (config.EngineSim, EngineVLLM, EngineSGLang) for a
// request parsed as req from body, given its prompt token IDs (nil when unknown), without an endpoint's
// chat_token_ids setting or the drift guard (the gateway uses those for chat: ChatBody, gateway/tokenids.go):
//   - enginesim chat: body with "prompt_token_ids" spliced in (unless the client sent its own);
//   - enginesim and vllm completions: body with "prompt" replaced by the token IDs (single prompts only);
//   - everything else: body as sent.
func Body(kind string, req *openai.Request, body []byte, ids []uint32) ([]byte, error) {
	return BodyJSON(kind, req, body, ids, nil)
}

// BodyJSON is Body with the completions' IDs written as JSON by appendJSON (nil: openai.AppendIDs; else a
// function with AppendIDs's output, such as a wrapper of gateway/internal/model's AppendIDsJSON, which
// formats only the IDs a cached prompt's text lacks). The text appendJSON writes into its dst is copied.
func BodyJSON(kind string, req *openai.Request, body []byte, ids []uint32, appendJSON func(dst []byte, ids []uint32) []byte) ([]byte, error) {
	if ids == nil {
		return body, nil
	}
	switch {
	case kind == config.EngineSim && req.API == openai.Chat && !req.HasPromptTokenIDs:
		return openai.SpliceChatTokenIDs(body, ids), nil
	case (kind == config.EngineSim || kind == config.EngineVLLM) && req.API == openai.Completions && !req.PromptIsIDs && req.SinglePrompt:
		if appendJSON == nil {
			appendJSON = openai.AppendIDs
		}
		return req.SplicePromptJSON(body, appendJSON(nil, ids))
	}
	return body, nil
}

// DataParallelRankHeader is the header vLLM's OpenAI server reads to serve a request on one
// data-parallel rank.
const DataParallelRankHeader = "X-data-parallel-rank"

// WithRank returns hdr with X-data-parallel-rank set to rank (a copy; hdr is not modified), or hdr itself
// when rank < 0 (an endpoint without data-parallel ranks).
func WithRank(hdr http.Header, rank int) http.Header {
	if rank < 0 {
		return hdr
	}
	h := hdr.Clone()
	if h == nil {
		h = http.Header{}
	}
	h.Set(DataParallelRankHeader, strconv.Itoa(rank))
	return h
}

// Client posts to endpoints. Safe for concurrent use.
type Client struct {
	hc *http.Client
	o  Options
}

// Options are a Client's timeouts (0: none) and header rules.
type Options struct {
	// ConnectTimeout bounds connecting to an engine (TCP connect).
	ConnectTimeout time.Duration
	// FirstByteTimeout bounds a streaming request from its start to the response's headers.
	FirstByteTimeout time.Duration
	// TotalTimeout bounds a non-streaming request from its start to the end of its response body.
	TotalTimeout time.Duration
	// IdleTimeout fails a response body that sends no byte for this long (silence between bytes).
	IdleTimeout time.Duration
	// ForwardCookies keeps the client's Cookie header (dropped by default).
	ForwardCookies bool
	// TLS verifies https:// engines (and presents a client certificate); nil: Go's defaults.
	TLS *tls.Config
}

// New returns a Client whose response bodies fail when the engine sends nothing for idle (0: never), with
// a 5 s connect timeout and no other timeout. NewWithOptions sets them all.
func New(idle time.Duration) *Client {
	return NewWithOptions(Options{ConnectTimeout: 5 * time.Second, IdleTimeout: idle})
}

// NewWithOptions returns a Client with o's timeouts.
func NewWithOptions(o Options) *Client {
	return &Client{hc: &http.Client{Transport: newConnTransport(o)}, o: o}
}

// IdleConnTimeout is how long a keep-alive connection to an engine stays pooled unused. It is below the
// 5 s keep-alive timeout vLLM and SGLang (uvicorn) close idle connections at, so the gateway normally
// closes a connection before the engine does and rarely sends on one the engine is closing.
const IdleConnTimeout = 4 * time.Second

// staleWindow is how soon after the request was written an engine's close still counts as an idle-close
// racing the reuse rather than an engine (or a proxy in front of it) giving up on a request it worked on.
const staleWindow = 250 * time.Millisecond

// maxStaleRetries bounds how many pooled connections in a row one request may find closed by the engine.
const maxStaleRetries = 2

// HTTP returns the underlying client (used for the endpoints' /metrics and /health scrapes, sharing the
// connection pool).
func (c *Client) HTTP() *http.Client { return c.hc }

// ErrBeforeResponse wraps a failure that happened before any response byte arrived.
var ErrBeforeResponse = errors.New("upstream: failed before the response")

// Timeout errors (errors.Is on a Post error or a response body read error).
var (
	// ErrFirstByteTimeout: a streaming response's headers did not arrive within FirstByteTimeout.
	ErrFirstByteTimeout = errors.New("upstream: first-byte timeout")
	// ErrTotalTimeout: a non-streaming response did not end within TotalTimeout.
	ErrTotalTimeout = errors.New("upstream: total timeout")
	// ErrConnectTimeout: connecting to the engine took longer than ConnectTimeout.
	ErrConnectTimeout = errors.New("upstream: connect timeout")
)

// Error is a Post failure before any response byte. Started says whether the engine may have started
// the request: false only when it provably did not (the connection could not be made, or the request was
// not completely written), and only then may the request be sent to another endpoint. Timeout is one of
// the Err*Timeout errors, or nil.
type Error struct {
	Started bool
	Timeout error
	Err     error
}

// Error describes the failure.
func (e *Error) Error() string {
	if e.Timeout != nil {
		return fmt.Sprintf("%v: %v: %v", ErrBeforeResponse, e.Timeout, e.Err)
	}
	return fmt.Sprintf("%v: %v", ErrBeforeResponse, e.Err)
}

// Is makes errors.Is(err, ErrBeforeResponse) and errors.Is(err, e.Timeout) true.
func (e *Error) Is(target error) bool {
	return target == ErrBeforeResponse || (e.Timeout != nil && target == e.Timeout)
}

// Unwrap returns the transport's error.
func (e *Error) Unwrap() error { return e.Err }

// hopHeaders are not forwarded (RFC 9110 §7.6.1) or are recomputed.
var hopHeaders = map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Connection": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Host": true,
	"Content-Length": true, "Accept-Encoding": true, "Proxy-Authorization": true}

// routingHeaders are kvgate's own, or name a destination or origin other proxies act on: a client must
// not be able to set them towards an engine.
var routingHeaders = map[string]bool{"X-Gateway-Destination-Endpoint": true, "X-Forwarded-Host": true,
	"X-Gateway-Model-Name": true}

// forwardHeader says whether the client header k (canonical) goes to the engine; nominated are the
// header names listed in the client's Connection header (canonical).
func (c *Client) forwardHeader(k string, dropAuth bool, nominated map[string]bool) bool {
	switch {
	case hopHeaders[k], routingHeaders[k], nominated[k], strings.HasPrefix(k, "X-Kvgate-"):
		return false
	case dropAuth && k == "Authorization":
		return false
	case k == "Cookie" && !c.o.ForwardCookies:
		return false
	}
	return true
}

// Post sends body to baseURL+path as a non-streaming request; see Do.
func (c *Client) Post(ctx context.Context, baseURL, path string, body []byte, hdr http.Header, dropAuth bool) (*http.Response, error) {
	return c.Do(ctx, Request{BaseURL: baseURL, Path: path, Body: body, Header: hdr, DropAuth: dropAuth})
}

// Request is one engine request.
type Request struct {
	BaseURL, Path string
	Body          []byte
	// Header are the client's headers: hop-by-hop ones, those the client's Connection header nominates,
	// kvgate's routing headers (X-Kvgate-*, X-Gateway-Destination-Endpoint, X-Forwarded-Host) and, unless
	// ForwardCookies, Cookie are dropped; Authorization too when DropAuth.
	Header   http.Header
	DropAuth bool
	// Stream selects FirstByteTimeout (headers) instead of TotalTimeout (the whole response).
	Stream bool
}

// Do sends r. The response's headers have arrived when it returns; its Body reads fail with
// context.Canceled after ctx ends, ErrIdle after the engine is silent for IdleTimeout and, for a
// non-streaming request, ErrTotalTimeout. A pooled keep-alive connection that the engine had closed is
// retried on another connection (at most maxStaleRetries times): when it failed before the request was
// completely written, or when the engine closed it (EOF or reset) within staleWindow of the request
// being written and before any response byte, which is an engine's idle-close racing the reuse (see RATIONALE.md "Stale
// keep-alive connections"). A request that failed on a new connection after it was written is never
// sent again. Errors are *Error.
func (c *Client) Do(ctx context.Context, r Request) (*http.Response, error) {
	url := strings.TrimRight(r.BaseURL, "/") + r.Path
	limit, limitErr := c.o.TotalTimeout, ErrTotalTimeout
	if r.Stream {
		limit, limitErr = c.o.FirstByteTimeout, ErrFirstByteTimeout
	}
	var nominated map[string]bool
	for _, v := range r.Header["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				if nominated == nil {
					nominated = map[string]bool{}
				}
				nominated[http.CanonicalHeaderKey(f)] = true
			}
		}
	}
	for attempt := 0; ; attempt++ {
		rctx, cancel := context.WithCancelCause(ctx)
		var timer *time.Timer
		if limit > 0 {
			timer = time.AfterFunc(limit, func() { cancel(limitErr) })
		}
		req, err := http.NewRequestWithContext(rctx, http.MethodPost, url, bytes.NewReader(r.Body))
		if err != nil {
			cancel(nil)
			return nil, &Error{Err: err}
		}
		for k, vs := range r.Header {
			if c.forwardHeader(k, r.DropAuth, nominated) {
				req.Header[k] = vs
			}
		}
		if req.Header.Get("Content-Type") == "" {
			req.Header.Set("Content-Type", "application/json")
		}
		var reused, wrote, connected atomic.Bool
		var wroteAt atomic.Int64
		req = req.WithContext(httptrace.WithClientTrace(rctx, &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { reused.Store(i.Reused && i.WasIdle); connected.Store(true) },
			WroteRequest: func(i httptrace.WroteRequestInfo) {
				wrote.Store(i.Err == nil)
				wroteAt.Store(time.Now().UnixNano())
			},
		}))
		resp, err := c.hc.Do(req)
		if err == nil {
			if r.Stream && timer != nil {
				timer.Stop() // headers arrived; the idle timeout guards the stream from here
			}
			var body io.ReadCloser = &cancelBody{rc: resp.Body, ctx: rctx, cancel: cancel, timer: timer}
			if c.o.IdleTimeout > 0 {
				body = newIdleBody(body, c.o.IdleTimeout)
			}
			resp.Body = body
			return resp, nil
		}
		cause := context.Cause(rctx)
		if timer != nil {
			timer.Stop()
		}
		cancel(nil)
		e := &Error{Started: wrote.Load(), Err: err}
		switch {
		case cause == limitErr:
			e.Timeout = limitErr
		case !connected.Load() && isTimeout(err):
			e.Timeout = ErrConnectTimeout
		}
		if ctx.Err() == nil && e.Timeout == nil && reused.Load() && attempt < maxStaleRetries &&
			(!e.Started || (closedByPeer(err) && time.Since(time.Unix(0, wroteAt.Load())) < staleWindow)) {
			continue // a stale keep-alive connection: the engine closed it, and never answered on it
		}
		return nil, e
	}
}

// closedByPeer says whether err is the engine closing the connection: EOF, or a reset or broken pipe.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// cancelBody ends the request's own context when the body is closed and reports a total timeout as
// ErrTotalTimeout.
type cancelBody struct {
	rc     io.ReadCloser
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
}

func (b *cancelBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil && err != io.EOF {
		if c := context.Cause(b.ctx); c == ErrTotalTimeout {
			return n, ErrTotalTimeout
		}
	}
	return n, err
}

func (b *cancelBody) Close() error {
	if b.timer != nil {
		b.timer.Stop()
	}
	err := b.rc.Close()
	b.cancel(nil)
	return err
}

// ErrIdle is the read error after the engine sent nothing for the idle timeout.
var ErrIdle = errors.New("upstream: engine idle timeout")

// idleBody closes the response body when no byte arrives for d, so a stalled engine cannot hold a request
// forever, while a long stream that keeps sending is never cut.
type idleBody struct {
	rc    io.ReadCloser
	d     time.Duration
	t     *time.Timer
	mu    sync.Mutex
	fired bool
}

func newIdleBody(rc io.ReadCloser, d time.Duration) *idleBody {
	b := &idleBody{rc: rc, d: d}
	b.t = time.AfterFunc(d, func() {
		b.mu.Lock()
		b.fired = true
		b.mu.Unlock()
		rc.Close()
	})
	return b
}

// Read reads and restarts the idle timer on progress; after the timer fired it reports ErrIdle.
func (b *idleBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 {
		b.t.Reset(b.d)
	}
	if err != nil && err != io.EOF {
		b.mu.Lock()
		fired := b.fired
		b.mu.Unlock()
		if fired {
			return n, ErrIdle
		}
	}
	return n, err
}

// Close stops the timer and closes the body (aborting the connection if unread).
func (b *idleBody) Close() error {
	b.t.Stop()
	return b.rc.Close()
}
