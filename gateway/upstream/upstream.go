// Package upstream sends a routed request to one endpoint: it builds the body the endpoint's engine kind
// takes (token IDs spliced in out of band where the engine accepts them, the client's bytes otherwise) and
// posts it over pooled keep-alive connections, cancellable through its context (a cancelled context closes
// the upstream connection, which makes vLLM/SGLang abort the generation).
//
// The client is net/http's, not fasthttp's: see gateway/RATIONALE.md "Why net/http for upstream?".
package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/gateway/openai"
)

// Body returns the bytes to send to an engine of kind (config.EngineSim, EngineVLLM, EngineSGLang) for a
// request parsed as req from body, given its prompt token IDs (nil when unknown):
//   - enginesim chat: body with "prompt_token_ids" spliced in (unless the client sent its own);
//   - enginesim and vllm completions: body with "prompt" replaced by the token IDs (single prompts only);
//   - everything else: body as sent.
func Body(kind string, req *openai.Request, body []byte, ids []uint32) ([]byte, error) {
	if ids == nil {
		return body, nil
	}
	switch {
	case kind == config.EngineSim && req.API == openai.Chat && !req.HasPromptTokenIDs:
		return openai.SpliceChatTokenIDs(body, ids), nil
	case (kind == config.EngineSim || kind == config.EngineVLLM) && req.API == openai.Completions && !req.PromptIsIDs && req.SinglePrompt:
		return openai.SpliceCompletionPrompt(body, ids)
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
	hc   *http.Client
	idle time.Duration
}

// New returns a Client whose responses fail when the engine sends nothing for idle (0: never). There is no
// total timeout.
func New(idle time.Duration) *Client {
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          4096,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: idle,
		DisableCompression:    true, // pass the engine's bytes through; SSE must not be buffered by gzip
		ForceAttemptHTTP2:     false,
		WriteBufferSize:       64 << 10,
		ReadBufferSize:        32 << 10,
	}
	return &Client{hc: &http.Client{Transport: tr}, idle: idle}
}

// HTTP returns the underlying client (used for the endpoints' /metrics and /health scrapes, sharing the
// connection pool).
func (c *Client) HTTP() *http.Client { return c.hc }

// ErrBeforeResponse wraps a failure that happened before any response byte arrived: the request may be
// retried on another endpoint.
var ErrBeforeResponse = errors.New("upstream: failed before the response")

// hopHeaders are not forwarded (RFC 9110 §7.6.1) or are recomputed.
var hopHeaders = map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Connection": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Host": true,
	"Content-Length": true, "Accept-Encoding": true, "Proxy-Authorization": true}

// Post sends body to baseURL+path with the client's headers hdr (hop-by-hop headers dropped; Authorization
// dropped when dropAuth). The response's headers have arrived when it returns; its Body reads fail with
// context.Canceled after ctx ends and with an idle-timeout error after the engine stalls. A reused keep-alive
// connection that the engine had closed is retried once transparently. Errors wrap ErrBeforeResponse.
func (c *Client) Post(ctx context.Context, baseURL, path string, body []byte, hdr http.Header, dropAuth bool) (*http.Response, error) {
	url := strings.TrimRight(baseURL, "/") + path
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBeforeResponse, err)
		}
		for k, vs := range hdr {
			if hopHeaders[k] || (dropAuth && k == "Authorization") {
				continue
			}
			req.Header[k] = vs
		}
		if req.Header.Get("Content-Type") == "" {
			req.Header.Set("Content-Type", "application/json")
		}
		var reused bool
		req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
		}))
		resp, err := c.hc.Do(req)
		if err == nil {
			if c.idle > 0 {
				resp.Body = newIdleBody(resp.Body, c.idle)
			}
			return resp, nil
		}
		if reused && attempt == 0 && ctx.Err() == nil {
			continue // a stale keep-alive connection: the engine never saw this request
		}
		return nil, fmt.Errorf("%w: %v", ErrBeforeResponse, err)
	}
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
