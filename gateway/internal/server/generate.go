package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/tidwall/gjson"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/kvgate/kvgate/gateway/internal/openai"
	"github.com/kvgate/kvgate/gateway/internal/route"
	"github.com/kvgate/kvgate/gateway/internal/upstream"
)

// generate serves the generation APIs (POST /v1/chat/completions, /v1/completions, /v1/responses,
// /v1/embeddings) as named steps: parse → admit → plan → reserve and forward (retried on another endpoint
// while nothing reached the client) → relay (stream or whole). Every path ends in genRequest.done, the one
// owner of the request's cleanup.
func (s *Server) generate(api openai.API) fiber.Handler {
	return func(c *fiber.Ctx) error {
		g := &genRequest{s: s, c: c, api: api}
		if err := g.parse(); err != nil {
			return err
		}
		if err := g.admit(); err != nil {
			return g.fail(err)
		}
		if err := g.plan(); err != nil {
			return g.fail(err)
		}
		if err := g.reserveAndForward(); err != nil {
			return g.fail(err)
		}
		return g.relay()
	}
}

// errClientGone ends a request whose client went away before its response started.
var errClientGone = errors.New("client closed the request")

// genRequest is one generation request from its parse to its end.
type genRequest struct {
	s   *Server
	c   *fiber.Ctx
	api openai.API
	ri  *reqInfo
	log reqLog
	// body is the client's body (a copy: Fiber reuses its buffers and the stream writer outlives the
	// handler); req its parse, sm its served model.
	body []byte
	req  *openai.Request
	sm   ServedModel
	// Set by admit: ctx ends when the client goes away (watch) or at Shutdown.
	ctx       context.Context
	cancel    context.CancelFunc
	stopWatch func()
	relClient func()
	admitted  bool
	p         *route.Plan
	// Set by reserveAndForward on success: the lease and the engine's response, released by done.
	claim *route.Claim
	resp  *http.Response
	epID  string
	// stopRenew stops the lease renewal the relay starts.
	stopRenew func()
	doneOnce  sync.Once
}

// done ends the request once: it stops the lease renewal and the client watch, cancels the engine
// request, releases the client slot, the engine response and the lease, writes the request's metrics and
// access line (status; StatusClientClosed when disconnected) and, last, stops counting it as active.
func (g *genRequest) done(status int, disconnected bool) {
	g.doneOnce.Do(func() {
		if g.stopRenew != nil {
			g.stopRenew()
		}
		if g.admitted {
			g.stopWatch()
			g.cancel()
			g.relClient()
		}
		if g.resp != nil {
			g.resp.Body.Close()
		}
		if g.claim != nil {
			g.s.o.Router.Release(g.claim)
		}
		if disconnected {
			status = StatusClientClosed
		}
		g.s.end(g.ri, status)
		if disconnected {
			g.s.o.Metrics.ClientDisconnects.WithLabelValues(g.sm.Model.Name, strconv.FormatBool(g.req.Stream)).Inc()
		}
		if g.admitted {
			g.s.active.Add(-1)
		}
	})
}

// fail ends the request with err's answer (RouteError's; nothing for errClientGone, counted as
// StatusClientClosed). A 429 or 503 carries Retry-After.
func (g *genRequest) fail(err error) error {
	if errors.Is(err, errClientGone) {
		g.done(0, true)
		return nil
	}
	oe := RouteError(g.ri.model, err)
	g.done(oe.Status, false)
	if oe.Status == http.StatusTooManyRequests || oe.Status == http.StatusServiceUnavailable {
		// Every endpoint stayed full for the queue timeout, or none is healthy: a client (the OpenAI SDKs
		// honour it) should wait before retrying rather than retry at once.
		g.c.Set(fiber.HeaderRetryAfter, strconv.Itoa(RetryAfterSeconds))
	}
	return sendError(g.c, oe)
}

