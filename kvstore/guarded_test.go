package kvstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
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

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// conformanceGuard is the conformance suites' Guarded config: generous deadlines, as a healthy store must
// pass whatever the load on the test machine (a store call past the timeout is an outage).
var conformanceGuard = kvstore.GuardConfig{Log: quiet, ProbeInterval: 2 * time.Second, Timeout: 5 * time.Second}

// guard wraps a store's parts with Guarded for the conformance suites, closed with the test.
func guard(t *testing.T, res kvstore.Reservations, idx kvstore.Index, remote kvstore.Remote) *kvstore.Guarded {
	o := conformanceGuard
	o.Reservations, o.Index, o.Remote = res, idx, remote
	g := kvstore.NewGuarded(o)
	t.Cleanup(g.Close)
	return g
}

func TestGuardedConformanceMemory(t *testing.T) {
	t.Run("Index", func(t *testing.T) {
		conformance.RunIndex(t, func(t *testing.T) kvstore.Index {
			return guard(t, kvstore.NewMemoryReservations(nil), kvstore.NewMemoryIndex(kvstore.MemoryConfig{Shards: 4}), nil)
		})
	})
	t.Run("Reservations", func(t *testing.T) {
		conformance.RunReservations(t, func(t *testing.T) kvstore.Reservations {
			return guard(t, kvstore.NewMemoryReservations(nil), nil, nil)
		})
	})
	t.Run("HammerThreeGuards", func(t *testing.T) {
		res := kvstore.NewMemoryReservations(nil)
		conformance.HammerReservations(t, []kvstore.Reservations{guard(t, res, nil, nil), guard(t, res, nil, nil), guard(t, res, nil, nil)})
	})
	t.Run("FaultyStoreHealthy", func(t *testing.T) {
		conformance.RunIndex(t, func(t *testing.T) kvstore.Index {
			fs := kvstore.NewFaultyStore(nil)
			c := fs.Client()
			return guard(t, c.Reservations(), c.Index(), c)
		})
		conformance.RunReservations(t, func(t *testing.T) kvstore.Reservations {
			fs := kvstore.NewFaultyStore(nil)
			c := fs.Client()
			return guard(t, c.Reservations(), c.Index(), c)
		})
	})
}

// redisGuard opens a store on addr (its own client, as a gateway) and wraps it with Guarded, the epoch
// marker as its Remote and the marker's connection check on.
func redisGuard(t *testing.T, addr string, cluster bool, prefix string, o kvstore.GuardConfig) (*kvstore.Guarded, *kvstore.Store) {
	return redisGuardLayout(t, addr, cluster, prefix, kvstore.ReservationLayoutFollow, o)
}

// redisGuardLayout is redisGuard with the store's reservation layout (StoreConfig.ReservationLayout).
func redisGuardLayout(t *testing.T, addr string, cluster bool, prefix string, layout int, o kvstore.GuardConfig) (*kvstore.Guarded, *kvstore.Store) {
	st, err := kvstore.OpenStore(context.Background(), kvstore.StoreConfig{Kind: "redis", Addrs: []string{addr}, Cluster: cluster, Prefix: prefix,
		ReservationLayout: layout})
	if err != nil {
		t.Fatal(err)
	}
	o.Reservations, o.Index, o.Remote = st.Reservations, st.Index, st.Epoch
	if o.Log == nil {
		o.Log = quiet
	}
	if o.ProbeInterval == 0 {
		o.ProbeInterval = 20 * time.Millisecond
	}
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Second
	}
	g := kvstore.NewGuarded(o)
	st.Epoch.Expect(g.ExpectedEpoch)
	t.Cleanup(func() {
		g.Close()
		_ = st.Close()
	})
	return g, st
}

func TestGuardedConformanceRedis(t *testing.T) {
	srv := redistest.Start(t)
	t.Run("Index", func(t *testing.T) {
		conformance.RunIndex(t, func(t *testing.T) kvstore.Index {
			g, _ := redisGuard(t, srv.Addr, false, freshPrefix(), conformanceGuard)
			return g
		})
	})
	t.Run("Reservations", func(t *testing.T) {
		conformance.RunReservations(t, func(t *testing.T) kvstore.Reservations {
			g, _ := redisGuard(t, srv.Addr, false, freshPrefix(), conformanceGuard)
			return g
		})
	})
	t.Run("HammerThreeGateways", func(t *testing.T) {
		prefix := freshPrefix()
		var handles []kvstore.Reservations
		for range 3 {
			g, _ := redisGuard(t, srv.Addr, false, prefix, conformanceGuard)
			handles = append(handles, g)
		}
		conformance.HammerReservations(t, handles)
	})
	guardedReservationLayouts(t, srv.Addr, false, srv.Client(t))
}

