package kvstore_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// stallProxy is a TCP proxy to a Redis server whose forwarding can be stalled: while stalled, bytes read
// in either direction are held (connections stay open), so its clients' calls time out while every other
// client of the server is served. One gateway cut off from a Redis the others still reach.
type stallProxy struct {
	ln      net.Listener
	target  string
	mu      sync.Mutex
	stalled chan struct{} // non-nil while stalled; closed on resume
	conns   []net.Conn
}

func startStallProxy(t *testing.T, target string) *stallProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target}
	go p.accept()
	t.Cleanup(func() {
		p.resume()
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
	})
	return p
}

func (p *stallProxy) Addr() string { return p.ln.Addr().String() }

func (p *stallProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

func (p *stallProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate := p.stalled
			p.mu.Unlock()
			if gate != nil {
				<-gate
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_ = dst.Close()
			}
			return
		}
	}
}

func (p *stallProxy) stall() {
	p.mu.Lock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
	p.mu.Unlock()
}

func (p *stallProxy) resume() {
	p.mu.Lock()
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
	p.mu.Unlock()
}

// TestGuardedPartialOutageKeepsLimit (#12 follow-up, partial-outage cap hazard): two gateways on one real
// Redis, gateway A behind a proxy that stalls it while B still reaches Redis. A goes to store-down mode
// (its calls and its PING time out) while B keeps reserving on Redis's counters: the endpoint must never
// run more than its limit, counting A's ledger and B's leases together, even with store_down_limit_share 1
// (the worst case). On the old rules A took its share of the capacity its last read showed free, which B
// took too (5 running at a limit of 4 here; 7 at 6 was seen in TestMultiGatewayRedis).
func TestGuardedPartialOutageKeepsLimit(t *testing.T) {
	for _, l := range []struct {
		name   string
		layout int
	}{{"SingleTag", kvstore.ReservationLayoutFollow}, {"Sharded", kvstore.ReservationLayoutSharded}} {
		t.Run(l.name, func(t *testing.T) { partialOutageKeepsLimit(t, l.layout) })
	}
}

func partialOutageKeepsLimit(t *testing.T, layout int) {
	srv := redistest.Start(t)
	proxy := startStallProxy(t, srv.Addr)
	prefix := freshPrefix()
	const limit = 4
	o := kvstore.GuardConfig{DownLimitShare: 1, StrictOnTimeout: true, Timeout: 300 * time.Millisecond, ProbeInterval: 20 * time.Millisecond,
		RecoveryGrace: 200 * time.Millisecond, Endpoints: func() []kvstore.EndpointID { return []kvstore.EndpointID{"e0"} }}
	a, _ := redisGuardLayout(t, proxy.Addr(), false, prefix, layout, o)
	b, _ := redisGuardLayout(t, srv.Addr, false, prefix, layout, o)
	cand := []kvstore.Candidate{{Endpoint: "e0", Limits: kvstore.Limits{MaxRequests: limit}}}
	ctx := context.Background()
	cost := kvstore.Cost{Requests: 1}
	var held [2][]kvstore.Lease
	gs := [2]*kvstore.Guarded{a, b}
	take := func(g int) bool {
		l, err := gs[g].Reserve(ctx, cand, cost, 20*time.Second)
		if errors.Is(err, kvstore.ErrNoCapacity) {
			return false
		}
		if err != nil {
			t.Fatalf("g%d reserve: %v", g, err)
		}
		held[g] = append(held[g], l)
		return true
	}
	finish := func(g int) {
		l := held[g][0]
		held[g] = held[g][1:]
		if err := gs[g].Release(ctx, l); err != nil {
			t.Fatalf("g%d release: %v", g, err)
		}
	}
	peak := 0
	check := func(phase string) {
		n := len(held[0]) + len(held[1])
		peak = max(peak, n)
		if n > limit {
			t.Fatalf("%s: the fleet runs %d on e0 (A %d, B %d), limit %d", phase, n, len(held[0]), len(held[1]), limit)
		}
	}
	// A reads the fleet's counters (its store-down base) with A 2, B 1: one slot free.
	take(0)
	take(0)
	take(1)
	if _, err := a.InFlight(ctx, []kvstore.EndpointID{"e0"}); err != nil {
		t.Fatal(err)
	}
	proxy.stall()
	// A's next call times out and its PING too: store-down. B is unaffected.
	for i := 0; i < 3 && !a.Down(); i++ {
		take(0)
		check("A's first calls while stalled")
	}
	if !a.Down() {
		t.Fatal("A not marked down while cut off from Redis")
	}
	if b.Down() {
		t.Fatal("B marked down though it reaches Redis")
	}
	// Both sides now take what they can, and A's requests come and go.
	for round := range 4 {
		for take(0) {
			check("A fills while stalled")
		}
		for take(1) {
			check("B fills on Redis")
		}
		check("filled")
		if round%2 == 0 && len(held[0]) > 0 {
			finish(0) // a request of A's ends: its store lease still counts on Redis until its TTL
		} else if len(held[1]) > 0 {
			finish(1)
		}
	}
	t.Logf("peak running on e0 while A was cut off: %d (limit %d; A %d, B %d at the end)", peak, limit, len(held[0]), len(held[1]))
	proxy.resume()
	if !waitFor(5*time.Second, func() bool { return !a.Down() }) {
		t.Fatal("A never recovered after the stall ended")
	}
	for g := range gs {
		for len(held[g]) > 0 {
			finish(g)
		}
	}
}