// parse reads the body and finds its served model; a request it refuses is ended here (its error is
// returned for the error handler to answer).
func (g *genRequest) parse() error {
	s, c := g.s, g.c
	g.ri = &reqInfo{id: requestID(c), start: time.Now(), label: UnknownModel, chat: g.api == openai.Chat}
	g.log = reqLog{s.o.Log, g.ri.id}
	s.startTrace(g.ri, &c.Request().Header, g.api.Path())
	g.body = bytes.Clone(c.Body())
	req, err := openai.ParseRequest(g.api, g.body)
	if err != nil {
		g.ri.model = clip(gjson.GetBytes(g.body, "model").Str)
		g.ri.label = s.modelLabel(g.ri.model)
		g.req = &openai.Request{}
		g.done(http.StatusBadRequest, false)
		return err
	}
	g.req = req
	g.ri.model, g.ri.stream = clip(req.Model), req.Stream
	sm, ok := s.o.Models[req.Model]
	if !ok {
		g.done(http.StatusNotFound, false)
		return openai.ModelNotFound(req.Model)
	}
	g.sm = sm
	g.ri.label = sm.Model.Name
	if req.Prompts > s.o.Config.MaxBatchPrompts {
		g.done(http.StatusBadRequest, false)
		return openai.Errorf(http.StatusBadRequest, "invalid_request_error", "prompt", "batch_too_large",
			"The batch has %d prompts; at most %d (max_batch_prompts) are accepted.", req.Prompts, s.o.Config.MaxBatchPrompts)
	}
	return nil
}

// admit takes the client's slot (max_connections_per_ip behind a trusted proxy) and starts watching the
// client connection; from here the request counts as active.
func (g *genRequest) admit() error {
	s, c := g.s, g.c
	rel, ok := s.clients.acquire(c)
	if !ok {
		return openai.Errorf(http.StatusTooManyRequests, "rate_limit_error", "", "too_many_requests",
			"Too many concurrent requests from this client (max_connections_per_ip).")
	}
	g.ctx, g.cancel = context.WithCancel(s.base)
	g.stopWatch = watch(c.Context().Conn(), g.cancel)
	g.relClient = rel
	g.admitted = true
	s.active.Add(1)
	return nil
}

// plan ranks the model's endpoints for the request (tokenizing its prompt).
func (g *genRequest) plan() error {
	planStart := time.Now()
	p, err := g.s.o.Router.Plan(g.ctx, g.sm.Model, g.sm.LoRA, RouteRequest(g.req), g.body)
	if err != nil {
		return err
	}
	g.s.traceStages(g.ri, p, planStart)
	g.p = p
	g.ri.prompt = len(p.IDs)
	g.ri.policy = route.ShortVersion(p.Info.Policy)
	return nil
}

// reserveAndForward reserves the best candidate not yet excluded and sends it the request until an
// engine answers with a status that is not retried, or no endpoint is left: an engine that refused the
// request (retry_on_status) or that could not be reached before the request was written (retry_on_connect)
// is excluded with its other data-parallel ranks, within the retry budget. A request that was written is
// never sent again. On success g.claim, g.resp and g.epID are set.
func (g *genRequest) reserveAndForward() error {
	s, ri, p := g.s, g.ri, g.p
	hdr := clientHeaders(g.c)
	hdr.Set(HeaderRequestID, ri.id)
	exclude := map[int]bool{}
	s.retries.deposit()
	for {
		_, rspan := s.childSpan(ri, "route.reserve")
		claim, err := s.o.Router.Reserve(g.ctx, p, exclude)
		rspan.End()
		if err != nil {
			if g.ctx.Err() != nil {
				return errClientGone
			}
			return err
		}
		if len(exclude) == 0 {
			s.o.Router.Record(g.ctx, p, claim)
		}
		cand := p.Candidates[claim.Index]
		resp, err := g.forward(cand, hdr)
		if err == nil {
			if resp.StatusCode >= 500 {
				s.outlierFailure(g.sm.Model, cand.EngineID())
			} else {
				s.outlierSuccess(cand.EngineID())
			}
			retried := s.o.Config.RetryOnStatus(resp.StatusCode)
			if retried {
				g.excludeEngine(exclude, claim.Index, cand)
			}
			if !retried || !g.retry(exclude, claim.Index) {
				g.claim, g.resp, g.epID = claim, resp, cand.ID
				ri.endpoint = cand.ID
				return nil
			}
			// The engine refused the request (e.g. 503 overloaded, 429): it did not run it, so another
			// endpoint may. Nothing has been sent to the client yet.
			g.log.Warn("engine refused the request; trying the next ranked endpoint", slog.String("endpoint_id", cand.ID),
				slog.Int("status", resp.StatusCode))
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			s.o.Router.Release(claim)
			s.o.Metrics.UpstreamRetries.WithLabelValues(cand.ID).Inc()
			ri.retries++
			continue
		}
		s.o.Router.Release(claim)
		ri.endpoint = cand.ID
		if again, ferr := g.forwardFailed(cand, claim.Index, exclude, err); !again {
			return ferr
		}
		s.o.Metrics.UpstreamRetries.WithLabelValues(cand.ID).Inc()
		ri.retries++
		ri.endpoint = ""
	}
}

