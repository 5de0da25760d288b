package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/cmd/enginesim/sim"
	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// fleetLoad sends completions from n clients through the gateways gws returns (round robin) until stop is
// called; stop waits for them and returns the answers by status.
func fleetLoad(t *testing.T, n int, gws func() []*Gateway) (stop func() map[int]int) {
	t.Helper()
	var done atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for c := range n {
		wg.Go(func() {
			for i := 0; !done.Load(); i++ {
				gs := gws()
				g := gs[(c+i)%len(gs)]
				body := fmt.Sprintf(`{"model":"qwen3","max_tokens":8,"prompt":"client %d request %d: %s"}`, c, i, strings.Repeat("fleet ", 20))
				req, _ := http.NewRequest(http.MethodPost, "http://"+g.Addr()+"/v1/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				st := 0
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					st = resp.StatusCode
				}
				mu.Lock()
				statuses[st]++
				mu.Unlock()
			}
		})
	}
	return func() map[int]int {
		done.Store(true)
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return statuses
	}
}

// storeErrors sums kvgate_store_errors_total over the gateways. A gateway whose store call failed (a
// timeout on a loaded machine) reserves within its store-down caps, on its own ledger alone, until the
// store answers again, so an engine's limit then holds per gateway only (kvstore.Guarded's documented
// trade-off of availability for strictness).
func storeErrors(t *testing.T, gws ...*Gateway) float64 {
	t.Helper()
	var n float64
	for _, g := range gws {
		for line := range strings.SplitSeq(metricsText(t, g), "\n") {
			if rest, ok := strings.CutPrefix(line, "kvgate_store_errors_total{"); ok {
				if i := strings.LastIndexByte(rest, ' '); i >= 0 {
					f, _ := strconv.ParseFloat(rest[i+1:], 64)
					n += f
				}
			}
		}
	}
	return n
}

// checkPeaks fails when an engine held more than limit requests, or, after a store failure (store-down
// caps, per gateway), more than limit per gateway.
// closedErrs are store errors of gateways already closed, which gateways counts.
func checkPeaks(t *testing.T, peaks []int, limit int, what string, closedErrs float64, gateways int, gws ...*Gateway) {
	t.Helper()
	bound := limit
	if n := closedErrs + storeErrors(t, gws...); n > 0 {
		bound = limit * gateways
		t.Logf("%s: %v store errors: the gateways reserved within their store-down caps; each engine's bound is %d", what, n, bound)
	}
	for i, p := range peaks {
		if p > bound {
			t.Fatalf("%s: engine e%d held %d requests, bound %d", what, i, p, bound)
		}
	}
}

func enginePeaks(engines []*sim.Engine) []int {
	var out []int
	for _, e := range engines {
		out = append(out, e.Stats().PeakInFlight)
	}
	return out
}

func layoutRes(t *testing.T, g *Gateway) *kvstore.LayoutRedisReservations {
	t.Helper()
	lr, ok := g.store.Reservations.(*kvstore.LayoutRedisReservations)
	if !ok {
		t.Fatalf("%s: store reservations %T, want the layout-following ones", g.Addr(), g.store.Reservations)
	}
	return lr
}