// guardedReservationLayouts runs the reservations conformance suite and the three-gateway hammer on
// Guarded over the sharded reservations (store.reservation_layout 2) and over the layout-following ones
// mid-switch (marker raised, a single-tag lease still running).
func guardedReservationLayouts(t *testing.T, addr string, cluster bool, c redis.UniversalClient) {
	for _, l := range []struct {
		name   string
		layout int
		setup  func(t *testing.T, c redis.UniversalClient, prefix string)
	}{
		{"Sharded", kvstore.ReservationLayoutSharded, func(*testing.T, redis.UniversalClient, string) {}},
		{"Switching", kvstore.ReservationLayoutFollow, reservationLayoutStates[1].setup},
	} {
		t.Run(l.name+"Reservations", func(t *testing.T) {
			conformance.RunReservations(t, func(t *testing.T) kvstore.Reservations {
				p := freshPrefix()
				l.setup(t, c, p)
				g, _ := redisGuardLayout(t, addr, cluster, p, l.layout, conformanceGuard)
				return g
			})
		})
		t.Run(l.name+"HammerThreeGateways", func(t *testing.T) {
			p := freshPrefix()
			l.setup(t, c, p)
			var handles []kvstore.Reservations
			for range 3 {
				g, _ := redisGuardLayout(t, addr, cluster, p, l.layout, conformanceGuard)
				handles = append(handles, g)
			}
			conformance.HammerReservations(t, handles)
		})
	}
}

// The epoch marker honours the key prefix: two fleets on one Redis (two prefixes) have their own epochs,
// and a restart of one fleet's data (its marker removed) is not seen by the other.
func TestRedisEpochPerPrefix(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	a, err := kvstore.NewRedisEpoch(c, kvstore.RedisConfig{Prefix: "fleet-a"})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := kvstore.NewRedisEpoch(c, kvstore.RedisConfig{Prefix: "fleet-b"})
	def, _ := kvstore.NewRedisEpoch(c, kvstore.RedisConfig{})
	ea, err := a.Epoch(ctx)
	if err != nil || ea == "" {
		t.Fatalf("epoch a: %q %v", ea, err)
	}
	eb, _ := b.Epoch(ctx)
	if eb == "" || eb == ea {
		t.Fatalf("two prefixes share an epoch: %q %q", ea, eb)
	}
	if again, _ := a.Epoch(ctx); again != ea {
		t.Fatalf("epoch a moved without a restart: %q then %q", ea, again)
	}
	// The default prefix gives the key gateways used before the prefix was honoured (rolling upgrades).
	if a.Key() != "fleet-a:v1:{res}:epoch" || def.Key() != kvstore.DefaultRedisPrefix+":v1:{res}:epoch" {
		t.Fatalf("keys %q %q", a.Key(), def.Key())
	}

	// Fleet b's data is flushed (its keys deleted): b gets a new epoch, a keeps its own.
	if err := c.Del(ctx, b.Key()).Err(); err != nil {
		t.Fatal(err)
	}
	if nb, _ := b.Epoch(ctx); nb == eb {
		t.Fatal("b's epoch survived the loss of its marker")
	}
	if again, _ := a.Epoch(ctx); again != ea {
		t.Fatalf("a's epoch changed when b lost its data: %q then %q", ea, again)
	}
	// Two Guarded stores, one per prefix, on one Redis: b's marker removed, a's gateway does not go down.
	ga, _ := redisGuard(t, srv.Addr, false, "fleet-a", kvstore.GuardConfig{})
	gb, _ := redisGuard(t, srv.Addr, false, "fleet-b", kvstore.GuardConfig{})
	gbEpoch, _ := gb.ExpectedEpoch()
	if err := c.Del(ctx, b.Key()).Err(); err != nil {
		t.Fatal(err)
	}
	if !waitFor(5*time.Second, func() bool { e, on := gb.ExpectedEpoch(); return on && e != gbEpoch }) {
		t.Fatal("fleet b never moved to its new epoch")
	}
	if e, _ := ga.ExpectedEpoch(); e != ea || ga.Status().Down {
		t.Fatalf("fleet a: epoch %q (want %q), status %+v", e, ea, ga.Status())
	}
}

