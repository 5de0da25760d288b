package route

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
	"github.com/kvgate/kvgate/kvstore/testenv"
)

// fleet is several routers sharing one redis-server, each on its own client, serving one endpoint, and the
// requests they hold open (what the engine would be running).
type fleet struct {
	t       *testing.T
	limit   int64
	routers []*Router
	guards  []*kvstore.Guarded
	stores  []*kvstore.Store
	counts  kvstore.Reservations // a client of its own (no epoch check), for the store's counts
	model   *Model
	mu      sync.Mutex
	held    [][]*Claim
}

func newFleet(t *testing.T, addr string, n int, limit int64) *fleet {
	eps := fakeEngines(t, 1)
	eps[0].Limits = kvstore.Limits{MaxRequests: limit, MaxTokens: 1 << 30}
	f := &fleet{t: t, limit: limit, held: make([][]*Claim, n)}
	counts, err := kvstore.OpenStore(context.Background(), kvstore.StoreConfig{Kind: "redis", Addrs: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { counts.Close() })
	f.counts = counts.Reservations
	for range n {
		st, err := kvstore.OpenStore(context.Background(), kvstore.StoreConfig{Kind: "redis", Addrs: []string{addr}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		g := guarded(t, st.Reservations, st.Index, st.Epoch, 0.34, func(o *kvstore.GuardConfig) {
			o.RecoveryGrace = 300 * time.Millisecond
			o.Endpoints = func() []kvstore.EndpointID { return []kvstore.EndpointID{"e0"} }
		})
		st.Epoch.Expect(g.ExpectedEpoch)
		r, m := newRouter(t, eps, g, g)
		f.routers, f.guards, f.stores, f.model = append(f.routers, r), append(f.guards, g), append(f.stores, st), m
	}
	return f
}

// pictured waits until every gateway has read the shared in-flight counters after the call (its routers
// read them every 20 ms): the picture its store-down caps will start from includes everything before.
func (f *fleet) pictured() {
	f.t.Helper()
	mark := time.Now()
	for i, g := range f.guards {
		if !testenv.WaitFor(5*time.Second, func() bool { return g.Status().PictureAt.After(mark) }) {
			f.t.Fatalf("g%d never read the shared counters again (last %v)", i, g.Status().PictureAt)
		}
	}
}

var outageBody = []byte(`{"model":"qwen3","max_tokens":4,"messages":[{"role":"user","content":"hello there"}]}`)

// take asks router g for one request; it reports whether the request got a claim (it then stays held).
func (f *fleet) take(g int) bool {
	f.t.Helper()
	req, err := parseChat(outageBody)
	if err != nil {
		f.t.Fatal(err)
	}
	p, err := f.routers[g].Plan(context.Background(), f.model, "", req, outageBody)
	if err != nil {
		f.t.Fatal(err)
	}
	c, err := f.routers[g].Reserve(context.Background(), p, nil)
	if errors.Is(err, ErrQueueTimeout) {
		return false
	}
	if err != nil {
		f.t.Fatal(err)
	}
	f.mu.Lock()
	f.held[g] = append(f.held[g], c)
	f.mu.Unlock()
	return true
}

// fill asks router g for requests until it refuses one; it returns how many it granted.
func (f *fleet) fill(g int) int {
	n := 0
	for f.take(g) {
		n++
		if n > 100 {
			f.t.Fatal("router admits without end")
		}
	}
	return n
}

// finish ends k of router g's held requests.
func (f *fleet) finish(g, k int) {
	for range k {
		c := f.held[g][0]
		f.held[g] = f.held[g][1:]
		f.routers[g].Release(c)
	}
}

// running is what the engine runs: every held request.
func (f *fleet) running() int64 {
	var n int64
	for _, h := range f.held {
		n += int64(len(h))
	}
	return n
}

func (f *fleet) check(phase string) {
	f.t.Helper()
	if n := f.running(); n > f.limit {
		f.t.Fatalf("%s: %d requests running on the endpoint, limit %d (held per gateway %v)", phase, n, f.limit, f.perGateway())
	}
}

func (f *fleet) perGateway() []int {
	out := make([]int, len(f.held))
	for i, h := range f.held {
		out[i] = len(h)
	}
	return out
}

// storeCount is the endpoint's in-flight request count on the store.
func (f *fleet) storeCount() int64 {
	f.t.Helper()
	m, err := f.counts.InFlight(context.Background(), []kvstore.EndpointID{"e0"})
	if err != nil {
		f.t.Fatal(err)
	}
	return m["e0"].Requests
}

func (f *fleet) waitAllUp() {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, g := range f.guards {
		for {
			st := g.Status()
			if !st.Down && !st.Recovering {
				break
			}
			if time.Now().After(deadline) {
				f.t.Fatalf("router still down or recovering: %+v", st)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

func (f *fleet) waitAllDown() {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, g := range f.guards {
		for !g.Status().Down {
			if time.Now().After(deadline) {
				f.t.Fatal("router never noticed the store outage")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// Three gateways share one endpoint of limit 6 on one redis-server with store_down_limit_share 0.34, and hold
// their requests open across a Redis outage and a restart that comes back empty. At no point may they run
// more than 6 requests together; after the restart the store must count exactly the requests still running,
// so the fleet can fill the endpoint again, and no more; releases after the restart must not release other
// gateways' leases (a restarted Redis hands out the same lease IDs again).
func TestRedisRestartKeepsInFlightLimit(t *testing.T) {
	rs := redistest.Start(t)
	f := newFleet(t, rs.Addr, 3, 6)

	// Store up: gateway 0 takes 4, gateway 1 takes 2, gateway 2 finds the endpoint full.
	for range 4 {
		if !f.take(0) {
			t.Fatal("g0 refused with the endpoint not full")
		}
	}
	if n := f.fill(1); n != 2 {
		t.Fatalf("g1 got %d, want the 2 left", n)
	}
	if f.take(2) {
		t.Fatal("g2 admitted over the limit with the store up")
	}
	f.check("store up")
	f.pictured() // every router has read the shared counters since

	// Outage: every gateway notices, then asks for more. Before the fix, each admitted 2 more (its local
	// share), ignoring the requests it already ran on store leases: 12 at once.
	rs.Stop()
	// g1's two requests end as the store dies: the failed release is how g1 notices. Its cap comes from what
	// it held at its last read of the counters (2 of 6), not from its holdings when it noticed (0): it may
	// run 2 again.
	f.finish(1, 2)
	if n := f.fill(1); n != 2 {
		t.Fatalf("g1 admitted %d after its own 2 ended with the store down, want 2", n)
	}
	for g := range f.routers {
		f.take(g) // a failed store call switches the router to store-down routing
	}
	f.waitAllDown()
	f.check("outage")
	for g := range f.routers {
		f.fill(g)
		f.check(fmt.Sprintf("outage, g%d filled", g))
	}
	if got := f.perGateway(); got[0] != 4 || got[1] != 2 || got[2] != 0 {
		t.Fatalf("outage: held %v, want [4 2 0] (nobody may admit on a full endpoint)", got)
	}
	// Requests end during the outage: g0's 3 slots come back to g0 up to its cap of 2 (floor 6 × 0.34).
	f.finish(0, 3)
	if n := f.fill(0); n != 1 {
		t.Fatalf("g0 admitted %d after 3 of its requests ended, want 1 (cap 2)", n)
	}
	f.fill(1)
	f.fill(2)
	f.check("outage after some requests ended")
	t.Logf("held during the outage: %v (limit %d)", f.perGateway(), f.limit)

	// Redis comes back empty. Every gateway re-registers what it still runs; the counts are exact once all
	// are back, and the endpoint fills up to its limit again, no further.
	rs.Restart()
	f.waitAllUp()
	if got, want := f.storeCount(), f.running(); got != want {
		t.Fatalf("after the restart the store counts %d running requests, want %d", got, want)
	}
	for g := range f.routers {
		f.fill(g)
		f.check(fmt.Sprintf("after the restart, g%d filled", g))
	}
	if n := f.running(); n != f.limit {
		t.Fatalf("after the restart the fleet runs %d, want the limit %d (capacity lost)", n, f.limit)
	}
	// Old requests end: their releases hit their re-registered leases, not the new ones with the same IDs.
	f.finish(0, len(f.held[0]))
	if got, want := f.storeCount(), f.running(); got != want {
		t.Fatalf("after g0's requests ended the store counts %d, want %d", got, want)
	}

	// A restart nobody sees fail (no request in flight to the store at the time): the epoch check notices.
	f.fill(0)
	rs.Restart()
	deadline := time.Now().Add(5 * time.Second)
	for f.storeCount() != f.running() {
		if time.Now().After(deadline) {
			t.Fatalf("after a quiet restart the store counts %d, want %d", f.storeCount(), f.running())
		}
		time.Sleep(10 * time.Millisecond)
	}
	f.waitAllUp()
	for g := range f.routers {
		f.fill(g)
		f.check(fmt.Sprintf("after the quiet restart, g%d filled", g))
	}
	for g := range f.routers {
		f.finish(g, len(f.held[g]))
	}
	if n := f.storeCount(); n != 0 {
		t.Fatalf("every request ended, the store still counts %d", n)
	}
	for g, gd := range f.guards {
		if st := gd.Status(); st.OwnInFlight != 0 || st.LocalInFlight != 0 {
			t.Fatalf("g%d: %+v", g, st)
		}
	}
}
