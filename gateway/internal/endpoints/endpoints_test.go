package endpoints

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore/testenv"
)

// A vLLM 0.11-style exposition (label sets per model, HELP/TYPE lines, a histogram to skip).
const vllmPage = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 7.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.4235
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="Qwen/Qwen3-8B"} 0.0
vllm:num_requests_waiting_total 99
`

func TestParseMetrics(t *testing.T) {
	m := ParseMetrics([]byte(vllmPage))
	if m.Waiting != 7 || m.Running != 3 || m.KVCacheUsage != 0.4235 || m.Found != 3 {
		t.Fatalf("%+v", m)
	}
	sg := ParseMetrics([]byte("sglang:num_queue_reqs{model_name=\"m\",label=\"a}b\"} 2\nsglang:num_running_reqs{model_name=\"m\"} 5 1712345678000\nsglang:token_usage{model_name=\"m\"} 0.5\n"))
	if sg.Waiting != 2 || sg.Running != 5 || sg.KVCacheUsage != 0.5 {
		t.Fatalf("sglang %+v", sg)
	}
	// Two data-parallel ranks on one page sum; NaN and garbage are skipped.
	dp := ParseMetrics([]byte("vllm:num_requests_waiting{engine=\"0\"} 1\nvllm:num_requests_waiting{engine=\"1\"} 2\nvllm:num_requests_running NaN\nvllm:num_requests_running{ 4\n"))
	if dp.Waiting != 3 || dp.Running != 0 || dp.Found != 2 {
		t.Fatalf("dp %+v", dp)
	}
}

// vLLM with --data-parallel-size 2 behind one API server labels each engine core's series engine="<rank>"
// (vllm/v1/metrics/loggers.py, PrometheusStatLogger with engine_indexes [0, 1]).
const vllmDPPage = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 1.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B"} 6.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 0.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-8B"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.1
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-8B"} 0.7
vllm:engine_weird{engine="x"} 3
`

// TestParseMetricsPerEngine: per-engine series are kept by engine label; a rank's load is its own series
// when every rank has them, an even split otherwise; KV-cache usage is the engines' mean.
func TestParseMetricsPerEngine(t *testing.T) {
	m := ParseMetrics([]byte(vllmDPPage))
	if m.Running != 7 || m.Waiting != 4 || m.KVCacheUsage < 0.399 || m.KVCacheUsage > 0.401 || len(m.Engines) != 2 {
		t.Fatalf("totals %+v", m)
	}
	l := Load{Healthy: true, Waiting: m.Waiting, Running: m.Running, KVCacheUsage: m.KVCacheUsage, Engines: m.Engines}
	r0, r1 := l.Rank(0, 2), l.Rank(1, 2)
	if r0.Running != 1 || r0.Waiting != 0 || r0.KVCacheUsage != 0.1 || r1.Running != 6 || r1.Waiting != 4 || r1.KVCacheUsage != 0.7 || !r1.Healthy {
		t.Fatalf("ranks %+v %+v", r0, r1)
	}
	if one := l.Rank(0, 1); one.Running != 7 || len(one.Engines) != 2 {
		t.Fatalf("one rank: %+v", one)
	}
	// A page without rank 2's series (a size-3 endpoint) falls back to the even split for every rank.
	if r := l.Rank(1, 3); r.Running != 7.0/3 || r.Waiting != 4.0/3 || r.KVCacheUsage != m.KVCacheUsage || r.Engines != nil {
		t.Fatalf("fallback %+v", r)
	}
	// No engine label (SGLang, the old simulator): even split.
	plain := ParseMetrics([]byte("vllm:num_requests_running{model_name=\"m\"} 6\nvllm:num_requests_waiting 2\n"))
	if plain.Engines != nil {
		t.Fatalf("engines without the label: %+v", plain.Engines)
	}
	pl := Load{Running: plain.Running, Waiting: plain.Waiting}
	if r := pl.Rank(1, 2); r.Running != 3 || r.Waiting != 1 {
		t.Fatalf("even split %+v", r)
	}
	// Quoted label values with escapes and commas do not confuse the engine label.
	q := ParseMetrics([]byte(`vllm:num_requests_running{a="x\",engine=\"9\"",engine="1"} 2` + "\n"))
	if len(q.Engines) != 2 || q.Engines[1].Running != 2 {
		t.Fatalf("quoted %+v", q.Engines)
	}
}

