package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// benchBatches builds n vLLM GPU store batches of one BlockStored each: blocks blocks of 16 tokens with token
// IDs spread over a 152k vocabulary (so fixint, uint8, uint16 and uint32 encodings all occur), the first
// half of each batch's blocks as a root chain and the second as a child event continuing it. Every fourth
// batch also evicts the previous batch's blocks, as a full cache would.
func benchBatches(n, blocks int, layout Layout) (payloads [][]byte, stored int) {
	rng := rand.New(rand.NewPCG(1, 2))
	next := EngineHash(1)
	var prev []EngineHash
	for range n {
		toks := make([]uint32, blocks*16)
		for i := range toks {
			toks[i] = uint32(rng.IntN(152000))
		}
		hs := make([]EngineHash, blocks)
		for i := range hs {
			hs[i] = next
			next++
		}
		h := blocks / 2
		evs := []Event{
			BlockStored{BlockHashes: hs[:h], TokenIDs: toks[:h*16], BlockSize: 16, Medium: "GPU"},
			BlockStored{BlockHashes: hs[h:], ParentBlockHash: &hs[h-1], TokenIDs: toks[h*16:], BlockSize: 16, Medium: "GPU"},
		}
		if len(payloads)%4 == 3 {
			evs = append(evs, BlockRemoved{BlockHashes: prev, Medium: "GPU"})
		}
		p, err := Encode(EventBatch{TS: 1.7e9, Events: evs, DataParallelRank: new(int)}, layout, HashUint)
		if err != nil {
			panic(err)
		}
		payloads = append(payloads, p)
		stored += blocks
		prev = hs
	}
	return payloads, stored
}

