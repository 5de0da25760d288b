// Package tracing sets up OpenTelemetry traces for the gateway: an SDK tracer provider exporting OTLP over
// HTTP/protobuf (the collector's port 4318, path /v1/traces), parent-based sampling at a ratio, and the
// W3C Trace Context propagator (traceparent/tracestate) the server reads from clients and writes to
// engines. Off unless the config has `tracing:`.
package tracing

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// Propagator is the W3C Trace Context propagator (traceparent, tracestate).
var Propagator = propagation.TraceContext{}

// Provider is a running tracer provider; Shutdown flushes the spans not yet exported.
type Provider struct {
	tp *sdktrace.TracerProvider
}

// Options configure New.
type Options struct {
	// Endpoint is the OTLP/HTTP traces URL, e.g. http://collector:4318/v1/traces (http: without TLS).
	Endpoint string
	// SampleRatio is the share of new traces sampled (0..1]; a client's sampled flag is followed.
	SampleRatio float64
	// ServiceName is the service.name resource attribute.
	ServiceName string
	// BatchTimeout is the longest a finished span waits before export (0: the SDK's 5 s).
	BatchTimeout time.Duration
}

// New starts a provider exporting to o.Endpoint (nothing is sent until spans end).
func New(ctx context.Context, o Options) (*Provider, error) {
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(o.Endpoint))
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res := resource.NewSchemaless(semconv.ServiceName(o.ServiceName))
	var bo []sdktrace.BatchSpanProcessorOption
	if o.BatchTimeout > 0 {
		bo = append(bo, sdktrace.WithBatchTimeout(o.BatchTimeout))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, bo...), sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SampleRatio))))
	return &Provider{tp: tp}, nil
}

// Tracer returns the gateway's tracer.
func (p *Provider) Tracer() trace.Tracer { return p.tp.Tracer("github.com/kvgate/kvgate/gateway") }

// Shutdown exports what is left and stops the exporter (bounded by ctx).
func (p *Provider) Shutdown(ctx context.Context) error { return p.tp.Shutdown(ctx) }
