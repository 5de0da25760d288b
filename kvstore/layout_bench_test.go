package kvstore_test

import (
	"context"
	"encoding/binary"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// BenchmarkRedisHotPath measures, on a real redis-server, the Redis CPU (INFO cpu) of each piece of a
// fresh 2k-token request (128 blocks) with today's scripts and with the plain-command alternatives weighed
// in RATIONALE.md ("The hot path: measured options"). Each iteration is one request's worth; the figure is
// redis-cpu-µs/op (per request) and, where it applies, per block and bytes per (block, holder).
//
//	go test ./kvstore -run '^$' -bench RedisHotPath -benchtime 2000x
func BenchmarkRedisHotPath(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	ctx := context.Background()
	h := kvstore.Hasher{Seed: 11}
	chain := 0
	next := func() []kvstore.BlockKey { // 128 new block keys
		toks := make([]uint32, 128*16)
		for i := range toks {
			toks[i] = uint32(chain<<11 | i)
		}
		chain++
		return h.Keys(toks, 16, kvstore.ExtraKeys{})
	}
	measure := func(b *testing.B, blocks int, op func()) {
		m0 := infoNum(b, c, "memory", "used_memory")
		cpu0 := infoCPU(b, c)
		b.ResetTimer()
		for range b.N {
			op()
		}
		b.StopTimer()
		cpu := infoCPU(b, c) - cpu0
		b.ReportMetric(cpu*1e6/float64(b.N), "redis-cpu-µs/op")
		if blocks > 0 {
			b.ReportMetric(cpu*1e6/float64(b.N*blocks), "redis-cpu-µs/block")
			b.ReportMetric(float64(infoNum(b, c, "memory", "used_memory")-m0)/float64(b.N*blocks), "B/block")
		}
	}
	newIndex := func(b *testing.B) *kvstore.RedisIndex {
		idx, err := kvstore.NewRedisIndex(c, kvstore.RedisConfig{Prefix: freshPrefix()})
		if err != nil {
			b.Fatal(err)
		}
		return idx
	}
	b.Run("v1-ingest-apply", func(b *testing.B) { // today's ingestion: 4 updates of 32 blocks per Apply
		idx := newIndex(b)
		measure(b, 128, func() {
			ks := next()
			ups := make([]kvstore.Update, 4)
			for i := range ups {
				ups[i] = kvstore.Update{Endpoint: "e0", Tier: kvstore.TierGPU, Keys: ks[i*32 : (i+1)*32]}
			}
			if err := idx.Apply(ctx, "m", ups); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("v1-record", func(b *testing.B) { // today's speculative Record, in steady state (each sweeps one expired)
		idx := newIndex(b)
		measure(b, 128, func() {
			if err := idx.Record(ctx, "m", "e0", next(), time.Millisecond); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("v1-match-hit", func(b *testing.B) {
		idx := newIndex(b)
		ks := next()
		if err := idx.Add(ctx, "m", "e0", kvstore.TierGPU, ks); err != nil {
			b.Fatal(err)
		}
		measure(b, 0, func() {
			if _, err := idx.Match(ctx, "m", ks); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("v1-reserve-release", func(b *testing.B) {
		r, err := kvstore.NewRedisReservations(c, kvstore.RedisConfig{Prefix: freshPrefix()})
		if err != nil {
			b.Fatal(err)
		}
		cands := []kvstore.Candidate{{Endpoint: "e0"}, {Endpoint: "e1"}, {Endpoint: "e2"}, {Endpoint: "e3"}}
		measure(b, 0, func() {
			l, err := r.Reserve(ctx, cands, kvstore.Cost{Requests: 1, Tokens: 2048}, 30*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			if err := r.Release(ctx, l); err != nil {
				b.Fatal(err)
			}
		})
	})
	// Plain commands, binary values: one STRING per block whose value is a log of 8-byte records
	// (endpoint number, tier bits, expiry), written with APPEND (atomic, so writers of different endpoints
	// never race), plus the endpoint's reverse SET of 8-byte block IDs in one SADD per batch.
	b.Run("plain-append-ingest", func(b *testing.B) {
		pfx := freshPrefix() + ":{m}:"
		rec := make([]byte, 8)
		binary.LittleEndian.PutUint16(rec, 1)
		rec[2] = 1
		measure(b, 128, func() {
			ks := next()
			p := c.Pipeline()
			members := make([]any, len(ks))
			for i, k := range ks {
				id := binKey(k)
				p.Append(ctx, pfx+id, string(rec))
				members[i] = id
			}
			p.SAdd(ctx, pfx+"e:1", members...)
			if _, err := p.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		})
	})
	// The same without the reverse SET (a clear by endpoint generation instead).
	b.Run("plain-append-ingest-norev", func(b *testing.B) {
		pfx := freshPrefix() + ":{m}:"
		rec := make([]byte, 8)
		binary.LittleEndian.PutUint16(rec, 1)
		rec[2] = 1
		measure(b, 128, func() {
			p := c.Pipeline()
			for _, k := range next() {
				p.Append(ctx, pfx+binKey(k), string(rec))
			}
			if _, err := p.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		})
	})
	// One prompt family's blocks as fields of one HASH (keyed by the prompt's block 0), 8-byte binary fields
	// and values, one HSET per batch (the single writer per endpoint knows each block's state).
	b.Run("plain-hash-family-ingest", func(b *testing.B) {
		pfx := freshPrefix() + ":{m}:"
		measure(b, 128, func() {
			ks := next()
			args := make([]any, 0, 2*len(ks))
			for _, k := range ks {
				args = append(args, binKey(k), "\x01\x00\x01\x00\x00\x00\x00\x00")
			}
			if err := c.HSet(ctx, pfx+"f:"+binKey(ks[0]), args...).Err(); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("plain-hash-family-match-hit", func(b *testing.B) {
		pfx := freshPrefix() + ":{m}:"
		ks := next()
		args := make([]any, 0, 2*len(ks))
		fields := make([]string, len(ks))
		for i, k := range ks {
			args = append(args, binKey(k), "\x01\x00\x01\x00\x00\x00\x00\x00")
			fields[i] = binKey(k)
		}
		c.HSet(ctx, pfx+"f:"+binKey(ks[0]), args...)
		measure(b, 0, func() {
			if err := c.HMGet(ctx, pfx+"f:"+binKey(ks[0]), fields...).Err(); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("plain-mget-binary-hit", func(b *testing.B) {
		pfx := freshPrefix() + ":{m}:"
		ks := next()
		names := make([]string, len(ks))
		p := c.Pipeline()
		for i, k := range ks {
			names[i] = pfx + binKey(k)
			p.Set(ctx, names[i], "\x01\x00\x01\x00\x00\x00\x00\x00", 0)
		}
		p.Exec(ctx)
		measure(b, 0, func() {
			if err := c.MGet(ctx, names...).Err(); err != nil {
				b.Fatal(err)
			}
		})
	})
	// Speculative records kept out of the index: one PUBLISH of the request's 128 keys (binary) to two
	// subscribed gateways, which keep them in their own memory.
	b.Run("publish-record-2-subscribers", func(b *testing.B) {
		ch := freshPrefix() + ":rec"
		for range 2 {
			s := c.Subscribe(ctx, ch)
			defer s.Close()
			if _, err := s.Receive(ctx); err != nil {
				b.Fatal(err)
			}
			go func() {
				for range s.Channel() {
				}
			}()
		}
		measure(b, 0, func() {
			msg := make([]byte, 0, 32+128*8)
			msg = append(msg, "m\x00e0\x00"...)
			for _, k := range next() {
				msg = binary.LittleEndian.AppendUint64(msg, uint64(k))
			}
			if err := c.Publish(ctx, ch, msg).Err(); err != nil {
				b.Fatal(err)
			}
		})
	})
}

func binKey(k kvstore.BlockKey) string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(k))
	return string(b[:])
}

func infoCPU(b *testing.B, c *redis.Client) float64 {
	return infoFloat(b, c, "cpu", "used_cpu_user") + infoFloat(b, c, "cpu", "used_cpu_sys")
}

func infoNum(b *testing.B, c *redis.Client, section, field string) int64 {
	return int64(infoFloat(b, c, section, field))
}

func infoFloat(b *testing.B, c *redis.Client, section, field string) float64 {
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			return x
		}
	}
	b.Fatalf("INFO %s has no %s", section, field)
	return 0
}