// retry excludes the candidate at idx and says whether another may be tried: one is left and the retry
// budget allows it.
func (g *genRequest) retry(exclude map[int]bool, idx int) bool {
	exclude[idx] = true
	if len(exclude) >= len(g.p.Candidates) {
		return false
	}
	if !g.s.retries.withdraw() {
		g.s.o.Metrics.Front.RetryBudgetExhausted.Inc()
		return false
	}
	return true
}

// excludeEngine excludes the other candidates of cand's engine (one API server fronts every
// data-parallel rank of an engine).
func (g *genRequest) excludeEngine(exclude map[int]bool, idx int, cand route.Candidate) {
	for i, c := range g.p.Candidates {
		if i != idx && c.EngineID() == cand.EngineID() {
			exclude[i] = true
		}
	}
}

// forward builds cand's body and headers and sends it the request (its headers have arrived when it
// returns). A body that cannot be built fails with a 400 (*openai.Error, not retried).
func (g *genRequest) forward(cand route.Candidate, hdr http.Header) (*http.Response, error) {
	s, ri, req := g.s, g.ri, g.req
	var out []byte
	var err error
	if s.o.EngineBody != nil {
		out, err = s.o.EngineBody(req, g.p, cand, g.body)
	} else {
		out, err = upstream.Body(cand.Engine, req, g.body, g.p.IDs)
	}
	if err != nil {
		g.log.Warn("cannot build the engine request body", slog.String("endpoint_id", cand.ID), slog.String("error", err.Error()))
		return nil, &bodyError{openai.BadRequest("prompt", "The prompt could not be forwarded with its token IDs.")}
	}
	s.total.Observe(time.Since(ri.start).Seconds())
	uh, drop := upstream.WithRank(hdr, cand.DataParallelRank()), len(s.secrets.ClientAPIKeys) > 0
	if key, ok := s.secrets.EndpointKeys[cand.EngineID()]; ok {
		// The engine's own API key (api_key_env) replaces whatever the client sent.
		uh = uh.Clone()
		uh.Set(fiber.HeaderAuthorization, "Bearer "+key)
		drop = false
	}
	uctx, uspan := s.childSpan(ri, "upstream", attribute.String("kvgate.endpoint", cand.ID), attribute.Int("kvgate.attempt", ri.retries))
	if uctx != nil {
		uh = uh.Clone()
		injectTrace(uctx, uh) // the engine's span is a child of this one
	}
	resp, err := s.o.Upstream.Do(g.ctx, upstream.Request{BaseURL: cand.URL, Path: g.api.Path(), Body: out, Header: uh,
		DropAuth: drop, Stream: req.Stream})
	if err != nil {
		uspan.SetStatus(codes.Error, err.Error())
	} else {
		uspan.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
	}
	uspan.End()
	return resp, err
}

// bodyError is forward's failure to build an engine body: answered as is, never retried.
type bodyError struct{ e *openai.Error }

func (b *bodyError) Error() string { return b.e.Error() }
func (b *bodyError) Unwrap() error { return b.e }

