package kvstore_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// evalshaStats returns EVALSHA's calls and usec (INFO commandstats) and Redis's CPU seconds (INFO cpu).
func evalshaStats(b *testing.B, c *redis.Client) (calls, usec, cpu float64) {
	s, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(s, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(l), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				calls, _ = strconv.ParseFloat(v, 64)
			case "usec":
				usec, _ = strconv.ParseFloat(v, 64)
			}
		}
	}
	return calls, usec, redisCPU(b, c)
}

// BenchmarkRedisScriptCost bisects what a reservation script costs Redis (kvstore/RATIONALE.md, "Where a
// script's time goes"): small scripts one feature each, then the reservation scripts of the previous
// release (testdata/reservations_prev) and of this one, on the single-tag keys with one candidate. It
// reports EVALSHA's usec per call (wall time inside the script, INFO commandstats) and Redis CPU per call
// (INFO cpu, round trip included). Reserve and Release are measured in batches of 100, the other one of the
// pair run between batches, unmeasured. Run it with -benchtime 2000x -count 5 and compare medians.
func BenchmarkRedisScriptCost(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	ctx := context.Background()
	read := func(path string) string {
		s, err := os.ReadFile(path)
		if err != nil {
			b.Fatal(err)
		}
		return string(s)
	}
	prev := func(name string) string {
		return read("testdata/reservations_prev/res_reap.lua") + read("testdata/reservations_prev/"+name+".lua")
	}
	cur := func(name string) string { return read("scripts/res_reap.lua") + read("scripts/"+name+".lua") }
	keys := []string{"bench:v1:{res}:inflight", "bench:v1:{res}:leases", "bench:v1:{res}:ld", "bench:v1:{res}:seq"}
	resArgs := []any{30000, 1, 2048, 0, 0, "http://127.0.0.1:38211", 0, 0}
	type variant struct {
		name, src string
		args      []any
		release   string // run after each batch on the lease IDs the measured script returned
		reserve   string // run before each batch; the measured script gets each lease ID as ARGV[1]
	}
	vs := []variant{
		{name: "empty", src: "return 0"},
		{name: "TIME", src: "redis.call('TIME') return 0"},
		{name: "TIME+ms", src: "local t = redis.call('TIME') local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) return 0"},
		{name: "HGETx1", src: "redis.call('HGET', KEYS[1], 'r:x') return 0"},
		{name: "HGETx7", src: "for i = 1, 7 do redis.call('HGET', KEYS[1], 'r:x') end return 0"},
		{name: "HSET-string", src: "redis.call('HSET', KEYS[1], 'r:y', '5') return 0"},
		{name: "HSET-number", src: "redis.call('HSET', KEYS[1], 'r:y', 5) return 0"},
		{name: "HSET-stringx7", src: "for i = 1, 7 do redis.call('HSET', KEYS[1], 'r:y', '5') end return 0"},
		{name: "HSET-numberx7", src: "for i = 1, 7 do redis.call('HSET', KEYS[1], 'r:y', 5) end return 0"},
		{name: "ZRANGEBYSCORE-empty", src: "redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', 1000, 'LIMIT', 0, 256) return 0"},
		{name: "closures", src: "local function a(x) return x end local function b(y) return y end return 0"},
		{name: "string.format", src: "local s = string.format('%d %d %s', 1, 2048, 'http://127.0.0.1:38211') return 0"},
		{name: "concat", src: "local s = ARGV[1] .. ' ' .. ARGV[1] .. ' ' .. ARGV[1] return 0", args: []any{"2048"}},
		{name: "INCR+tostring", src: "local s = tostring(redis.call('INCR', KEYS[4])) return 0"},
		{name: "reserve-prev", src: prev("res_reserve"), args: resArgs, release: prev("res_release")},
		{name: "reserve", src: cur("res_reserve"), args: resArgs, release: cur("res_release")},
		{name: "release-prev", src: prev("res_release"), reserve: prev("res_reserve")},
		{name: "release", src: cur("res_release"), reserve: cur("res_reserve")},
	}
	for _, v := range vs {
		b.Run(v.name, func(b *testing.B) {
			c.Del(ctx, keys...)
			sh := redis.NewScript(v.src)
			var rel, res *redis.Script
			if v.release != "" {
				rel = redis.NewScript(v.release)
			}
			if v.reserve != "" {
				res = redis.NewScript(v.reserve)
			}
			var calls, usec, cpu float64
			left := b.N
			for left > 0 {
				n := min(left, 100)
				left -= n
				var ids []string
				if res != nil {
					for range n {
						r, err := res.Run(ctx, c, keys, resArgs...).Slice()
						if err != nil || len(r) == 0 {
							b.Fatal(r, err)
						}
						ids = append(ids, r[0].(string))
					}
				}
				c0, u0, p0 := evalshaStats(b, c)
				var got []string
				for j := range n {
					args := v.args
					if ids != nil {
						args = []any{ids[j]}
					}
					r, err := sh.Run(ctx, c, keys, args...).Result()
					if err != nil {
						b.Fatal(err)
					}
					if s, ok := r.([]any); ok && rel != nil && len(s) > 0 {
						got = append(got, s[0].(string))
					}
				}
				c1, u1, p1 := evalshaStats(b, c)
				calls, usec, cpu = calls+c1-c0, usec+u1-u0, cpu+p1-p0
				for _, id := range got {
					if err := rel.Run(ctx, c, keys, id).Err(); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(usec/calls, "evalsha-µs/call")
			b.ReportMetric(cpu*1e6/calls, "redis-cpu-µs/call")
		})
	}
}

// BenchmarkRedisReleasePiggyback measures what carrying a Release in the next call's pipeline would save
// Redis (issue 14 item 2; not built): a request's reservation calls on the single-tag layout beside 16 live
// leases, "separate" as today (InFlight's pipeline, Reserve, Release: three round trips) and "piggyback"
// with the previous request's release script sent in the same pipeline as the in-flight read (two round
// trips). The pipeline is built here from the scripts' sources and the layout's key names, as
// RedisReservations would build it. It reports Redis CPU per request (INFO cpu).
func BenchmarkRedisReleasePiggyback(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	ctx := context.Background()
	prefix := freshPrefix()
	r, err := kvstore.NewRedisReservations(c, kvstore.RedisConfig{Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	base := prefix + ":" + kvstore.LayoutVersion + ":{res}:"
	keys := []string{base + "inflight", base + "leases", base + "ld", base + "seq"}
	var src []byte
	for _, f := range []string{"scripts/res_reap.lua", "scripts/res_release.lua"} {
		s, err := os.ReadFile(f)
		if err != nil {
			b.Fatal(err)
		}
		src = append(src, s...)
	}
	release := redis.NewScript(string(src))
	if err := release.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	var cands []kvstore.Candidate
	var eps []kvstore.EndpointID
	var fields []string
	for i := range 4 {
		ep := kvstore.EndpointID(fmt.Sprintf("endpoint-%d", i))
		cands = append(cands, kvstore.Candidate{Endpoint: ep, Limits: kvstore.Limits{MaxRequests: 64, MaxTokens: 1 << 20}})
		eps = append(eps, ep)
		fields = append(fields, "r:"+string(ep), "t:"+string(ep))
	}
	cost := kvstore.Cost{Requests: 1, Tokens: 2300}
	for range 16 {
		if _, err := r.Reserve(ctx, cands, cost, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	for _, mode := range []string{"separate", "piggyback"} {
		b.Run(mode, func(b *testing.B) {
			var prev kvstore.Lease
			cpu0 := redisCPU(b, c)
			for b.Loop() {
				if mode == "separate" {
					if _, err := r.InFlight(ctx, eps); err != nil {
						b.Fatal(err)
					}
				} else {
					p := c.Pipeline()
					if prev.ID != "" {
						release.EvalSha(ctx, p, keys, prev.ID)
					}
					p.ZRangeWithScores(ctx, keys[1], 0, 0)
					p.Time(ctx)
					p.HMGet(ctx, keys[0], fields...)
					if _, err := p.Exec(ctx); err != nil {
						b.Fatal(err)
					}
				}
				l, err := r.Reserve(ctx, cands, cost, 30*time.Second)
				if err != nil {
					b.Fatal(err)
				}
				if mode == "separate" {
					if err := r.Release(ctx, l); err != nil {
						b.Fatal(err)
					}
				}
				prev = l
			}
			b.ReportMetric((redisCPU(b, c)-cpu0)*1e6/float64(b.N), "redis-cpu-µs/request")
			if mode == "piggyback" {
				if err := r.Release(ctx, prev); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
