package kvstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// BenchmarkRedisReservationCycle is one request's reservation calls on one redis-server, for the single-tag
// and the sharded layouts: InFlight of 4 candidates, Reserve, one Renew, Release, beside 16 live leases
// (-norenew: without the Renew, as a short request). It reports the Redis CPU per cycle (INFO cpu:
// used_cpu_user + used_cpu_sys).
func BenchmarkRedisReservationCycle(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	ctx := context.Background()
	for _, name := range []string{"single", "sharded", "single-norenew", "sharded-norenew"} {
		kind, norenew := strings.CutSuffix(name, "-norenew")
		renew := !norenew
		b.Run(name, func(b *testing.B) {
			var r kvstore.Reservations
			if kind == "single" {
				r, _ = kvstore.NewRedisReservations(c, kvstore.RedisConfig{Prefix: freshPrefix()})
			} else {
				r, _ = kvstore.NewShardedRedisReservations(c, kvstore.RedisConfig{Prefix: freshPrefix()})
			}
			var cands []kvstore.Candidate
			var eps []kvstore.EndpointID
			for i := range 4 {
				ep := kvstore.EndpointID(fmt.Sprintf("endpoint-%d", i))
				cands = append(cands, kvstore.Candidate{Endpoint: ep, Limits: kvstore.Limits{MaxRequests: 64, MaxTokens: 1 << 20}})
				eps = append(eps, ep)
			}
			// Other requests' leases, live throughout.
			for range 16 {
				r.Reserve(ctx, cands, kvstore.Cost{Requests: 1, Tokens: 2300}, time.Hour)
			}
			cpu0 := redisCPU(b, c)
			for b.Loop() {
				if _, err := r.InFlight(ctx, eps); err != nil {
					b.Fatal(err)
				}
				l, err := r.Reserve(ctx, cands, kvstore.Cost{Requests: 1, Tokens: 2300}, 30*time.Second)
				if err != nil {
					b.Fatal(err)
				}
				if renew {
					if _, err := r.Renew(ctx, l, 30*time.Second); err != nil {
						b.Fatal(err)
					}
				}
				if err := r.Release(ctx, l); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric((redisCPU(b, c)-cpu0)*1e6/float64(b.N), "redis-cpu-µs/cycle")
		})
	}
}