// forwardFailed handles a failed send to cand (its lease already released): it says whether another
// endpoint may be tried, and otherwise the error to end the request with.
func (g *genRequest) forwardFailed(cand route.Candidate, idx int, exclude map[int]bool, err error) (again bool, _ error) {
	s, req := g.s, g.req
	if be, ok := errors.AsType[*bodyError](err); ok {
		return false, be.e
	}
	if g.ctx.Err() != nil {
		return false, errClientGone
	}
	var ue *upstream.Error
	errors.As(err, &ue)
	started := ue == nil || ue.Started
	s.outlierFailure(g.sm.Model, cand.EngineID())
	if ue != nil && ue.Timeout != nil {
		s.o.Metrics.Front.UpstreamTimeouts.WithLabelValues(cand.ID, timeoutKind(ue.Timeout)).Inc()
	}
	if started {
		// The engine may have run the request: never send it again (one request, one generation).
		g.log.Warn("upstream failed after the request was sent; not retried", slog.String("endpoint_id", cand.ID),
			slog.String("error", err.Error()))
		if ue != nil && ue.Timeout != nil {
			return false, upstreamTimeout(req.Model)
		}
		return false, openai.Upstream("The engine failed before responding.")
	}
	g.log.Warn("upstream failed before the request was sent", slog.String("endpoint_id", cand.ID), slog.String("error", err.Error()))
	s.o.Endpoints.MarkDown(cand.EngineID(), err.Error())
	g.excludeEngine(exclude, idx, cand) // the other data-parallel ranks of that engine are down too
	if !s.o.Config.RetryOnConnect() || !g.retry(exclude, idx) {
		// The details (engine URLs, socket errors) are in the log above, not for the client.
		if ue != nil && ue.Timeout != nil {
			return false, upstreamTimeout(req.Model)
		}
		return false, openai.Upstream(fmt.Sprintf("Every endpoint tried for `%s` failed before responding.", req.Model))
	}
	return true, nil
}

// relay renews the lease while the engine's response runs and passes it to the client: its status and
// headers, then the body whole or, for a stream, event by event.
func (g *genRequest) relay() error {
	s, c, resp := g.s, g.c, g.resp
	epID := g.epID
	g.stopRenew = every(max(s.o.Router.LeaseTTL()/3, 100*time.Millisecond), func() bool {
		if err := s.o.Router.Renew(g.ctx, g.claim); err != nil && g.ctx.Err() == nil {
			g.log.Warn("lease renewal failed", slog.String("endpoint_id", epID), slog.String("error", err.Error()))
		}
		return true
	})
	c.Status(resp.StatusCode)
	for k, vs := range resp.Header {
		if skipRespHeader[k] || corsSkip[k] {
			continue
		}
		for _, v := range vs {
			c.Response().Header.Add(k, v)
		}
	}
	c.Set(HeaderEndpoint, epID)
	c.Set(HeaderPolicy, route.ShortVersion(g.p.Info.Policy))
	if g.p.Info.Fallback != "" {
		c.Set(HeaderFallback, g.p.Info.Fallback)
	}
	setRouting(c, g.p)
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	// A stream:true request is relayed as a stream whatever the engine's content type (an engine's own
	// error answer to it is passed through whole); an SSE answer is always streamed.
	if sse || (g.req.Stream && resp.StatusCode < 300) {
		return g.relayStream()
	}
	return g.relayWhole()
}

// relayWhole reads the engine's whole response (the watcher keeps polling the client meanwhile) and
// sends it.
func (g *genRequest) relayWhole() error {
	s, c, resp, epID := g.s, g.c, g.resp, g.epID
	b, rerr := io.ReadAll(resp.Body)
	if rerr != nil {
		disc := g.ctx.Err() != nil
		e := openai.Upstream("The engine's response failed before it ended.")
		if to := bodyTimeout(rerr); to != nil && !disc {
			e = upstreamTimeout(g.req.Model)
			s.o.Metrics.Front.UpstreamTimeouts.WithLabelValues(epID, timeoutKind(to)).Inc()
		}
		g.done(e.Status, disc)
		if disc {
			return nil
		}
		s.o.Metrics.Front.UpstreamFailures.WithLabelValues(epID).Inc()
		c.Response().Header.Del(fiber.HeaderContentType)
		g.log.Warn("engine response failed", slog.String("endpoint_id", epID), slog.String("error", rerr.Error()))
		return sendError(c, e)
	}
	if resp.StatusCode < 300 {
		g.ri.use = parseUsage(gjson.GetBytes(b, "usage"))
	}
	g.done(resp.StatusCode, false)
	return c.Send(b)
}