func BenchmarkDecode(b *testing.B) {
	for _, layout := range []Layout{LayoutArrayLast, LayoutMap} {
		b.Run(fmt.Sprintf("%s/32blocks", layout), func(b *testing.B) {
			ps, stored := benchBatches(64, 32, layout)
			size := 0
			for _, p := range ps {
				size += len(p)
			}
			b.SetBytes(int64(size / len(ps)))
			i := 0
			for b.Loop() {
				if _, err := Decode(ps[i%len(ps)]); err != nil {
					b.Fatal(err)
				}
				i++
			}
			b.ReportMetric(float64(stored/len(ps))*float64(i)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

// prefill puts the benchmark shape into idx: keys block keys, 16 endpoints, each key held by 1–3 of
// them on GPU.
func prefill(idx kvstore.Index, keys int) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 4))
	byEP := make([][]kvstore.BlockKey, 16)
	for k := range keys {
		key := kvstore.BlockKey(rng.Uint64())
		for range 1 + k%3 {
			e := rng.IntN(16)
			byEP[e] = append(byEP[e], key)
		}
	}
	for e, ks := range byEP {
		_ = idx.Add(ctx, testModel, kvstore.EndpointID(fmt.Sprintf("p%d", e)), kvstore.TierGPU, ks)
	}
}

// BenchmarkIngestMemory measures one endpoint's ingestion (decode, keying with kvstore.Hasher, engine-hash
// map, Index.Add/Remove) into a memory index pre-filled with 1 M keys held by 16 other endpoints.
func BenchmarkIngestMemory(b *testing.B) {
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
	prefill(idx, 1<<20)
	ps, stored := benchBatches(4096, 32, LayoutMap)
	ing, err := NewIngester(IngesterConfig{Endpoint: "e0", Model: testModel, BlockSize: 16, Hasher: kvstore.Hasher{Seed: 7}, Index: idx, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	seq := uint64(0)
	b.ResetTimer()
	for b.Loop() {
		// Past the end, the same batches come again from seq 0: an engine restart (the endpoint is cleared).
		w := seq % uint64(len(ps))
		ing.handle(ctx, w, ps[w])
		seq++
	}
	b.ReportMetric(float64(stored/len(ps))*float64(seq)/b.Elapsed().Seconds(), "blocks/s")
	if s := ing.Stats(); s.DecodeErrors+s.Orphans+s.IndexErrors+s.Gaps+s.UnknownRemoved != 0 {
		b.Fatalf("stats %+v", s)
	}
}

// discardIndex accepts every call and keeps nothing: BenchmarkIngestDiscard measures the ingestion path
// itself (decode, keying, engine-hash map) without an index behind it.
type discardIndex struct{}

func (discardIndex) Match(context.Context, string, []kvstore.BlockKey) ([]kvstore.EndpointMatch, error) {
	return nil, nil
}
func (discardIndex) Record(context.Context, string, kvstore.EndpointID, []kvstore.BlockKey, time.Duration) error {
	return nil
}
func (discardIndex) Add(context.Context, string, kvstore.EndpointID, kvstore.Tier, []kvstore.BlockKey) error {
	return nil
}
func (discardIndex) Remove(context.Context, string, kvstore.EndpointID, kvstore.Tier, []kvstore.BlockKey) error {
	return nil
}
func (discardIndex) ClearEndpoint(context.Context, string, kvstore.EndpointID) error { return nil }
func (discardIndex) Apply(context.Context, string, []kvstore.Update) error           { return nil }
func (discardIndex) ClearConfirmed(context.Context, string, kvstore.EndpointID) error {
	return nil
}

func BenchmarkIngestDiscard(b *testing.B) {
	ps, stored := benchBatches(4096, 32, LayoutMap)
	ing, err := NewIngester(IngesterConfig{Endpoint: "e0", Model: testModel, BlockSize: 16, Hasher: kvstore.Hasher{Seed: 7}, Index: discardIndex{}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	seq := uint64(0)
	for b.Loop() {
		// Past the end, the same batches come again from seq 0: an engine restart (the endpoint is cleared).
		w := seq % uint64(len(ps))
		ing.handle(ctx, w, ps[w])
		seq++
	}
	b.ReportMetric(float64(stored/len(ps))*float64(seq)/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkIngestRedis measures one endpoint's ingestion into the Redis index on a real redis-server
// (one pipelined Batcher.Apply per batch). The index starts empty: pre-filling 1 M keys through Lua would
// dominate the run time. Besides blocks/s it reports the Redis server's CPU time per block (INFO cpu), which
// depends less on how loaded the shared machine is.
func BenchmarkIngestRedis(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	idx, err := kvstore.NewRedisIndex(c, kvstore.RedisConfig{})
	if err != nil {
		b.Fatal(err)
	}
	ps, stored := benchBatches(1024, 32, LayoutMap)
	ing, err := NewIngester(IngesterConfig{Endpoint: "e0", Model: testModel, BlockSize: 16, Hasher: kvstore.Hasher{Seed: 7}, Index: idx, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	seq := uint64(0)
	cpu0 := redisCPU(b, c)
	for b.Loop() {
		w := seq % uint64(len(ps))
		ing.handle(ctx, w, ps[w])
		seq++
	}
	b.ReportMetric(float64(stored/len(ps))*float64(seq)/b.Elapsed().Seconds(), "blocks/s")
	b.ReportMetric((redisCPU(b, c)-cpu0)*1e6/float64(stored/len(ps)*int(seq)), "redis-cpu-µs/block")
	if s := ing.Stats(); s.DecodeErrors+s.Orphans+s.IndexErrors+s.Gaps+s.UnknownRemoved != 0 {
		b.Fatalf("stats %+v", s)
	}
}

// BenchmarkIngestRedisBacklog is BenchmarkIngestRedis through the receive loop with the publisher ahead of
// the ingester (every message already received): the waiting messages are committed together, up to
// maxQueued per Batcher.Apply, as when an ingester catches up after a burst.
func BenchmarkIngestRedisBacklog(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	idx, err := kvstore.NewRedisIndex(c, kvstore.RedisConfig{})
	if err != nil {
		b.Fatal(err)
	}
	ps, stored := benchBatches(1024, 32, LayoutMap)
	ing, err := NewIngester(IngesterConfig{Endpoint: "e0", Model: testModel, BlockSize: 16, Hasher: kvstore.Hasher{Seed: 7}, Index: idx, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	msgs := make([]zmq4.Msg, len(ps))
	for i, p := range ps {
		seq := make([]byte, 8)
		binary.BigEndian.PutUint64(seq, uint64(i))
		msgs[i] = zmq4.NewMsgFrom([]byte("kv"), seq, p)
	}
	end := errors.New("end of benchmark")
	ctx := context.Background()
	cpu0 := redisCPU(b, c)
	b.ResetTimer()
	n := 0
	_ = ing.receive(ctx, func() (zmq4.Msg, error) {
		if n == b.N {
			return zmq4.Msg{}, end
		}
		n++
		return msgs[(n-1)%len(msgs)], nil
	})
	b.StopTimer()
	b.ReportMetric(float64(stored/len(ps))*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
	b.ReportMetric((redisCPU(b, c)-cpu0)*1e6/float64(stored/len(ps)*b.N), "redis-cpu-µs/block")
	if s := ing.Stats(); s.DecodeErrors+s.Orphans+s.IndexErrors+s.Gaps+s.UnknownRemoved != 0 || s.Batches != uint64(b.N) {
		b.Fatalf("stats %+v", s)
	}
}

// redisCPU returns the server's used CPU seconds (user + system) from INFO cpu.
func redisCPU(b *testing.B, c *redis.Client) float64 {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	total := 0.0
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, k); ok {
				x, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatal(err)
				}
				total += x
			}
		}
	}
	return total
}

// BenchmarkIngestMemoryParallel runs one Ingester per goroutine (GOMAXPROCS endpoints ingesting at once into
// the shared, pre-filled memory index), as a gateway does with one goroutine per endpoint. blocks/s is the
// aggregate.
func BenchmarkIngestMemoryParallel(b *testing.B) {
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
	prefill(idx, 1<<20)
	ps, stored := benchBatches(4096, 32, LayoutMap)
	var next, total atomic.Int64
	ctx := context.Background()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ing, err := NewIngester(IngesterConfig{Endpoint: kvstore.EndpointID(fmt.Sprintf("e%d", next.Add(1))), Model: testModel,
			BlockSize: 16, Hasher: kvstore.Hasher{Seed: 7}, Index: idx, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Error(err)
			return
		}
		seq := uint64(0)
		for pb.Next() {
			w := seq % uint64(len(ps))
			ing.handle(ctx, w, ps[w])
			seq++
		}
		total.Add(int64(seq))
	})
	b.ReportMetric(float64(stored/len(ps))*float64(total.Load())/b.Elapsed().Seconds(), "blocks/s")
}