func FuzzParseMetrics(f *testing.F) {
	f.Add([]byte(vllmPage))
	f.Add([]byte("vllm:kv_cache_usage_perc{a=\"\\\"}\"} 1e400\n"))
	f.Fuzz(func(t *testing.T, page []byte) {
		m := ParseMetrics(page)
		if m.Waiting < 0 || m.Running < 0 || m.KVCacheUsage < 0 || m.KVCacheUsage > 1 || len(m.Engines) > maxEngines {
			t.Fatalf("%+v", m)
		}
		for _, e := range m.Engines {
			if e.Waiting < 0 || e.Running < 0 || e.KVCacheUsage < 0 || e.KVCacheUsage > 1 {
				t.Fatalf("%+v", e)
			}
		}
	})
}

func TestProbe(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			if !healthy.Load() {
				w.WriteHeader(503)
			}
		case "/metrics":
			fmt.Fprint(w, vllmPage)
		}
	}))
	defer srv.Close()
	s := NewSet([]Endpoint{{ID: "a", URL: srv.URL}, {ID: "b", URL: "http://127.0.0.1:1"}}, srv.Client(), 20*time.Millisecond, nil)
	s.ProbeAll(context.Background())
	if l := s.Load("a"); !l.Healthy || l.Waiting != 7 || l.Scraped.IsZero() {
		t.Fatalf("a %+v", l)
	}
	if l := s.Load("b"); l.Healthy || l.Err == "" {
		t.Fatalf("b %+v", l)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	healthy.Store(false)
	deadline := time.Now().Add(2 * time.Second)
	for s.Load("a").Healthy && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s.Load("a").Healthy {
		t.Fatal("never saw a go unhealthy")
	}
	healthy.Store(true)
	s.MarkDown("a", "connect refused")
	for !s.Load("a").Healthy && time.Now().Before(deadline.Add(time.Second)) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if !s.Load("a").Healthy {
		t.Fatal("a did not recover")
	}
}

// Endpoints added while Run runs are probed at once and then every interval; a removed endpoint's probes
// stop and it reads as unknown (unhealthy). Concurrent readers see one membership or the other.
func TestSetAddRemoveAtRunTime(t *testing.T) {
	var hits [2]atomic.Int64
	var srv [2]*httptest.Server
	for i := range srv {
		srv[i] = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits[i].Add(1)
			if r.URL.Path == "/metrics" {
				fmt.Fprintf(w, "vllm:num_requests_waiting %d\n", i+1)
			}
		}))
		defer srv[i].Close()
	}
	s := NewSet([]Endpoint{{ID: "a", URL: srv[0].URL}}, srv[0].Client(), 20*time.Millisecond, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	stopRead := make(chan struct{})
	readDone := make(chan struct{})
	go func() { // a router reading while the membership changes (run with -race)
		defer close(readDone)
		for {
			select {
			case <-stopRead:
				return
			default:
			}
			for _, e := range s.Endpoints() {
				_ = s.Load(e.ID)
			}
		}
	}()
	if !s.Add(Endpoint{ID: "b", URL: srv[1].URL}) || s.Add(Endpoint{ID: "b", URL: srv[0].URL}) {
		t.Fatal("Add: a new ID is added once, an existing one is refused")
	}
	deadline := time.Now().Add(2 * time.Second)
	for s.Load("b").Waiting != 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if l := s.Load("b"); !l.Healthy || l.Waiting != 2 {
		t.Fatalf("added endpoint: %+v", l)
	}
	if !s.Remove("a") || s.Remove("a") {
		t.Fatal("Remove: once")
	}
	// Remove ends a's probe loop; a probe already in flight may still reach a (its /health and /metrics).
	// b's loop probes on the same interval: 5 more of its probes (10 requests) are 4 intervals in which a's
	// loop, were it still running, would have probed a.
	n, nb := hits[0].Load(), hits[1].Load()
	if !testenv.WaitFor(5*time.Second, func() bool { return hits[1].Load() >= nb+10 }) {
		t.Fatal("b's probes stopped")
	}
	if got := hits[0].Load(); got > n+2 {
		t.Fatalf("a removed endpoint was probed %d more times (requests), want at most the one probe in flight", got-n)
	}
	if l := s.Load("a"); l.Healthy {
		t.Fatalf("a removed endpoint reads healthy: %+v", l)
	}
	if eps := s.Endpoints(); len(eps) != 1 || eps[0].ID != "b" {
		t.Fatalf("endpoints: %+v", eps)
	}
	close(stopRead)
	<-readDone
	cancel()
	<-done
}