// relayStream hands the response to fasthttp's body stream writer, which outlives the handler and ends
// the request (done) when the stream ends, fails or the client goes away.
func (g *genRequest) relayStream() error {
	c := g.c
	c.Set(fiber.HeaderCacheControl, "no-cache")
	c.Set("X-Accel-Buffering", "no") // nginx and its kin must not buffer the stream
	// The fiber.Ctx is released when the handler returns; the conn lives on.
	st := &streamRelay{g: g, conn: c.Context().Conn(),
		writeTimeout: g.s.o.Config.ClientWriteTimeout, validate: g.resp.StatusCode < 300,
		sc: streamScan{responses: g.api == openai.Responses}}
	c.Context().SetBodyStreamWriter(st.run)
	return nil
}

// streamRelay copies one engine stream to the client, flushing after every read.
type streamRelay struct {
	g            *genRequest
	conn         interface{ SetWriteDeadline(time.Time) error }
	w            *bufio.Writer
	writeTimeout time.Duration
	validate     bool // a 2xx stream: checked for a finish and its usage taken
	sc           streamScan
	tail         streamTail
}

func (r *streamRelay) run(w *bufio.Writer) {
	g := r.g
	r.w = w
	ri, resp, epID := g.ri, g.resp, g.epID
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			ri.last = time.Now()
			if ri.first.IsZero() {
				ri.first = ri.last
			}
			ri.events += tokenEvents(buf[:n])
			r.tail.add(buf[:n])
			r.sc.scan(buf[:n])
			// A client that accepts nothing for client_write_timeout is disconnected: the write fails, the
			// engine request is cancelled and the lease released.
			r.deadline()
			if _, werr := w.Write(buf[:n]); werr != nil {
				g.done(resp.StatusCode, true)
				return
			}
			if werr := w.Flush(); werr != nil {
				g.done(resp.StatusCode, true)
				return
			}
		}
		if rerr == io.EOF {
			r.takeUsage()
			switch {
			case !r.validate:
				g.done(resp.StatusCode, false)
			case r.sc.sawError:
				g.log.Warn("engine stream carried an error event", slog.String("endpoint_id", epID))
				r.endWithError("")
			case !r.sc.finished():
				g.log.Warn("engine stream ended without a finish reason or [DONE]", slog.String("endpoint_id", epID))
				r.endWithError("The engine's stream ended before it finished.")
			default:
				g.done(resp.StatusCode, false)
			}
			return
		}
		if rerr != nil {
			if g.ctx.Err() != nil {
				g.done(http.StatusBadGateway, true)
				return
			}
			// The engine failed mid-stream: end the stream with an error event (never retried).
			g.log.Warn("engine stream failed", slog.String("endpoint_id", epID), slog.String("error", rerr.Error()))
			if to := bodyTimeout(rerr); to != nil {
				g.s.o.Metrics.Front.UpstreamTimeouts.WithLabelValues(epID, timeoutKind(to)).Inc()
			}
			if r.sc.finished() && !r.sc.sawError {
				r.takeUsage()
				g.done(resp.StatusCode, false) // everything was delivered; only the close was unclean
				return
			}
			r.endWithError("The engine's stream failed before it ended.")
			return
		}
	}
}

func (r *streamRelay) deadline() {
	if r.writeTimeout > 0 && r.conn != nil {
		r.conn.SetWriteDeadline(time.Now().Add(r.writeTimeout))
	}
}

// takeUsage takes the stream's usage before the request ends.
func (r *streamRelay) takeUsage() {
	if r.validate {
		r.g.ri.use = r.tail.usage()
	}
}

// endWithError ends a stream that failed or ended unfinished with one error event (none when the engine
// already sent one) and counts it as an upstream failure.
func (r *streamRelay) endWithError(msg string) {
	r.g.s.o.Metrics.Front.UpstreamFailures.WithLabelValues(r.g.epID).Inc()
	if !r.sc.sawError {
		e := openai.Upstream(msg)
		r.deadline()
		r.w.WriteString("data: ")
		r.w.Write(e.JSON())
		r.w.WriteString("\n\n")
		r.w.Flush()
	}
	r.g.done(http.StatusBadGateway, false)
}
