package gateway

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/kvstore/kvevents"
)

// eventFleet is a real gateway whose n endpoints (simulated engines, for HTTP and health) take their KV
// events from Go ZMQ publishers a benchmark drives: the set-up BenchmarkGatewayFlood and
// BenchmarkIngestBurstLatency share.
type eventFleet struct {
	g    *Gateway
	pubs []zmq4.Socket
	seqs []uint64 // the next sequence number of each publisher
}

// startEventFleet starts n simulated engines, one publisher each and a gateway whose endpoint e<i> reads
// publisher i (endpointExtra is appended to each endpoint's YAML flow map, e.g. ", max_inflight_requests:
// 64"; extra is top-level YAML), then primes them: seq 0 (an empty batch) is sent until every ingester has
// applied one, since ZMQ's slow joiner drops what is sent before the subscription is up.
func startEventFleet(b *testing.B, n int, endpointExtra, extra string) *eventFleet {
	b.Helper()
	engines := startSims(b, n, nil)
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	f := &eventFleet{pubs: make([]zmq4.Socket, n), seqs: make([]uint64, n)}
	var eps strings.Builder
	for i, e := range engines {
		f.pubs[i] = zmq4.NewPub(ctx)
		if err := f.pubs[i].Listen("tcp://127.0.0.1:0"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { f.pubs[i].Close() })
		addr := f.pubs[i].Addr().(*net.TCPAddr)
		fmt.Fprintf(&eps, "      - {id: e%d, engine: enginesim, url: \"http://%s\", kv_events: \"tcp://127.0.0.1:%d\"%s}\n",
			i, e.HTTPAddr(), addr.Port, endpointExtra)
	}
	f.g = startGateway(b, gwYAML(eps.String(), extra))
	empty, err := kvevents.Encode(kvevents.EventBatch{TS: float64(time.Now().UnixNano()) / 1e9}, kvevents.LayoutMap, kvevents.HashUint)
	if err != nil {
		b.Fatal(err)
	}
	for ready := false; !ready; {
		for i := range n {
			f.seqs[i] = 0
			f.send(b, i, empty)
		}
		time.Sleep(20 * time.Millisecond)
		ready = true
		for _, a := range f.applied() {
			ready = ready && a > 0
		}
	}
	return f
}

// send publishes payload as publisher i's next sequence number.
func (f *eventFleet) send(b *testing.B, i int, payload []byte) {
	var seq8 [8]byte
	binary.BigEndian.PutUint64(seq8[:], f.seqs[i])
	if err := f.pubs[i].SendMulti(zmq4.NewMsgFrom([]byte("kv@bench"), seq8[:], payload)); err != nil {
		b.Fatal(err)
	}
	f.seqs[i]++
}

// applied returns, per endpoint, how many sequence numbers its ingester has applied (last seq + 1).
func (f *eventFleet) applied() []uint64 {
	out := make([]uint64, len(f.pubs))
	for _, s := range f.g.IngestStats() {
		var i int
		if _, err := fmt.Sscanf(string(s.Endpoint), "e%d", &i); err == nil && s.HaveSeq && i < len(out) {
			out[i] = s.LastSeq + 1
		}
	}
	return out
}

// floodBatchBlocks is the number of distinct blocks in one floodBatch.
const floodBatchBlocks = 32

// floodBatch encodes batch k of a flood: floodBatchBlocks distinct 16-token blocks in two chained
// 16-block BlockStored events (LayoutMap, uint hashes), distinct from every other k. toks is scratch of
// floodBatchBlocks*16 tokens.
func floodBatch(b *testing.B, k int, toks []uint32) []byte {
	const perEvent = 16
	root := kvevents.EngineHash(uint64(k)*floodBatchBlocks + 1)
	for j := range toks {
		toks[j] = uint32(k*floodBatchBlocks*16 + j) // distinct blocks everywhere
	}
	hs := make([]kvevents.EngineHash, floodBatchBlocks)
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
	return p
}
