package server

import (
	"context"
	"net/http"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvgate/kvgate/gateway/internal/metrics"
	"github.com/kvgate/kvgate/gateway/internal/route"
	"github.com/kvgate/kvgate/gateway/internal/tracing"
)

// requestCarrier reads a client's W3C trace headers from the fasthttp request.
type requestCarrier struct{ h *fasthttp.RequestHeader }

func (r requestCarrier) Get(k string) string { return string(r.h.Peek(k)) }
func (requestCarrier) Set(string, string)    {}
func (requestCarrier) Keys() []string        { return []string{"traceparent", "tracestate"} }

var _ propagation.TextMapCarrier = requestCarrier{}

// startTrace starts the request's server span, a child of the client's traceparent when it sent one.
func (s *Server) startTrace(ri *reqInfo, h *fasthttp.RequestHeader, path string) {
	if s.o.Tracer == nil {
		return
	}
	pctx := tracing.Propagator.Extract(context.Background(), requestCarrier{h})
	ri.tctx, ri.span = s.o.Tracer.Start(pctx, "kvgate.request", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(ri.start), trace.WithAttributes(attribute.String("kvgate.request_id", ri.id),
			attribute.String("http.route", path)))
}

// planStages are the routing stages in the order route.Plan runs them.
var planStages = []string{metrics.StageTokenize, metrics.StageKeys, metrics.StageMatch, metrics.StageSnapshot, metrics.StageRank}

// traceStages adds a child span per routing stage of plan, laid end to end from begin (the router measures
// each stage; the spans carry its durations).
func (s *Server) traceStages(ri *reqInfo, plan *route.Plan, begin time.Time) {
	if ri.span == nil {
		return
	}
	t := begin
	for _, st := range planStages {
		d, ok := plan.Stages[st]
		if !ok {
			continue
		}
		_, sp := s.o.Tracer.Start(ri.tctx, "route."+st, trace.WithTimestamp(t))
		t = t.Add(d)
		sp.End(trace.WithTimestamp(t))
	}
	ri.span.SetAttributes(attribute.Int("kvgate.prompt_tokens", len(plan.IDs)), attribute.Int("kvgate.candidates", len(plan.Candidates)),
		attribute.String("kvgate.policy", ri.policy), attribute.Bool("kvgate.load_only", plan.LoadOnly))
	if plan.Info.Fallback != "" {
		ri.span.AddEvent("policy_fallback", trace.WithAttributes(attribute.String("reason", plan.Info.Fallback)))
	}
}

// childSpan starts a child of the request span (a no-op span when tracing is off).
func (s *Server) childSpan(ri *reqInfo, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if ri.span == nil {
		return nil, trace.SpanFromContext(context.Background())
	}
	return s.o.Tracer.Start(ri.tctx, name, trace.WithAttributes(attrs...))
}

// injectTrace writes the traceparent of ctx's span into the engine request's headers.
func injectTrace(ctx context.Context, h http.Header) {
	if ctx != nil {
		tracing.Propagator.Inject(ctx, propagation.HeaderCarrier(h))
	}
}

// endTrace ends the request span with the request's outcome.
func (ri *reqInfo) endTrace(status int, end time.Time) {
	if ri.span == nil {
		return
	}
	ri.span.SetAttributes(attribute.String("gen_ai.request.model", ri.model), attribute.String("kvgate.endpoint", ri.endpoint),
		attribute.Int("http.response.status_code", status), attribute.Bool("kvgate.stream", ri.stream),
		attribute.Int("kvgate.retries", ri.retries))
	if ri.use.ok {
		ri.span.SetAttributes(attribute.Int64("gen_ai.usage.input_tokens", ri.use.prompt),
			attribute.Int64("gen_ai.usage.output_tokens", ri.use.completion), attribute.Int64("kvgate.cached_tokens", ri.use.cached))
	}
	if !ri.first.IsZero() {
		ri.span.AddEvent("first_byte", trace.WithTimestamp(ri.first))
	}
	if status >= 500 {
		ri.span.SetStatus(codes.Error, http.StatusText(status))
	}
	ri.span.End(trace.WithTimestamp(end))
}
