package kvstore_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/conformance"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// TestRedisClusterShardedReservations (#14 item 3): the sharded reservations pass the conformance and
// hammer suites on a real 3-master Redis Cluster, and a reservation workload over 12 endpoints spreads its
// scripts over the masters (INFO commandstats per master), where the single-tag layout puts every call on
// one master.
func TestRedisClusterShardedReservations(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	t.Run("Conformance", func(t *testing.T) {
		conformance.RunReservations(t, func(t *testing.T) kvstore.Reservations {
			r, err := kvstore.NewShardedRedisReservations(cl.Client(t), kvstore.RedisConfig{Prefix: freshPrefix()})
			if err != nil {
				t.Fatal(err)
			}
			return r
		})
	})
	t.Run("HammerThreeClients", func(t *testing.T) {
		prefix := freshPrefix()
		var handles []kvstore.Reservations
		for range 3 {
			r, err := kvstore.NewShardedRedisReservations(cl.Client(t), kvstore.RedisConfig{Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			handles = append(handles, r)
		}
		conformance.HammerReservations(t, handles)
	})
	t.Run("Guarded", func(t *testing.T) { guardedReservationLayouts(t, cl.Addrs[0], true, cl.Client(t)) })
	spread := func(t *testing.T, r kvstore.Reservations) []int64 {
		ctx := context.Background()
		var nodes []*redis.Client
		for _, a := range cl.Addrs {
			c := redis.NewClient(&redis.Options{Addr: a})
			t.Cleanup(func() { _ = c.Close() })
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			nodes = append(nodes, c)
		}
		var eps []kvstore.EndpointID
		for i := range 12 {
			eps = append(eps, kvstore.EndpointID(fmt.Sprintf("ep-%d", i)))
		}
		for i := range 240 {
			ep := eps[i%len(eps)]
			// Ranked: this request's endpoint first, the next one behind it (a fall-through candidate).
			cands := []kvstore.Candidate{{Endpoint: ep, Limits: kvstore.Limits{MaxRequests: 4}},
				{Endpoint: eps[(i+1)%len(eps)], Limits: kvstore.Limits{MaxRequests: 4}}}
			if _, err := r.InFlight(ctx, []kvstore.EndpointID{cands[0].Endpoint, cands[1].Endpoint}); err != nil {
				t.Fatal(err)
			}
			l, err := r.Reserve(ctx, cands, kvstore.Cost{Requests: 1, Tokens: 100}, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Release(ctx, l); err != nil {
				t.Fatal(err)
			}
		}
		calls := regexp.MustCompile(`cmdstat_(?:evalsha|eval):calls=(\d+)`)
		var out []int64
		for _, c := range nodes {
			info, err := c.Info(ctx, "commandstats").Result()
			if err != nil {
				t.Fatal(err)
			}
			var n int64
			for _, m := range calls.FindAllStringSubmatch(info, -1) {
				v, _ := strconv.ParseInt(m[1], 10, 64)
				n += v
			}
			out = append(out, n)
		}
		return out
	}
	// A request's in-flight read on a Cluster runs no script while no lease is near its expiry (on main it
	// was one script per candidate for the sharded layout, one for the single tag), and its counts are the
	// scripts' (issue 14: scripts per grant).
	t.Run("InFlightWithoutScripts", func(t *testing.T) {
		ctx := context.Background()
		scripts := func() int64 {
			var n int64
			calls := regexp.MustCompile(`cmdstat_(?:evalsha|eval):calls=(\d+)`)
			for _, a := range cl.Addrs {
				c := redis.NewClient(&redis.Options{Addr: a})
				info, err := c.Info(ctx, "commandstats").Result()
				_ = c.Close()
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range calls.FindAllStringSubmatch(info, -1) {
					v, _ := strconv.ParseInt(m[1], 10, 64)
					n += v
				}
			}
			return n
		}
		eps := []kvstore.EndpointID{"ifs-a", "ifs-b", "ifs-c", "ifs-d"}
		for _, kind := range []string{"sharded", "single"} {
			t.Run(kind, func(t *testing.T) {
				var r kvstore.Reservations
				var err error
				if kind == "sharded" {
					r, err = kvstore.NewShardedRedisReservations(cl.Client(t), kvstore.RedisConfig{Prefix: freshPrefix()})
				} else {
					r, err = kvstore.NewRedisReservations(cl.Client(t), kvstore.RedisConfig{Prefix: freshPrefix()})
				}
				if err != nil {
					t.Fatal(err)
				}
				want := map[kvstore.EndpointID]kvstore.Cost{}
				for i, ep := range eps[:3] {
					for range i + 1 {
						if _, err := r.Reserve(ctx, []kvstore.Candidate{{Endpoint: ep}}, kvstore.Cost{Requests: 1, Tokens: 10}, time.Minute); err != nil {
							t.Fatal(err)
						}
						c := want[ep]
						want[ep] = kvstore.Cost{Requests: c.Requests + 1, Tokens: c.Tokens + 10}
					}
				}
				before := scripts()
				for range 20 {
					got, err := r.InFlight(ctx, eps)
					if err != nil {
						t.Fatal(err)
					}
					if fmt.Sprint(got) != fmt.Sprint(want) {
						t.Fatalf("in flight %v, want %v", got, want)
					}
				}
				if n := scripts() - before; n != 0 {
					t.Fatalf("20 in-flight reads of %d endpoints ran %d scripts on the Cluster, want 0", len(eps), n)
				}
				// A lease within clusterClockSkew (1 s) of its expiry sends the read to the script, which reaps.
				if _, err := r.Reserve(ctx, []kvstore.Candidate{{Endpoint: eps[3]}}, kvstore.Cost{Requests: 1, Tokens: 10}, 100*time.Millisecond); err != nil {
					t.Fatal(err)
				}
				time.Sleep(150 * time.Millisecond)
				before = scripts()
				got, err := r.InFlight(ctx, eps)
				if err != nil {
					t.Fatal(err)
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("in flight after an expiry %v, want %v", got, want)
				}
				if scripts() == before {
					t.Fatal("an in-flight read beside an expired lease ran no script")
				}
			})
		}
	})
	t.Run("LoadSpreadOverMasters", func(t *testing.T) {
		sharded, err := kvstore.NewShardedRedisReservations(cl.Client(t), kvstore.RedisConfig{Prefix: freshPrefix()})
		if err != nil {
			t.Fatal(err)
		}
		single, err := kvstore.NewRedisReservations(cl.Client(t), kvstore.RedisConfig{Prefix: freshPrefix()})
		if err != nil {
			t.Fatal(err)
		}
		s := spread(t, sharded)
		o := spread(t, single)
		t.Logf("scripts per master for 240 reservations over 12 endpoints: sharded %v, single {res} tag %v", s, o)
		var total, top int64
		busy := 0
		for _, n := range s {
			total += n
			top = max(top, n)
			if n > 0 {
				busy++
			}
		}
		if busy < 3 || top*10 > total*6 {
			t.Fatalf("sharded reservations not spread over the 3 masters: %v", s)
		}
		busy = 0
		for _, n := range o {
			if n > 0 {
				busy++
			}
		}
		if busy != 1 {
			t.Fatalf("single-tag reservations on %d masters: %v (want 1)", busy, o)
		}
	})
}
