package sim

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are one engine's Prometheus collectors, on the engine's own registry (several engines can run in
// one process). Names, types and label model_name follow vLLM (vllm/v1/metrics/loggers.py; offload
// counters from the OffloadingConnector's metrics.py); enginesim:* are the simulator's own.
type metrics struct {
	reg *prometheus.Registry

	// running, waiting and usage are the load gauges a router scrapes: with vLLM's names, one series per
	// engine core labelled engine="<data-parallel rank>" (engine="0" without ranks), as vLLM's
	// PrometheusStatLogger labels them; with SGLang's, one series (ranks summed). See loadGauges.
	running, waiting, usage       *prometheus.GaugeVec
	perEngine                     bool
	peakRunning, peakInFlight     prometheus.Gauge
	prefixQueries, prefixHits     prometheus.Counter
	externalQueries, externalHits prometheus.Counter
	promptTokens, generationToks  prometheus.Counter
	ttft, e2e, queueTime, itl     prometheus.Observer
	offloadBytes                  *prometheus.CounterVec
	offloadTime                   *prometheus.CounterVec
	cancelled                     prometheus.Counter
	requests                      *prometheus.CounterVec
	eventBatches                  prometheus.Counter
	eventBatchesDropped           prometheus.Counter
	faults                        *prometheus.CounterVec
	startTime                     prometheus.Gauge
}

// vLLM's histogram buckets (vllm/v1/metrics/loggers.py).
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
		7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	latencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
		60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
	itlBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
		7.5, 10.0, 20.0, 40.0, 80.0}
)

// newMetrics builds one engine's collectors. With api APISGLang the three load gauges a router scrapes carry
// SGLang's names (sglang:num_running_reqs, sglang:num_queue_reqs, sglang:token_usage: the ones
// gateway/internal/endpoints reads for SGLang) instead of vLLM's; the other series keep vLLM's names.
func newMetrics(modelName, api string) *metrics {
	reg := prometheus.NewRegistry()
	l := prometheus.Labels{"model_name": modelName}
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: l})
		reg.MustRegister(g)
		return g
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: l})
		reg.MustRegister(c)
		return c
	}
	hist := func(name, help string, buckets []float64) prometheus.Observer {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: l, Buckets: buckets})
		reg.MustRegister(h)
		return h
	}
	gaugeVec := func(name, help string, labels ...string) *prometheus.GaugeVec {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: l}, labels)
		reg.MustRegister(g)
		return g
	}
	counterVec := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: l}, labels)
		reg.MustRegister(c)
		return c
	}
	m := &metrics{reg: reg}
	// The Prometheus client's process collector exports process_start_time_seconds for a vLLM process;
	// engines sharing one process here each report their own start (a restart fault moves it), which is
	// what a gateway reads to tell an engine restart from a reconnect. No model_name label, as in vLLM.
	m.startTime = prometheus.NewGauge(prometheus.GaugeOpts{Name: "process_start_time_seconds",
		Help: "Start time of the process since unix epoch in seconds."})
	reg.MustRegister(m.startTime)
	if api == APISGLang {
		m.running = gaugeVec("sglang:num_running_reqs", "The number of running requests.")
		m.waiting = gaugeVec("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
		m.usage = gaugeVec("sglang:token_usage", "The token usage.")
	} else {
		m.perEngine = true
		m.running = gaugeVec("vllm:num_requests_running", "Number of requests in model execution batches.", "engine")
		m.waiting = gaugeVec("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "engine")
		m.usage = gaugeVec("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "engine")
	}
	m.peakRunning = gauge("enginesim:peak_running_requests", "Highest number of requests ever running at once (at most --max-num-seqs).")
	m.peakInFlight = gauge("enginesim:peak_inflight_requests", "Highest number of requests ever held at once, running plus waiting (what clients sent concurrently).")
	m.prefixQueries = counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.")
	m.prefixHits = counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.")
	m.externalQueries = counter("vllm:external_prefix_cache_queries_total", "External (CPU offload tier) prefix cache queries, in tokens.")
	m.externalHits = counter("vllm:external_prefix_cache_hits_total", "External (CPU offload tier) prefix cache hits, in tokens.")
	m.promptTokens = counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.")
	m.generationToks = counter("vllm:generation_tokens_total", "Number of generation tokens processed.")
	m.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds (simulated model time).", ttftBuckets)
	m.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds (simulated model time).", latencyBuckets)
	m.queueTime = hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request (simulated model time).", latencyBuckets)
	m.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds (simulated model time).", itlBuckets)
	m.offloadBytes = counterVec("vllm:kv_offload_total_bytes", "Bytes moved between the GPU and the CPU offload tier.", "transfer_type")
	m.offloadTime = counterVec("vllm:kv_offload_total_time", "Seconds spent moving KV data between the GPU and the CPU offload tier (simulated).", "transfer_type")
	m.cancelled = counter("enginesim:requests_cancelled_total", "Requests stopped because their client disconnected.")
	m.requests = counterVec("enginesim:requests_total", "Requests finished, by outcome (finished, cancelled, rejected, fault).", "outcome")
	m.eventBatches = counter("enginesim:kv_event_batches_total", "KV-event batches assigned a sequence number.")
	m.eventBatchesDropped = counter("enginesim:kv_event_batches_dropped_total", "KV-event batches not sent on purpose (fault injection).")
	m.faults = counterVec("enginesim:faults_injected_total", "Faults injected, by kind.", "kind")
	return m
}

// loadGauges returns the running, waiting and KV-cache usage gauges of engine core rank (its
// data-parallel rank, 0 without ranks): vLLM's series labelled engine="<rank>", or SGLang's single series.
func (m *metrics) loadGauges(rank int) (running, waiting, usage prometheus.Gauge) {
	var lv []string
	if m.perEngine {
		lv = []string{strconv.Itoa(rank)}
	}
	return m.running.WithLabelValues(lv...), m.waiting.WithLabelValues(lv...), m.usage.WithLabelValues(lv...)
}
