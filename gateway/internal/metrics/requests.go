package metrics

import "github.com/prometheus/client_golang/prometheus"

// Requests' latency and the engines' token usage, by model (the served base model) and endpoint (the one
// that answered; a data-parallel rank is "<id>/dp<r>").
type RequestMetrics struct {
	// TTFT observes, for a streamed request the engine accepted (2xx), the time from the request's arrival
	// at the gateway to the first byte of the engine's stream (engines send their first event with the
	// first token), in seconds: kvgate_time_to_first_token_seconds.
	TTFT *prometheus.HistogramVec
	// ITL observes, once per streamed request with at least two tokens, its mean inter-token latency:
	// (time of the stream's last byte − time of its first byte) / (completion tokens − 1), in seconds,
	// completion tokens from the stream's usage when present, else its token events:
	// kvgate_inter_token_latency_seconds.
	ITL *prometheus.HistogramVec
	// Duration observes the time from a request's arrival to the end of its response (the last byte of a
	// stream), for every request routed to an endpoint, whatever the status, in seconds:
	// kvgate_request_duration_seconds.
	Duration *prometheus.HistogramVec
	// UsagePrompt, UsageCached and UsageCompletion add the engine's usage of each answered request:
	// usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens and usage.completion_tokens (the last
	// usage event of a stream; none when the engine reported none): kvgate_usage_*_tokens_total.
	UsagePrompt, UsageCached, UsageCompletion *prometheus.CounterVec
}

// Latency buckets: from 5 ms (a cached short prompt) to 10 min (a long generation).
var (
	ttftBuckets     = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	itlBuckets      = []float64{.001, .0025, .005, .01, .02, .04, .06, .08, .1, .15, .2, .3, .5, 1}
	durationBuckets = []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
)

func newRequestMetrics(r *prometheus.Registry) *RequestMetrics {
	l := []string{"model", "endpoint"}
	m := &RequestMetrics{
		TTFT: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvgate_time_to_first_token_seconds",
			Help: "Request arrival to the first byte of the engine's stream (streamed 2xx requests).", Buckets: ttftBuckets}, l),
		ITL: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvgate_inter_token_latency_seconds",
			Help: "Mean time between tokens of one streamed request (observed once per request).", Buckets: itlBuckets}, l),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvgate_request_duration_seconds",
			Help: "Request arrival to the end of its response, for requests routed to an endpoint.", Buckets: durationBuckets}, l),
		UsagePrompt: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_usage_prompt_tokens_total",
			Help: "Prompt tokens the engines reported (usage.prompt_tokens)."}, l),
		UsageCached: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_usage_cached_tokens_total",
			Help: "Prompt tokens the engines reported served from their prefix cache (usage.prompt_tokens_details.cached_tokens)."}, l),
		UsageCompletion: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_usage_completion_tokens_total",
			Help: "Completion tokens the engines reported (usage.completion_tokens)."}, l),
	}
	r.MustRegister(m.TTFT, m.ITL, m.Duration, m.UsagePrompt, m.UsageCached, m.UsageCompletion)
	return m
}

// Endpoint returns the collectors' children for one (model, endpoint).
func (m *RequestMetrics) Endpoint(model, endpoint string) *EndpointRequestMetrics {
	return &EndpointRequestMetrics{TTFT: m.TTFT.WithLabelValues(model, endpoint), ITL: m.ITL.WithLabelValues(model, endpoint),
		Duration: m.Duration.WithLabelValues(model, endpoint), Prompt: m.UsagePrompt.WithLabelValues(model, endpoint),
		Cached: m.UsageCached.WithLabelValues(model, endpoint), Completion: m.UsageCompletion.WithLabelValues(model, endpoint)}
}

// EndpointRequestMetrics are RequestMetrics' children for one (model, endpoint), resolved once.
type EndpointRequestMetrics struct {
	TTFT, ITL, Duration        prometheus.Observer
	Prompt, Cached, Completion prometheus.Counter
}