// TestReservationLayoutRollingUpgrade (#14 item 3, the rolling upgrade of the reservation layout): one real
// redis-server, two engines with max_inflight_requests 4. An old gateway (store.reservation_layout: 1, the
// single {res} tag of older releases) and a new one (the default: follow the store's marker) serve
// concurrent load; two leases per engine, taken through the new gateway before the switch, stand for long
// requests running across it. The old gateway leaves, a second new gateway joins, the operator runs SET
// kvg:v1:reservation-layout 2, and the load goes on through the switch. While the early leases run no
// engine may hold more than 4 - 2 requests (the sharded grants must count the single tag's leases); the
// early leases are then released through the other gateway, after which the single tag holds no count and
// the engines may fill up to their limit, never beyond it.
func TestReservationLayoutRollingUpgrade(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server, engines and three gateways")
	}
	const limit, early = 4, 2
	rs := redistest.Start(t)
	c := rs.Client(t)
	ctx := context.Background()
	engines := startSims(t, 2, func(c *sim.Config) { c.TimeScale = 0.3 })
	store := func(layout string) string {
		// store_timeout 2s: a store call over the default 200 ms on a loaded machine would put a gateway on
		// its store-down caps, where the limit holds per gateway only (checkPeaks).
		return fmt.Sprintf("store_timeout: 2s\nstore: {kind: redis, addrs: [%q]%s}\n", rs.Addr, layout)
	}
	oldYAML := gwYAML(simEndpointsYAML(engines, limit), store(", reservation_layout: 1"))
	newYAML := gwYAML(simEndpointsYAML(engines, limit), store(""))
	n1 := startGateway(t, newYAML)
	o1 := startGateway(t, oldYAML)
	if l, _ := layoutRes(t, n1).Layout(ctx); l != kvstore.ReservationLayoutSingle {
		t.Fatalf("new gateway before the marker on layout %d", l)
	}

	// The long requests: early leases per engine through n1, in the single tag.
	var held []kvstore.Lease
	for i := range engines {
		ep := kvstore.EndpointID(fmt.Sprintf("e%d", i))
		for range early {
			l, err := n1.guard.Reserve(ctx, []kvstore.Candidate{{Endpoint: ep, Limits: kvstore.Limits{MaxRequests: limit, MaxTokens: 1_000_000}}},
				kvstore.Cost{Requests: 1, Tokens: 100}, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(l.ID, "@") {
				t.Fatalf("lease %q before the marker is not the single tag's", l.ID)
			}
			held = append(held, l)
		}
	}
	var cur atomic.Pointer[[]*Gateway]
	cur.Store(&[]*Gateway{o1, n1})
	stopLoad := fleetLoad(t, 16, func() []*Gateway { return *cur.Load() })
	time.Sleep(time.Second)
	t.Logf("peaks with the old gateway: %v", enginePeaks(engines))

	// The old gateway leaves; a new one joins; the operator raises the marker.
	n2 := startGateway(t, newYAML)
	cur.Store(&[]*Gateway{n1, n2})
	o1Errs := storeErrors(t, o1)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if err := o1.Close(cctx); err != nil {
		t.Logf("close old gateway: %v", err)
	}
	cancel()
	if err := c.Set(ctx, "kvg:v1:reservation-layout", "2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, g := range []*Gateway{n1, n2} {
		if !waitFor(15*time.Second, func() bool { l, _ := layoutRes(t, g).Layout(ctx); return l == kvstore.ReservationLayoutSharded }) {
			t.Fatalf("%s not on the sharded layout 15 s after the marker", g.Addr())
		}
	}
	shardedGrants := func() int64 {
		var n int64
		for i := range engines {
			v, _ := c.Get(ctx, fmt.Sprintf("kvg:v1:{res:e%d}:seq", i)).Int64()
			n += v
		}
		return n
	}
	if !waitFor(10*time.Second, func() bool { return shardedGrants() >= 50 }) {
		t.Fatalf("only %d sharded grants after the switch", shardedGrants())
	}
	peaks := enginePeaks(engines)
	t.Logf("peaks across the switch with %d early leases per engine: %v (sharded grants %d)", early, peaks, shardedGrants())
	checkPeaks(t, peaks, limit-early, fmt.Sprintf("across the switch, beside %d early leases (limit %d)", early, limit), o1Errs, 3, n1, n2)
	for _, l := range held { // the long requests end: released through the other gateway, where they were taken
		if err := n2.guard.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	for _, g := range []*Gateway{n1, n2} {
		if !waitFor(10*time.Second, func() bool { _, old := layoutRes(t, g).Layout(ctx); return !old }) {
			t.Fatalf("%s still counts single-tag leases after their release", g.Addr())
		}
	}
	if m, err := c.HGetAll(ctx, "kvg:v1:{res}:inflight").Result(); err != nil || len(m) != 0 {
		t.Fatalf("single-tag counts after every early lease was released: %v %v", m, err)
	}
	before := shardedGrants()
	if !waitFor(10*time.Second, func() bool { return shardedGrants() >= before+50 }) {
		t.Fatalf("load stalled after the early leases were released")
	}
	statuses := stopLoad()
	peaks = enginePeaks(engines)
	t.Logf("peaks at the end %v; answers by status %v", peaks, statuses)
	checkPeaks(t, peaks, limit, "at the end", o1Errs, 3, n1, n2)
	if statuses[200] == 0 {
		t.Fatalf("no request served: %v", statuses)
	}
	for _, g := range []*Gateway{n1, n2} { // nothing stuck, read through either gateway
		if !waitFor(5*time.Second, func() bool {
			m, err := g.guard.InFlight(ctx, []kvstore.EndpointID{"e0", "e1"})
			return err == nil && len(m) == 0
		}) {
			m, err := g.guard.InFlight(ctx, []kvstore.EndpointID{"e0", "e1"})
			t.Fatalf("%s: in flight after the load: %v %v", g.Addr(), m, err)
		}
	}
}

// TestShardedReservationsClusterFleet (#14 item 3): two gateways with store.reservation_layout: 2 on a real
// 3-master Redis Cluster, four engines with max_inflight_requests 3 (their tags {res:e0}..{res:e3} hash to
// all three masters), 24 clients through both gateways. No engine ever holds more than 3 requests, a lease
// taken through one gateway is counted through the other, and each master runs the reservation scripts of
// its endpoints (INFO commandstats after CONFIG RESETSTAT; each endpoint's grants are its lease counter).
func TestShardedReservationsClusterFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node Redis Cluster, engines and two gateways")
	}
	const limit = 3
	cl := redistest.StartCluster(t, 3)
	cc := cl.Client(t)
	ctx := context.Background()
	engines := startSims(t, 4, func(c *sim.Config) { c.TimeScale = 0.3 })
	var addrs []string
	for _, a := range cl.Addrs {
		addrs = append(addrs, strconv.Quote(a))
	}
	yaml := gwYAML(simEndpointsYAML(engines, limit), "store_timeout: 2s\nstore: {kind: redis, cluster: true, index_layout: 2, reservation_layout: 2, addrs: ["+strings.Join(addrs, ", ")+"]}\n")
	g1, g2 := startGateway(t, yaml), startGateway(t, yaml)
	if _, ok := g1.store.Reservations.(*kvstore.ShardedRedisReservations); !ok {
		t.Fatalf("store reservations %T, want sharded", g1.store.Reservations)
	}

	// Through one gateway, checked through the other: e0 filled by g1 is full for g2.
	e0 := []kvstore.Candidate{{Endpoint: "e0", Limits: kvstore.Limits{MaxRequests: limit, MaxTokens: 1_000_000}}}
	var held []kvstore.Lease
	for range limit {
		l, err := g1.guard.Reserve(ctx, e0, kvstore.Cost{Requests: 1, Tokens: 10}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	if m, err := g2.guard.InFlight(ctx, []kvstore.EndpointID{"e0"}); err != nil || m["e0"].Requests != limit {
		t.Fatalf("e0 through the other gateway: %v %v, want %d requests", m, err, limit)
	}
	if _, err := g2.store.Reservations.Reserve(ctx, e0, kvstore.Cost{Requests: 1, Tokens: 10}, time.Minute); !errors.Is(err, kvstore.ErrNoCapacity) {
		t.Fatalf("a fourth lease on e0 through the other gateway: %v, want ErrNoCapacity", err)
	}
	for _, l := range held {
		if err := g2.guard.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}

	masters := make([]*redis.Client, len(cl.Addrs))
	for i, a := range cl.Addrs {
		masters[i] = redis.NewClient(&redis.Options{Addr: a})
		t.Cleanup(func() { _ = masters[i].Close() })
	}
	grants := func() map[string]int64 { // per master address: leases granted on its endpoints
		out := map[string]int64{}
		for i := range engines {
			key := fmt.Sprintf("kvg:v1:{res:e%d}:seq", i)
			v, err := cc.Get(ctx, key).Int64()
			if err != nil && err != redis.Nil {
				t.Fatal(err)
			}
			for _, m := range masters {
				if n, err := m.Exists(ctx, key).Result(); err == nil && n == 1 {
					out[m.Options().Addr] += v
				}
			}
		}
		return out
	}
	base := grants()
	for _, m := range masters {
		if err := m.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	stop := fleetLoad(t, 24, func() []*Gateway { return []*Gateway{g1, g2} })
	if !waitFor(20*time.Second, func() bool {
		var n int64
		for a, v := range grants() {
			n += v - base[a]
		}
		return n >= 400
	}) {
		t.Fatalf("load too slow: grants %v", grants())
	}
	statuses := stop()
	calls := regexp.MustCompile(`cmdstat_(?:evalsha|eval):calls=(\d+)`)
	after := grants()
	busy := 0
	var report []string
	for _, m := range masters {
		info, err := m.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		var scripts int64
		for _, s := range calls.FindAllStringSubmatch(info, -1) {
			v, _ := strconv.ParseInt(s[1], 10, 64)
			scripts += v
		}
		a := m.Options().Addr
		g := after[a] - base[a]
		report = append(report, fmt.Sprintf("%s: %d scripts, %d grants", a, scripts, g))
		if g > 0 {
			busy++
		}
		if scripts < g {
			t.Errorf("master %s: %d scripts for %d grants", a, scripts, g)
		}
	}
	peaks := enginePeaks(engines)
	t.Logf("per master: %s; engine peaks %v (limit %d); answers %v", strings.Join(report, "; "), peaks, limit, statuses)
	if busy < 3 {
		t.Errorf("reservations granted on %d of 3 masters", busy)
	}
	for i, p := range peaks {
		if p > limit {
			t.Errorf("engine e%d held %d requests, limit %d", i, p, limit)
		}
	}
	if statuses[200] == 0 {
		t.Fatalf("no request served: %v", statuses)
	}
}
