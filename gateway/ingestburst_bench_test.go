package gateway

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore/redistest"
)

// BenchmarkIngestBurstLatency (#14 item 4) measures whether an ingestion burst starves requests: a real
// gateway (memory or Redis store, two simulated engines whose KV events come from Go ZMQ publishers) serves
// sequential chat requests, first idle, then while its ingesters receive a steady 100k blocks/s (32-block
// batches, pre-encoded so the publishers cost little), in one run. It reports both p99 request latencies
// and their ratio (target ≤ 2), and the blocks per second actually applied during the burst.
//
//	go test -run x -bench IngestBurstLatency -benchtime 1x ./gateway/
func BenchmarkIngestBurstLatency(b *testing.B) {
	for _, store := range []string{"memory", "redis", "redis-layout2"} {
		b.Run(store, func(b *testing.B) {
			for b.Loop() {
				benchIngestBurst(b, store)
			}
		})
	}
}

func benchIngestBurst(b *testing.B, store string) {
	const n, rate, perBatch, requests = 2, 100_000, floodBatchBlocks, 300
	extra := ""
	if store == "redis" || store == "redis-layout2" {
		rs := redistest.Start(b)
		layout := 0 // the default: layout 1 read, both written until the store's marker says 2
		if store == "redis-layout2" {
			layout = 2 // a fleet with no older gateway (kvstore/RATIONALE.md, "Redis layout 2")
		}
		extra = fmt.Sprintf("store: {kind: redis, addrs: [%q], index_layout: %d}\n", rs.Addr, layout)
	}
	f := startEventFleet(b, n, ", max_inflight_requests: 64", extra)
	g := f.g
	// Pre-encode 6 s of distinct batches.
	batches := make([][]byte, rate/perBatch*6)
	toks := make([]uint32, perBatch*16)
	for k := range batches {
		batches[k] = floodBatch(b, k, toks)
	}
	latencies := func(tag string) []time.Duration {
		out := make([]time.Duration, 0, requests)
		for k := range requests {
			body := chatBody(false, 1, fmt.Sprintf("%s request %d: %s", tag, k, strings.Repeat("the quick brown fox ", 30)))
			t0 := time.Now()
			if st, _, out := post(b, "http://"+g.Addr()+"/v1/chat/completions", body); st != 200 {
				b.Fatalf("%s: %d %s", tag, st, out)
			}
			out = append(out, time.Since(t0))
		}
		slices.Sort(out)
		return out
	}
	p := func(d []time.Duration, q float64) time.Duration { return d[int(float64(len(d)-1)*q)] }
	latencies("warm-up")
	idle := latencies("idle")
	var stop atomic.Bool
	sent := make(chan int)
	before := f.applied()
	t0 := time.Now()
	go func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		k := 0
		for start := time.Now(); !stop.Load() && k < len(batches); {
			<-tick.C
			for due := int(time.Since(start).Seconds() * rate / perBatch); k < due && k < len(batches); k++ {
				f.send(b, k%n, batches[k])
			}
		}
		sent <- k
	}()
	burst := latencies("burst")
	stop.Store(true)
	k := <-sent
	elapsed := time.Since(t0)
	after := f.applied()
	var got uint64
	for i := range n {
		got += after[i] - before[i]
	}
	b.ReportMetric(float64(p(idle, 0.5).Microseconds()), "idle-p50-µs")
	b.ReportMetric(float64(p(idle, 0.99).Microseconds()), "idle-p99-µs")
	b.ReportMetric(float64(p(burst, 0.5).Microseconds()), "burst-p50-µs")
	b.ReportMetric(float64(p(burst, 0.99).Microseconds()), "burst-p99-µs")
	b.ReportMetric(float64(p(burst, 0.99))/float64(p(idle, 0.99)), "p99-ratio")
	b.ReportMetric(float64(k*perBatch)/elapsed.Seconds(), "sent-blocks/s")
	b.ReportMetric(float64(got*perBatch)/elapsed.Seconds(), "applied-blocks/s")
}
