package tpu

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore/redistest"
)

// benchReserveRelease measures one reserve and one release of a 2x2x1 on a v5p 8x8x8 slice that holds 100
// live 2x2x1 leases, reporting p50 and p99 of each in µs.
func benchReserveRelease(b *testing.B, a *Allocator) {
	ctx := context.Background()
	pool := newPool()
	if err := a.Register(ctx, pool, SliceSpec{ID: "s", Generation: "v5p", Topology: "8x8x8", Hosts: hostsN("s", 128)}); err != nil {
		b.Fatal(err)
	}
	for range 100 {
		if _, err := a.Reserve(ctx, pool, Request{Shape: "2x2x1", Holder: "bg", TTL: time.Hour}); err != nil {
			b.Fatal(err)
		}
	}
	res := make([]time.Duration, 0, b.N)
	rel := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		l, err := a.Reserve(ctx, pool, Request{Shape: "2x2x1", Holder: "bench", TTL: time.Minute})
		t1 := time.Now()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := a.Release(ctx, pool, l.ID, l.Token); err != nil {
			b.Fatal(err)
		}
		res = append(res, t1.Sub(t0))
		rel = append(rel, time.Since(t1))
	}
	b.StopTimer()
	q := func(v []time.Duration, p float64) float64 {
		slices.Sort(v)
		return float64(v[int(p*float64(len(v)-1))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(q(res, 0.5), "reserve-p50-µs")
	b.ReportMetric(q(res, 0.99), "reserve-p99-µs")
	b.ReportMetric(q(rel, 0.5), "release-p50-µs")
	b.ReportMetric(q(rel, 0.99), "release-p99-µs")
}

func BenchmarkReserveReleaseMemory(b *testing.B) { benchReserveRelease(b, NewMemory(nil)) }

func BenchmarkReserveReleaseRedis(b *testing.B) {
	srv := redistest.Start(b)
	a, err := NewRedis(srv.Client(b), RedisOptions{})
	if err != nil {
		b.Fatal(err)
	}
	benchReserveRelease(b, a)
}
