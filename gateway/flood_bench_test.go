package gateway

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

var (
	gwFloodBlocks    = flag.Int("gw-flood-blocks", 8<<20, "BenchmarkGatewayFlood: distinct blocks flooded (all endpoints)")
	gwFloodIndexCap  = flag.Int("gw-flood-index-cap", 0, "BenchmarkGatewayFlood: index_max_entries (0: default 16 Mi)")
	gwFloodHashCap   = flag.Int("gw-flood-hash-cap", 0, "BenchmarkGatewayFlood: index_max_engine_hashes_per_endpoint (0: default 1 Mi)")
	gwFloodEndpoints = flag.Int("gw-flood-endpoints", 4, "BenchmarkGatewayFlood: endpoints flooded in parallel")
)

// BenchmarkGatewayFlood (#11 item 6) measures a gateway's memory when its engines flood KV events: a real
// gateway (memory store, the Qwen3 tokenizer, the built-in policy) ingests -gw-flood-blocks distinct blocks
// (32 a batch, two chained 16-block BlockStored events, never a BlockRemoved) from -gw-flood-endpoints Go
// ZMQ publishers, paced so none runs more than 256 batches ahead of its ingester (nothing is dropped). It
// reports the process's resident set (VmRSS) before and after, its peak (VmHWM), the live heap after a GC,
// the index's entries and the ingesters' mapped hashes. The process also holds the simulated engines
// (health only, 4096 blocks each). Run by hand, e.g.:
//
//	go test -run x -bench GatewayFlood -benchtime 1x ./gateway/
//	go test -run x -bench GatewayFlood -benchtime 1x ./gateway/ -gw-flood-hash-cap 16777216   # no map cap
func BenchmarkGatewayFlood(b *testing.B) {
	for b.Loop() {
		benchGatewayFlood(b)
	}
}

func benchGatewayFlood(b *testing.B) {
	n := *gwFloodEndpoints
	extra := ""
	if *gwFloodIndexCap > 0 {
		extra += fmt.Sprintf("index_max_entries: %d\n", *gwFloodIndexCap)
	}
	if *gwFloodHashCap > 0 {
		extra += fmt.Sprintf("index_max_engine_hashes_per_endpoint: %d\n", *gwFloodHashCap)
	}
	f := startEventFleet(b, n, "", extra)
	g, seqs := f.g, f.seqs
	runtime.GC()
	debug.FreeOSMemory()
	rss0, _ := procStatus("VmRSS")

	const perBatch = floodBatchBlocks
	toks := make([]uint32, perBatch*16)
	batches := *gwFloodBlocks / perBatch
	start := time.Now()
	seen := f.applied()
	for k := range batches {
		i := k % n
		p := floodBatch(b, k, toks)
		for seqs[i] >= seen[i]+256 {
			if seen = f.applied(); seqs[i] >= seen[i]+256 {
				time.Sleep(time.Millisecond)
			}
		}
		f.send(b, i, p)
	}
	for !waitFor(time.Minute, func() bool {
		a := f.applied()
		for i := range n {
			if a[i] < seqs[i] {
				return false
			}
		}
		return true
	}) {
		b.Fatalf("ingesters did not catch up: applied %v of %v", f.applied(), seqs)
	}
	elapsed := time.Since(start)
	rss1, _ := procStatus("VmRSS")
	hwm, _ := procStatus("VmHWM")
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	mapped, gaps, evicted := 0, uint64(0), uint64(0)
	for _, s := range g.IngestStats() {
		mapped += s.MappedHashes
		gaps += s.Gaps
		evicted += s.HashEvictions
	}
	keys := 0
	if li, ok := g.index.(interface{ Len() int }); ok {
		keys = li.Len()
	}
	b.ReportMetric(float64(rss0)/1e6, "rss-before-MB")
	b.ReportMetric(float64(rss1)/1e6, "rss-MB")
	b.ReportMetric(float64(hwm)/1e6, "rss-peak-MB")
	b.ReportMetric(float64(ms.HeapAlloc)/1e6, "heap-MB")
	b.ReportMetric(float64(keys), "index-keys")
	b.ReportMetric(float64(mapped), "mapped-hashes")
	b.ReportMetric(float64(evicted), "hash-evictions")
	b.ReportMetric(float64(gaps), "gaps")
	b.ReportMetric(elapsed.Seconds(), "flood-s")
	b.ReportMetric(float64(rss1-rss0)/float64(batches*perBatch), "rss-B/block")
}

// procStatus returns a /proc/self/status field in bytes (the kB figures Linux prints).
func procStatus(field string) (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kb int64
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb); err != nil {
				return 0, err
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("no %s in /proc/self/status", field)
}
