package kvstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/conformance"
	"github.com/kvgate/kvgate/kvstore/redistest"
	"github.com/kvgate/kvgate/kvstore/testenv"
)

// reservationLayoutStates prepares a fresh prefix on c for LayoutRedisReservations in each state of the
// switch: no marker (single tag), switched with a single-tag lease still running on another endpoint
// (sharded grants subtract the single tag's counts), and switched with the single tag drained.
var reservationLayoutStates = []struct {
	name  string
	setup func(t *testing.T, c redis.UniversalClient, prefix string)
}{
	{"SingleTag", func(*testing.T, redis.UniversalClient, string) {}},
	{"Switching", func(t *testing.T, c redis.UniversalClient, prefix string) {
		old, err := kvstore.NewRedisReservations(c, kvstore.RedisConfig{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := old.Reserve(context.Background(), []kvstore.Candidate{{Endpoint: "elsewhere"}}, kvstore.Cost{Requests: 1}, time.Hour); err != nil {
			t.Fatal(err)
		}
		setMarker(t, c, prefix, "2 1")
	}},
	{"Sharded", func(t *testing.T, c redis.UniversalClient, prefix string) { setMarker(t, c, prefix, "2 1") }},
}

func setMarker(t *testing.T, c redis.UniversalClient, prefix, v string) {
	t.Helper()
	if err := c.Set(context.Background(), prefix+":v1:reservation-layout", v, 0).Err(); err != nil {
		t.Fatal(err)
	}
}

func newLayoutRes(t *testing.T, c redis.UniversalClient, prefix string) *kvstore.LayoutRedisReservations {
	t.Helper()
	r, err := kvstore.NewLayoutRedisReservations(c, kvstore.RedisConfig{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// TestLayoutRedisReservationsConformance: the layout-following reservations pass the conformance suite
// and the three-client hammer in every state of the switch, on a real redis-server.
func TestLayoutRedisReservationsConformance(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	for _, s := range reservationLayoutStates {
		t.Run(s.name, func(t *testing.T) {
			conformance.RunReservations(t, func(t *testing.T) kvstore.Reservations {
				p := freshPrefix()
				s.setup(t, c, p)
				return newLayoutRes(t, c, p)
			})
			p := freshPrefix()
			s.setup(t, c, p)
			var handles []kvstore.Reservations
			for range 3 {
				handles = append(handles, newLayoutRes(t, srv.Client(t), p))
			}
			conformance.HammerReservations(t, handles)
		})
	}
}

// TestReservationLayoutSwitch: two gateways' reservations (two clients) on one redis-server, 16 workers
// reserving an endpoint with a limit of 4 and holding each lease a few milliseconds, while the operator
// raises the marker with SET ... 2. Leases are held across the switch (four taken before it, released
// after it). At no moment do the workers hold more than the limit, the switch happens on both within the
// delay, the old leases are released where they were taken (no count left under the single tag), and
// once the single tag is empty the sharded layout alone counts.
func TestReservationLayoutSwitch(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the layout switch (5 s)")
	}
	const limit = 4
	srv := redistest.Start(t)
	prefix := freshPrefix()
	gws := []*kvstore.LayoutRedisReservations{newLayoutRes(t, srv.Client(t), prefix), newLayoutRes(t, srv.Client(t), prefix)}
	ctx := context.Background()
	ranked := []kvstore.Candidate{{Endpoint: "e0", Limits: kvstore.Limits{MaxRequests: limit, MaxTokens: 1000}}}
	cost := kvstore.Cost{Requests: 1, Tokens: 10}

	// Two long requests per gateway from before the switch.
	var early []kvstore.Lease
	for _, g := range gws {
		for range 2 {
			l, err := g.Reserve(ctx, ranked, cost, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(l.ID, "@") {
				t.Fatalf("lease %q before the marker is not the single tag's", l.ID)
			}
			early = append(early, l)
		}
	}
	var held, peak, grants, sharded atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	var errs sync.Map
	for w := range 16 {
		wg.Go(func() {
			g := gws[w%2]
			for !stop.Load() {
				l, err := g.Reserve(ctx, ranked, cost, 30*time.Second)
				if errors.Is(err, kvstore.ErrNoCapacity) {
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil {
					errs.Store(err.Error(), true)
					return
				}
				n := held.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				grants.Add(1)
				if strings.Contains(l.ID, "@") {
					sharded.Add(1)
				}
				time.Sleep(2 * time.Millisecond)
				held.Add(-1)
				if err := g.Release(ctx, l); err != nil {
					errs.Store(err.Error(), true)
					return
				}
			}
		})
	}
	held.Add(int64(len(early)))
	peak.Store(held.Load())
	// The early leases fill the endpoint: release two so the workers run during the switch.
	for _, l := range early[:2] {
		held.Add(-1)
		if err := gws[0].Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	early = early[2:]
	g0 := grants.Load() // the workers run before the switch: 20 more grants, however slow the machine
	testenv.Eventually(t, 10*time.Second, "20 grants before the switch", func() bool { return grants.Load() >= g0+20 })
	setMarker(t, srv.Client(t), prefix, "2")
	for i, g := range gws {
		testenv.Eventually(t, 10*time.Second, fmt.Sprintf("gateway %d switched", i), func() bool {
			l, _ := g.Layout(ctx)
			return l == kvstore.ReservationLayoutSharded
		})
	}
	testenv.Eventually(t, 5*time.Second, "sharded grants after the switch", func() bool { return sharded.Load() > 20 })
	// The requests from before the switch end now: released in the single tag, through the other gateway.
	for _, l := range early {
		held.Add(-1)
		if err := gws[1].Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	for i, g := range gws {
		testenv.Eventually(t, 5*time.Second, fmt.Sprintf("gateway %d sees the single tag drained", i), func() bool {
			_, old := g.Layout(ctx)
			return !old
		})
	}
	s0 := sharded.Load() // and after the drain: 20 more sharded grants
	testenv.Eventually(t, 10*time.Second, "20 sharded grants after the drain", func() bool { return sharded.Load() >= s0+20 })
	stop.Store(true)
	wg.Wait()
	errs.Range(func(k, _ any) bool { t.Errorf("worker: %v", k); return true })
	t.Logf("%d grants, %d sharded, peak held %d (limit %d)", grants.Load(), sharded.Load(), peak.Load(), limit)
	if p := peak.Load(); p > limit {
		t.Fatalf("peak held %d over the limit %d", p, limit)
	}
	if v, err := srv.Client(t).Get(ctx, prefix+":v1:reservation-layout").Result(); err != nil || !strings.HasPrefix(v, "2 ") {
		t.Fatalf("marker %q %v: want the switch time written", v, err)
	}
	single, _ := kvstore.NewRedisReservations(srv.Client(t), kvstore.RedisConfig{Prefix: prefix})
	for _, r := range []kvstore.Reservations{single, gws[0], gws[1]} {
		m, err := r.InFlight(ctx, []kvstore.EndpointID{"e0"})
		if err != nil || len(m) != 0 {
			t.Fatalf("%T in flight after every release: %v %v", r, m, err)
		}
	}
}
