package kvstore

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore/redistest"
)

// slowGrant is a real store's reservations whose Reserve, once armed, holds the store's grant before
// returning it: the reply on its way while the store fails.
type slowGrant struct {
	Reservations
	armed   chan struct{} // closed by the test to arm
	granted chan struct{} // closed once the armed Reserve has its grant
	release chan struct{} // the armed Reserve returns once this is closed
}

func (s *slowGrant) Reserve(ctx context.Context, ranked []Candidate, cost Cost, ttl time.Duration) (Lease, error) {
	l, err := s.Reservations.Reserve(ctx, ranked, cost, ttl)
	select {
	case <-s.armed:
	default:
		return l, err
	}
	select {
	case <-s.granted:
		return l, err // only the first armed call is held
	default:
	}
	close(s.granted)
	<-s.release
	return l, err
}

// TestGrantAfterOutageOnset: a store reservation granted just before the store fails, whose answer arrives
// after this gateway's store-down reservations filled its cap, must not be counted beside them. Found by
// TestOutageOnsetCapsHold (gateway package, ~1 run in 3 on a loaded box): a gateway's ledger traced RES with
// onstore=true and own=3 while down, cap 2, and the fleet's ledgers summed to 9 on a limit of 8. Before the fix
// this test's gateway held 3 with a cap of 2. (Moved from gateway/internal/route with the ledger.)
func TestGrantAfterOutageOnset(t *testing.T) {
	rs := redistest.Start(t)
	st, err := OpenStore(context.Background(), StoreConfig{Kind: "redis", Addrs: []string{rs.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	sg := &slowGrant{Reservations: st.Reservations, armed: make(chan struct{}), granted: make(chan struct{}), release: make(chan struct{})}
	g := NewGuarded(GuardConfig{Reservations: sg, Index: st.Index, Remote: st.Epoch, DownLimitShare: 0.34,
		ProbeInterval: 20 * time.Millisecond, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(g.Close)
	cands := []Candidate{{Endpoint: "e0", Limits: Limits{MaxRequests: 8, MaxTokens: 1 << 30}}}
	take := func() (Lease, error) {
		return g.Reserve(context.Background(), cands, Cost{Requests: 1, Tokens: 20}, 10*time.Second)
	}
	close(sg.armed)
	type result struct {
		l   Lease
		err error
	}
	late := make(chan result, 1)
	go func() {
		l, err := take()
		late <- result{l, err}
	}()
	<-sg.granted // the store granted it; the answer is on its way
	g.storeFailed("reserve", errors.New("connection reset (test)"))
	var held []Lease
	for range 2 { // floor(8 × 0.34): this gateway's store-down cap, as nothing was read of the others
		l, err := take()
		if err != nil {
			t.Fatalf("store-down reservation within the cap refused: %v", err)
		}
		held = append(held, l)
	}
	close(sg.release)
	res := <-late
	if res.err == nil {
		defer g.Release(context.Background(), res.l)
	}
	own := g.led.ownCounts([]EndpointID{"e0"})["e0"].Requests
	if own > 2 {
		t.Fatalf("gateway holds %d requests on e0 with the store down, store-down cap 2 (the late grant counted beside the cap)", own)
	}
	if !errors.Is(res.err, ErrNoCapacity) {
		t.Fatalf("late grant over the cap: got %v, want ErrNoCapacity (the router then queues until its timeout)", res.err)
	}
	for _, l := range held {
		_ = g.Release(context.Background(), l)
	}
}
