package gateway

import (
	"bufio"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/kvstore/kvevents"
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
	engines := startSims(b, n, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var eps strings.Builder
	pubs := make([]zmq4.Socket, n)
	for i, e := range engines {
		pubs[i] = zmq4.NewPub(ctx)
		if err := pubs[i].Listen("tcp://127.0.0.1:0"); err != nil {
			b.Fatal(err)
		}
		defer pubs[i].Close()
		addr := pubs[i].Addr().(*net.TCPAddr)
		fmt.Fprintf(&eps, "      - {id: e%d, engine: enginesim, url: \"http://%s\", kv_events: \"tcp://127.0.0.1:%d\"}\n", i, e.HTTPAddr(), addr.Port)
	}
	extra := ""
	if *gwFloodIndexCap > 0 {
		extra += fmt.Sprintf("index_max_entries: %d\n", *gwFloodIndexCap)
	}
	if *gwFloodHashCap > 0 {
		extra += fmt.Sprintf("index_max_engine_hashes_per_endpoint: %d\n", *gwFloodHashCap)
	}
	g := startGateway(b, gwYAML(eps.String(), extra))
	seqs := make([]uint64, n)
	send := func(i int, payload []byte) {
		var seq8 [8]byte
		binary.BigEndian.PutUint64(seq8[:], seqs[i])
		if err := pubs[i].SendMulti(zmq4.NewMsgFrom([]byte("kv@flood"), seq8[:], payload)); err != nil {
			b.Fatal(err)
		}
		seqs[i]++
	}
	applied := func() []uint64 {
		out := make([]uint64, n)
		for _, s := range g.IngestStats() {
			var i int
			if _, err := fmt.Sscanf(string(s.Endpoint), "e%d", &i); err == nil && s.HaveSeq {
				out[i] = s.LastSeq + 1
			}
		}
		return out
	}
	// Prime: seq 0 (an empty batch) until every ingester has applied one (ZMQ's slow joiner drops earlier ones).
	empty, err := kvevents.Encode(kvevents.EventBatch{TS: float64(time.Now().UnixNano()) / 1e9}, kvevents.LayoutMap, kvevents.HashUint)
	if err != nil {
		b.Fatal(err)
	}
	for ready := false; !ready; {
		for i := range n {
			seqs[i] = 0
			send(i, empty)
		}
		time.Sleep(20 * time.Millisecond)
		ready = true
		for _, a := range applied() {
			ready = ready && a > 0
		}
	}
	runtime.GC()
	debug.FreeOSMemory()
	rss0, _ := procStatus("VmRSS")

	const perEvent, perBatch = 16, 32
	toks := make([]uint32, perBatch*16)
	batches := *gwFloodBlocks / perBatch
	start := time.Now()
	seen := applied()
	for k := range batches {
		i := k % n
		root := kvevents.EngineHash(uint64(k)*perBatch + 1)
		for j := range toks {
			toks[j] = uint32(k*perBatch*16 + j) // distinct blocks everywhere
		}
		hs := make([]kvevents.EngineHash, perBatch)
		for j := range hs {
			hs[j] = root + kvevents.EngineHash(j)
		}
		parent := hs[perEvent-1]
		bt := kvevents.EventBatch{TS: float64(time.Now().UnixNano()) / 1e9, Events: []kvevents.Event{
			kvevents.BlockStored{BlockHashes: hs[:perEvent], TokenIDs: toks[:perEvent*16], BlockSize: 16, Medium: "GPU"},
			kvevents.BlockStored{BlockHashes: hs[perEvent:], ParentBlockHash: &parent, TokenIDs: toks[perEvent*16:], BlockSize: 16, Medium: "GPU"},
		}}
		p, err := kvevents.Encode(bt, kvevents.LayoutMap, kvevents.HashUint)
		if err != nil {
			b.Fatal(err)
		}
		for seqs[i] >= seen[i]+256 {
			if seen = applied(); seqs[i] >= seen[i]+256 {
				time.Sleep(time.Millisecond)
			}
		}
		send(i, p)
	}
	for !waitFor(time.Minute, func() bool {
		a := applied()
		for i := range n {
			if a[i] < seqs[i] {
				return false
			}
		}
		return true
	}) {
		b.Fatalf("ingesters did not catch up: applied %v of %v", applied(), seqs)
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
