// Package metrics declares the gateway's Prometheus metrics on a registry of its own (no package globals,
// so several gateways can live in one test process). Names follow Prometheus base units: _seconds, _tokens,
// _total.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Routing stages, the "stage" label of kvgate_routing_stage_seconds.
const (
	StageTokenize = "tokenize"
	StageKeys     = "keys"
	StageMatch    = "match"
	StageSnapshot = "snapshot"
	StageRank     = "rank"
	StageReserve  = "reserve" // including time queued for capacity
	StageRecord   = "record"
	StageTotal    = "total" // accept to first upstream byte sent
)

// Metrics holds every collector. Create with New.
type Metrics struct {
	// Registry holds every collector below; the server serves it on /metrics.
	Registry *prometheus.Registry

	// Requests counts finished client requests (generation APIs) by model (the served base model, or
	// "unknown" for a model not served: never the client's string), endpoint ("" when none was chosen) and
	// status code: the one the client got, the gateway's own 4xx included, or 499 when the client went away
	// before the response ended.
	Requests *prometheus.CounterVec
	// Stage observes routing latency per stage.
	Stage *prometheus.HistogramVec
	// PromptTokens counts routed prompt tokens per model; MatchedTokens counts those the chosen endpoint
	// already held, by tier (GPU, CPU). Prefix match rate = sum(matched) / prompt.
	PromptTokens  *prometheus.CounterVec
	MatchedTokens *prometheus.CounterVec
	// PolicyFallbacks counts rankings that fell back to the native three-tier, by model and reason.
	PolicyFallbacks *prometheus.CounterVec
	// ReservationRefusals counts Reserve calls that found no capacity (each retry while queued counts).
	ReservationRefusals *prometheus.CounterVec
	// QueueTimeouts counts requests answered 429 after their queue wait.
	QueueTimeouts *prometheus.CounterVec
	// Queued is this gateway's requests waiting for capacity (refused at least once, within queue_timeout).
	Queued *prometheus.GaugeVec
	// UpstreamRetries counts retries on the next ranked endpoint after a failure before the first byte.
	UpstreamRetries *prometheus.CounterVec
	// ClientDisconnects counts requests whose client went away before the response ended.
	ClientDisconnects *prometheus.CounterVec
	// InFlight is this gateway's requests in flight per endpoint.
	InFlight *prometheus.GaugeVec
	// EndpointWaiting, EndpointRunning, EndpointKVCacheUsage and EndpointHealthy mirror the scraped state.
	EndpointWaiting      *prometheus.GaugeVec
	EndpointRunning      *prometheus.GaugeVec
	EndpointKVCacheUsage *prometheus.GaugeVec
	EndpointHealthy      *prometheus.GaugeVec
	// StoreDown is 1 while the shared store is unreachable (load-only routing, local reservations).
	StoreDown prometheus.Gauge
	// StoreErrors counts failed store operations by op.
	StoreErrors *prometheus.CounterVec
	// LoadOnlyRoutes counts requests routed without the index (store down).
	LoadOnlyRoutes *prometheus.CounterVec
	// Front holds the front-door collectors (connections, timeouts, ejections; frontdoor.go).
	Front *FrontDoor
	// Req holds the request latency histograms and the engines' token usage (requests.go).
	Req *RequestMetrics
}

// New creates the collectors and registers them, plus the Go and process collectors, on a new registry.
func New() *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{Registry: r,
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_requests_total",
			Help: "Client requests by model, endpoint and HTTP status."}, []string{"model", "endpoint", "status"}),
		Stage: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvgate_routing_stage_seconds",
			Help:    "Routing latency per stage.",
			Buckets: []float64{5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}},
			[]string{"stage"}),
		PromptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_prompt_tokens_total",
			Help: "Prompt tokens routed."}, []string{"model"}),
		MatchedTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_matched_tokens_total",
			Help: "Prompt tokens the chosen endpoint already held, by tier."}, []string{"model", "tier"}),
		PolicyFallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_policy_fallbacks_total",
			Help: "Rankings that fell back to the native three-tier policy."}, []string{"model", "reason"}),
		ReservationRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_reservation_refusals_total",
			Help: "Reservations refused because every candidate was at capacity."}, []string{"model"}),
		QueueTimeouts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_queue_timeouts_total",
			Help: "Requests answered 429 after waiting queue_timeout for capacity."}, []string{"model"}),
		Queued: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvgate_requests_queued",
			Help: "This gateway's requests waiting for capacity (every candidate was full at least once)."}, []string{"model"}),
		UpstreamRetries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_upstream_retries_total",
			Help: "Requests retried on the next ranked endpoint after a failure before the first byte."}, []string{"endpoint"}),
		ClientDisconnects: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_client_disconnects_total",
			Help: "Requests whose client disconnected before the response ended."}, []string{"model", "stream"}),
		InFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvgate_endpoint_inflight_requests",
			Help: "Requests this gateway has in flight per endpoint."}, []string{"endpoint"}),
		EndpointWaiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvgate_endpoint_waiting_requests",
			Help: "Engine-reported queued requests (last scrape)."}, []string{"endpoint"}),
		EndpointRunning: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvgate_endpoint_running_requests",
			Help: "Engine-reported running requests (last scrape)."}, []string{"endpoint"}),
		EndpointKVCacheUsage: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvgate_endpoint_kv_cache_utilization",
			Help: "Engine-reported KV-cache utilization, fraction in [0,1] (last scrape)."}, []string{"endpoint"}),
		EndpointHealthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvgate_endpoint_healthy",
			Help: "1 when the endpoint passed its last health probe."}, []string{"endpoint"}),
		StoreDown: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvgate_store_down",
			Help: "1 while the shared store is unreachable (load-only routing, local reservations)."}),
		StoreErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_store_errors_total",
			Help: "Failed store operations."}, []string{"op"}),
		LoadOnlyRoutes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_load_only_routes_total",
			Help: "Requests routed on load alone because the store was unreachable."}, []string{"model"}),
	}
	r.MustRegister(m.Requests, m.Stage, m.PromptTokens, m.MatchedTokens, m.PolicyFallbacks, m.ReservationRefusals,
		m.QueueTimeouts, m.Queued, m.UpstreamRetries, m.ClientDisconnects, m.InFlight, m.EndpointWaiting, m.EndpointRunning,
		m.EndpointKVCacheUsage, m.EndpointHealthy, m.StoreDown, m.StoreErrors, m.LoadOnlyRoutes,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.Front = newFrontDoor(r)
	m.Req = newRequestMetrics(r)
	return m
}

// InitModel creates the per-model and per-endpoint series at zero so dashboards see them before the first
// event (Prometheus vectors export nothing until a label set is used). reasons are the policy fallback
// reasons.
func (m *Metrics) InitModel(model string, endpoints, reasons []string) {
	m.PromptTokens.WithLabelValues(model)
	m.MatchedTokens.WithLabelValues(model, "GPU")
	m.MatchedTokens.WithLabelValues(model, "CPU")
	m.ReservationRefusals.WithLabelValues(model)
	m.QueueTimeouts.WithLabelValues(model)
	m.Queued.WithLabelValues(model)
	m.LoadOnlyRoutes.WithLabelValues(model)
	m.ClientDisconnects.WithLabelValues(model, "true")
	m.ClientDisconnects.WithLabelValues(model, "false")
	for _, r := range reasons {
		m.PolicyFallbacks.WithLabelValues(model, r)
	}
	for _, e := range endpoints {
		m.UpstreamRetries.WithLabelValues(e)
		m.InFlight.WithLabelValues(e)
		m.Req.Endpoint(model, e)
	}
}