// Redis errors are ErrUnavailable exactly when Redis cannot serve: refused connections, a paused server past
// the deadline, LOADING, BUSY, READONLY; not a script error or a missing key.
func TestRedisUnavailableClassification(t *testing.T) {
	t.Parallel() // waits on its own redis-servers (a busy one, a primary and replica, a stopped one) only; no TTL or latency bound
	for _, c := range []struct {
		err  error
		want bool
	}{
		{errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), true},
		{io.EOF, true},
		{context.DeadlineExceeded, true},
		{redis.ErrClosed, true},
		{kvstore.ErrEpochChanged, true},
		{proto("LOADING Redis is loading the dataset in memory"), true},
		{proto("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."), true},
		{proto("READONLY You can't write against a read only replica."), true},
		{proto("CLUSTERDOWN The cluster is down"), true},
		{proto("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{proto("OOM command not allowed when used memory > 'maxmemory'."), true},
		{proto("ERR max number of clients reached"), true},
		{proto("ERR user_script:1: Script attempted to access nonexistent global variable"), false},
		{proto("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{proto("NOAUTH Authentication required."), false},
		{proto("FENCED token 3 is not 4"), false},
		{redis.Nil, false},
		{context.Canceled, false},
		{nil, false},
	} {
		if got := kvstore.RedisUnavailable(c.err); got != c.want {
			t.Errorf("RedisUnavailable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	// Real replies: BUSY from a server running a script past lua-time-limit, READONLY from a replica.
	busy := redistest.StartArgs(t, "--lua-time-limit", "10")
	bc := busy.Client(t)
	go bc.Eval(context.Background(), "local t = redis.call('TIME') while true do end", nil)
	other := busy.Client(t)
	// The event: the script runs (a ping answers PONG until it does, then BUSY past lua-time-limit).
	var err error
	testenv.WaitFor(5*time.Second, func() bool { err = other.Ping(context.Background()).Err(); return err != nil })
	if !kvstore.RedisUnavailable(err) || !redis.HasErrorPrefix(err, "BUSY") {
		t.Errorf("ping during a long script: %v", err)
	}
	_ = other.ScriptKill(context.Background()).Err()
	primary := redistest.Start(t)
	replica := redistest.StartArgs(t, "--replicaof", "127.0.0.1", fmt.Sprint(portOf(t, primary.Addr)))
	if err := replica.Client(t).Set(context.Background(), "k", "v", 0).Err(); !kvstore.RedisUnavailable(err) || !redis.IsReadOnlyError(err) {
		t.Errorf("write on a replica: %v", err)
	}
	// Through the store: a stopped server's errors are ErrUnavailable with the cause kept; a refusal is not.
	srv := redistest.Start(t)
	st, err := kvstore.OpenStore(context.Background(), kvstore.StoreConfig{Kind: "redis", Addrs: []string{srv.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	one := []kvstore.Candidate{{Endpoint: "e", Limits: kvstore.Limits{MaxRequests: 1}}}
	if _, err := st.Reservations.Reserve(ctx, one, kvstore.Cost{Requests: 1}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Reservations.Reserve(ctx, one, kvstore.Cost{Requests: 1}, time.Minute); !errors.Is(err, kvstore.ErrNoCapacity) || errors.Is(err, kvstore.ErrUnavailable) {
		t.Fatalf("full endpoint: %v", err)
	}
	if _, err := st.Index.Match(ctx, "m", []kvstore.BlockKey{1}); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	_, err = st.Index.Match(ctx, "m", []kvstore.BlockKey{1})
	if !errors.Is(err, kvstore.ErrUnavailable) {
		t.Fatalf("match on a stopped redis: %v", err)
	}
	if _, err := st.Reservations.InFlight(ctx, []kvstore.EndpointID{"e"}); !errors.Is(err, kvstore.ErrUnavailable) {
		t.Fatalf("inflight on a stopped redis: %v", err)
	}
	if err := st.Index.Apply(ctx, "m", []kvstore.Update{{Endpoint: "e", Tier: kvstore.TierGPU, Keys: []kvstore.BlockKey{1}}}); !errors.Is(err, kvstore.ErrUnavailable) {
		t.Fatalf("apply on a stopped redis: %v", err)
	}
}

// proto is a Redis error reply (a redis.Error) with msg. The replies a test server gives for real are
// checked below.
func proto(msg string) error { return redisReply(msg) }

type redisReply string

func (e redisReply) Error() string { return string(e) }
func (redisReply) RedisError()     {}

func portOf(t *testing.T, addr string) int {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

var waitFor = testenv.WaitFor

// ---- the outage suite ----

// outageStore is one shared store under test with the faults the suite injects, and a way to open one
// gateway's Guarded on it.
type outageStore struct {
	name string
	// open returns a new gateway's Guarded (its own client) and the raw reservations for checks.
	open func(t *testing.T, o kvstore.GuardConfig) *kvstore.Guarded
	raw  func(t *testing.T) kvstore.Reservations
	// stop makes the store unreachable; start brings it back with its data, restartEmpty without.
	stop, start, restartEmpty func()
	// restartUnnoticed restarts the store empty with nothing failing on the way (between two calls).
	restartUnnoticed func()
	// hang pauses the store (calls hang), resume ends it.
	hang, resume func()
}

func memoryOutageStore(t *testing.T) *outageStore {
	fs := kvstore.NewFaultyStore(nil)
	return &outageStore{
		name: "memory",
		open: func(t *testing.T, o kvstore.GuardConfig) *kvstore.Guarded {
			c := fs.Client()
			o.Reservations, o.Index, o.Remote = c.Reservations(), c.Index(), c
			g := kvstore.NewGuarded(o)
			c.Expect(g.ExpectedEpoch)
			t.Cleanup(g.Close)
			return g
		},
		raw:              func(*testing.T) kvstore.Reservations { return fs.Reservations() },
		stop:             func() { fs.Fail(errors.New("connection refused (injected)")) },
		start:            fs.Heal,
		restartEmpty:     func() { fs.RestartEmpty(); fs.Heal() },
		restartUnnoticed: fs.RestartEmpty,
		hang:             fs.Hang,
		resume:           fs.Heal,
	}
}

func redisOutageStore(t *testing.T) *outageStore {
	return redisOutageStoreLayout(t, kvstore.ReservationLayoutFollow)
}

// redisOutageStoreLayout is redisOutageStore with the store's reservation layout; raw reads the layout's
// own counters.
func redisOutageStoreLayout(t *testing.T, layout int) *outageStore {
	srv := redistest.Start(t)
	prefix := freshPrefix()
	var stopped atomic.Bool
	return &outageStore{
		name: "redis",
		open: func(t *testing.T, o kvstore.GuardConfig) *kvstore.Guarded {
			g, _ := redisGuardLayout(t, srv.Addr, false, prefix, layout, o)
			return g
		},
		raw: func(t *testing.T) kvstore.Reservations {
			var r kvstore.Reservations
			var err error
			if layout == kvstore.ReservationLayoutSharded {
				r, err = kvstore.NewShardedRedisReservations(srv.Client(t), kvstore.RedisConfig{Prefix: prefix})
			} else {
				r, err = kvstore.NewRedisReservations(srv.Client(t), kvstore.RedisConfig{Prefix: prefix})
			}
			if err != nil {
				t.Fatal(err)
			}
			return r
		},
		stop: func() { srv.Stop(); stopped.Store(true) },
		start: func() {
			// redistest restarts without persistence: a stopped server always comes back empty. The suite
			// only calls start after stop where "with its data" is not asserted.
			srv.Restart()
			stopped.Store(false)
		},
		restartEmpty:     func() { srv.Restart(); stopped.Store(false) },
		restartUnnoticed: srv.Restart,
		hang:             srv.Pause,
		resume:           srv.Resume,
	}
}

func TestGuardedOutageMemory(t *testing.T) { runOutageSuite(t, memoryOutageStore) }

func TestGuardedOutageRedis(t *testing.T) { runOutageSuite(t, redisOutageStore) }

// TestGuardedOutageRedisSharded is the outage suite over the sharded reservations (reservation_layout 2).
func TestGuardedOutageRedisSharded(t *testing.T) {
	runOutageSuite(t, func(t *testing.T) *outageStore {
		return redisOutageStoreLayout(t, kvstore.ReservationLayoutSharded)
	})
}

// fleetOf is n gateways' Guarded on one store, sharing one endpoint of the given limit.
type fleetOf struct {
	t      *testing.T
	st     *outageStore
	gs     []*kvstore.Guarded
	limit  int64
	cand   []kvstore.Candidate
	mu     sync.Mutex
	held   [][]kvstore.Lease
	epochs atomic.Int64 // OnEpochChange calls
}

func newFleetOf(t *testing.T, st *outageStore, n int, limit int64, share float64) *fleetOf {
	f := &fleetOf{t: t, st: st, limit: limit, held: make([][]kvstore.Lease, n),
		cand: []kvstore.Candidate{{Endpoint: "e0", Limits: kvstore.Limits{MaxRequests: limit}}}}
	for range n {
		f.gs = append(f.gs, st.open(t, kvstore.GuardConfig{DownLimitShare: share, Log: quiet,
			ProbeInterval: 20 * time.Millisecond, RecoveryGrace: 200 * time.Millisecond, Timeout: 300 * time.Millisecond,
			Endpoints:     func() []kvstore.EndpointID { return []kvstore.EndpointID{"e0"} },
			OnEpochChange: func(old, new string) { f.epochs.Add(1) }}))
	}
	stop, done := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(stop); <-done }) // before the gateways close (cleanups run last first)
	go func() { defer close(done); f.renew(stop) }()
	return f
}

// leaseTTL is the fleet's lease TTL; renew keeps held leases alive as the server does (every TTL/3). A
// reservation whose reply is lost (a timeout while the store restarts) leaves a lease nobody holds on the
// store for up to this long: the store's counts converge to the running leases within it.
const leaseTTL = 1500 * time.Millisecond

func (f *fleetOf) renew(stop chan struct{}) {
	t := time.NewTicker(leaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		f.mu.Lock()
		for g, h := range f.held {
			for i, l := range h {
				nl, err := f.gs[g].Renew(context.Background(), l, leaseTTL)
				if err != nil {
					f.t.Errorf("g%d renew %s: %v", g, l.ID, err)
					continue
				}
				h[i] = nl
			}
		}
		f.mu.Unlock()
	}
}

// exact waits until the store counts exactly the running leases (see leaseTTL).
func (f *fleetOf) exact(phase string) {
	f.t.Helper()
	if !waitFor(2*leaseTTL, func() bool { return f.storeCount() == f.running() }) {
		f.t.Fatalf("%s: the store counts %d, want the %d running (held %d %d)", phase, f.storeCount(), f.running(),
			len(f.held[0]), len(f.held[len(f.held)-1]))
	}
}

// take asks gateway g for one lease; it reports whether g granted it (it is then held).
func (f *fleetOf) take(g int) bool {
	f.t.Helper()
	l, err := f.gs[g].Reserve(context.Background(), f.cand, kvstore.Cost{Requests: 1, Tokens: 10}, leaseTTL)
	if errors.Is(err, kvstore.ErrNoCapacity) {
		return false
	}
	if err != nil {
		f.t.Fatalf("g%d reserve: %v", g, err)
	}
	f.mu.Lock()
	f.held[g] = append(f.held[g], l)
	f.mu.Unlock()
	return true
}

func (f *fleetOf) fill(g int) int {
	n := 0
	for f.take(g) {
		if n++; n > 100 {
			f.t.Fatal("admits without end")
		}
	}
	return n
}

func (f *fleetOf) finish(g, k int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for range k {
		l := f.held[g][0]
		f.held[g] = f.held[g][1:]
		if err := f.gs[g].Release(context.Background(), l); err != nil {
			f.t.Fatalf("g%d release: %v", g, err)
		}
	}
}

func (f *fleetOf) running() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var n int64
	for _, h := range f.held {
		n += int64(len(h))
	}
	return n
}

func (f *fleetOf) check(phase string) {
	f.t.Helper()
	if n := f.running(); n > f.limit {
		f.t.Fatalf("%s: %d leases running on the endpoint, limit %d", phase, n, f.limit)
	}
}

func (f *fleetOf) storeCount() int64 {
	f.t.Helper()
	m, err := f.st.raw(f.t).InFlight(context.Background(), []kvstore.EndpointID{"e0"})
	if err != nil {
		f.t.Fatal(err)
	}
	return m["e0"].Requests
}

func (f *fleetOf) waitAll(phase string, ok func(kvstore.GuardStatus) bool) {
	f.t.Helper()
	for i, g := range f.gs {
		if !waitFor(10*time.Second, func() bool { return ok(g.Status()) }) {
			f.t.Fatalf("%s: g%d status %+v", phase, i, g.Status())
		}
	}
}

func up(s kvstore.GuardStatus) bool   { return !s.Down && !s.Recovering }
func down(s kvstore.GuardStatus) bool { return s.Down }

// runOutageSuite is the outage suite: a store stopped, restarted empty, restarted unnoticed and hung, under
// two gateways holding leases on one endpoint; the caps hold throughout and the store's counters are exact
// after every recovery.
func runOutageSuite(t *testing.T, newStore func(*testing.T) *outageStore) {
	t.Run("StoppedThenRestartedEmpty", func(t *testing.T) {
		st := newStore(t)
		f := newFleetOf(t, st, 2, 6, 0.5)
		for range 3 {
			f.take(0)
		}
		if n := f.fill(1); n != 3 {
			t.Fatalf("g1 got %d, want the 3 left", n)
		}
		for _, g := range f.gs { // both read the fleet's counters (the store-down base)
			if _, err := g.InFlight(context.Background(), []kvstore.EndpointID{"e0"}); err != nil {
				t.Fatal(err)
			}
		}
		st.stop()
		// Match fails fast with ErrUnavailable once the store is known down; before, within the timeout.
		start := time.Now()
		if _, err := f.gs[0].Match(context.Background(), "m", []kvstore.BlockKey{1}); !errors.Is(err, kvstore.ErrUnavailable) {
			t.Fatalf("match with the store stopped: %v", err)
		}
		if d := time.Since(start); d > 2*300*time.Millisecond+time.Second {
			t.Fatalf("match took %v with the store stopped", d)
		}
		for g := range f.gs {
			f.take(g)
		}
		f.waitAll("stopped", down)
		f.check("outage")
		if got := []int{len(f.held[0]), len(f.held[1])}; got[0] != 3 || got[1] != 3 {
			t.Fatalf("outage on a full endpoint: held %v, want [3 3]", got)
		}
		if s := f.gs[0].Status(); s.OwnInFlight != 3 || s.LocalInFlight != 0 || s.LastError == "" {
			t.Fatalf("g0 status %+v", s)
		}
		if _, err := f.gs[0].Match(context.Background(), "m", []kvstore.BlockKey{1}); !errors.Is(err, kvstore.ErrUnavailable) {
			t.Fatalf("match while down: %v", err)
		}
		m, err := f.gs[0].InFlight(context.Background(), []kvstore.EndpointID{"e0"})
		if err != nil || m["e0"].Requests != 3 {
			t.Fatalf("in flight while down: %v %v (want own 3)", m, err)
		}
		// Two of g0's end (their releases deferred), one comes back within its cap of 3.
		f.finish(0, 2)
		if n := f.fill(0); n != 2 {
			t.Fatalf("g0 admitted %d after 2 of its 3 ended, want 2 (cap 3)", n)
		}
		f.check("outage after some ended")
		if s := f.gs[0].Status(); s.LocalInFlight != 2 {
			t.Fatalf("g0: %+v, want 2 local", s)
		}
		f.mu.Lock()
		first := f.held[1][0]
		f.mu.Unlock()
		renewed, err := f.gs[1].Renew(context.Background(), first, leaseTTL)
		if err != nil || renewed.ID != first.ID {
			t.Fatalf("renew while down: %+v %v", renewed, err)
		}
		st.restartEmpty()
		f.waitAll("restarted empty", up)
		f.exact("after the empty restart")
		if n := f.epochs.Load(); n != 2 {
			t.Fatalf("OnEpochChange ran %d times, want once per gateway", n)
		}
		f.fill(0)
		f.fill(1)
		if n := f.running(); n != f.limit {
			t.Fatalf("after the restart the fleet runs %d, want the limit %d", n, f.limit)
		}
		// Old leases end: their releases hit their re-registered store leases, never others' new ones.
		f.finish(1, len(f.held[1]))
		f.exact("after g1's leases ended")
		f.finish(0, len(f.held[0]))
		f.exact("every lease ended")
		for i, g := range f.gs {
			if s := g.Status(); s.OwnInFlight != 0 || s.LocalInFlight != 0 {
				t.Fatalf("g%d: %+v", i, s)
			}
		}
	})
	t.Run("RestartedUnnoticed", func(t *testing.T) {
		st := newStore(t)
		f := newFleetOf(t, st, 2, 4, 0.5)
		f.take(0)
		f.take(0)
		f.take(1)
		// The event: each gateway's probe has read the shared counters with all three leases (the picture
		// its store-down caps start from): a second read after the takes, since one begun before the last
		// take may end after it.
		for i, g := range f.gs {
			taken := time.Now()
			for range 2 {
				at := g.Status().PictureAt
				testenv.Eventually(t, 5*time.Second, fmt.Sprintf("g%d's next read of the counters after %v", i, at), func() bool {
					return g.Status().PictureAt.After(at) && g.Status().PictureAt.After(taken)
				})
			}
		}
		// Restarted between two calls: nothing failed, the store is empty. The next reservation must not see
		// the empty store's free capacity as real: the connection check (or, later, the epoch check) sends
		// the gateway through recovery first.
		st.restartUnnoticed()
		f.fill(1) // an empty store trusted would grant 4 more
		f.check("right after the unnoticed restart")
		f.waitAll("after the unnoticed restart", up)
		f.exact("after the unnoticed restart")
		f.fill(0)
		f.fill(1)
		f.check("filled after the unnoticed restart")
		if n := f.running(); n != f.limit {
			t.Fatalf("fleet runs %d, want %d", n, f.limit)
		}
		if f.epochs.Load() != 2 {
			t.Fatalf("OnEpochChange ran %d times, want 2", f.epochs.Load())
		}
		for g := range f.gs {
			f.finish(g, len(f.held[g]))
		}
		f.exact("every lease ended")
	})
	t.Run("Hung", func(t *testing.T) {
		st := newStore(t)
		f := newFleetOf(t, st, 1, 4, 0.5)
		f.take(0)
		st.hang()
		resumed := false
		defer func() {
			if !resumed {
				st.resume()
			}
		}()
		start := time.Now()
		if !f.take(0) {
			t.Fatal("a reservation within the store-down cap was refused with the store hung")
		}
		// Timeout 300 ms: one call that hangs to the deadline, then the store-down cap decides.
		if d := time.Since(start); d > 2*300*time.Millisecond {
			t.Fatalf("reservation on a hung store took %v, want < 2 × the 300 ms timeout", d)
		}
		if !f.gs[0].Status().Down {
			t.Fatal("hung store not marked down")
		}
		if f.take(0) {
			t.Fatal("admitted over the store-down cap of 2")
		}
		st.resume()
		resumed = true
		f.waitAll("resumed", up)
		// The reservation that hung reaches the server when it resumes and takes a lease nobody holds: it
		// counts until its TTL passes (the error errs toward fewer requests, never more).
		f.exact("after the pause")
		f.finish(0, len(f.held[0]))
	})
}

// A lease that is neither renewed nor released stops counting in the ledger when its TTL passes, as on the
// store: a Renew then says ErrLeaseNotLive, and while the store is down its capacity is free again.
func TestGuardedLeaseExpiresInLedger(t *testing.T) {
	fs := kvstore.NewFaultyStore(nil)
	c := fs.Client()
	g := kvstore.NewGuarded(kvstore.GuardConfig{Reservations: c.Reservations(), Remote: c, Log: quiet,
		ProbeInterval: 20 * time.Millisecond, DownLimitShare: 1})
	defer g.Close()
	cand := []kvstore.Candidate{{Endpoint: "e", Limits: kvstore.Limits{MaxRequests: 1}}}
	l, err := g.Reserve(context.Background(), cand, kvstore.Cost{Requests: 1}, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	fs.Fail(errors.New("down (injected)"))
	if _, err := g.Reserve(context.Background(), cand, kvstore.Cost{Requests: 1}, time.Minute); !errors.Is(err, kvstore.ErrNoCapacity) {
		t.Fatalf("second lease on a full endpoint with the store down: %v", err)
	}
	time.Sleep(150 * time.Millisecond)
	if _, err := g.Renew(context.Background(), l, time.Minute); !errors.Is(err, kvstore.ErrLeaseNotLive) {
		t.Fatalf("renew after expiry: %v", err)
	}
	l2, err := g.Reserve(context.Background(), cand, kvstore.Cost{Requests: 1}, time.Minute)
	if err != nil {
		t.Fatalf("reserve after the first expired: %v", err)
	}
	if s := g.Status(); s.OwnInFlight != 1 || s.LocalInFlight != 1 {
		t.Fatalf("status %+v", s)
	}
	_ = g.Release(context.Background(), l2)
}
