package gateway

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/cmd/enginesim/sim"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkOverhead compares one chat request sent straight to a simulated engine with the same request
// through the gateway (memory store, 4 engines, the built-in Wasm policy), in one process. The difference
// of the p50-ns figures is the gateway's added latency, the difference of cpu-ns/op its CPU per request
// (the engine's own work is in both). The request is a ~1.8k-token conversation prefix seen before plus
// ~200 new tokens and 1 output token; the engines run with TimeScale 0 (no simulated sleeping).
func BenchmarkOverhead(b *testing.B) { benchOverhead(b, "") }

// BenchmarkOverheadRedis is BenchmarkOverhead with the store on a local redis-server.
func BenchmarkOverheadRedis(b *testing.B) {
	rs := redistest.Start(b)
	benchOverhead(b, fmt.Sprintf("store: {kind: redis, addrs: [%q]}\n", rs.Addr))
}

func benchOverhead(b *testing.B, storeYAML string) {
	engines := startSims(b, 4, func(c *sim.Config) { c.TimeScale = 0 })
	g := startGateway(b, gwYAML(simEndpointsYAML(engines, 1024), storeYAML))
	if os.Getenv("KVGATE_BENCH_ACCESS_LOG") == "1" { // the same gateway writing its info log (an access line per request)
		var logs logBuffer
		g = startGatewayLog(b, gwYAML(simEndpointsYAML(engines, 1024), storeYAML), &logs)
	}
	var sys strings.Builder
	for i := 0; sys.Len() < 7000; i++ {
		fmt.Fprintf(&sys, "Policy %d: be precise, cite section %d, and keep answers short. ", i, i*3)
	}
	q := strings.Repeat("Tell me about the refund rules for damaged items please. ", 18)
	body := fmt.Sprintf(`{"model":"qwen3","max_tokens":1,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, sys.String(), q)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	send := func(url string) {
		resp, err := hc.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	gwURL := "http://" + g.Addr() + "/v1/chat/completions"
	send(gwURL) // warm: the prefix is now cached on its endpoint and in the index
	time.Sleep(200 * time.Millisecond)
	// The direct target is the endpoint the gateway chose (same warm cache).
	resp, _ := hc.Post(gwURL, "application/json", strings.NewReader(body))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	ep := resp.Header.Get("x-kvgate-endpoint")
	var direct string
	for i, e := range engines {
		if ep == fmt.Sprint("e", i) {
			direct = "http://" + e.HTTPAddr() + "/v1/chat/completions"
		}
	}
	defer func() {
		mfs, _ := g.Metrics().Registry.Gather()
		for _, mf := range mfs {
			if mf.GetName() != "kvgate_routing_stage_seconds" {
				continue
			}
			for _, m := range mf.GetMetric() {
				h := m.GetHistogram()
				b.Logf("stage %s: mean %.1f µs over %d", m.GetLabel()[0].GetValue(), h.GetSampleSum()/float64(h.GetSampleCount())*1e6, h.GetSampleCount())
			}
		}
	}()
	for _, tc := range []struct{ name, url string }{{"direct", direct}, {"gateway", gwURL}} {
		b.Run(tc.name, func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			c0 := cpuTime()
			for b.Loop() {
				t0 := time.Now()
				send(tc.url)
				lat = append(lat, time.Since(t0))
			}
			cpu := cpuTime() - c0
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(len(lat)), "cpu-ns/op")
		})
	}
}
