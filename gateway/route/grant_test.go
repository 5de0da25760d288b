package route

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvgate/kvgate/gateway/openai"
	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// slowGrant is a real store's reservations whose Reserve, once armed, holds the store's grant before
// returning it: the reply on its way while the store fails.
type slowGrant struct {
	kvstore.Reservations
	armed   chan struct{} // closed by the test to arm
	granted chan struct{} // closed once the armed Reserve has its grant
	release chan struct{} // the armed Reserve returns once this is closed
}

func (s *slowGrant) Reserve(ctx context.Context, ranked []kvstore.Candidate, cost kvstore.Cost, ttl time.Duration) (kvstore.Lease, error) {
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
// this test's gateway held 3 with a cap of 2.
func TestGrantAfterOutageOnset(t *testing.T) {
	rs := redistest.Start(t)
	st, err := kvstore.OpenStore(context.Background(), kvstore.StoreConfig{Kind: "redis", Addrs: []string{rs.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	sg := &slowGrant{Reservations: st.Reservations, armed: make(chan struct{}), granted: make(chan struct{}), release: make(chan struct{})}
	eps := fakeEngines(t, 1)
	eps[0].Limits = kvstore.Limits{MaxRequests: 8, MaxTokens: 1 << 30}
	r, m := newRouter(t, eps, st.Index, sg, st, func(o *Options) { o.StoreDownLimitShare = 0.34 })
	take := func() (*Claim, error) {
		req, _ := openai.ParseRequest(openai.Chat, outageBody)
		p, err := r.Plan(context.Background(), m, "", req, outageBody)
		if err != nil {
			t.Fatal(err)
		}
		return r.Reserve(context.Background(), p, nil)
	}
	close(sg.armed)
	type result struct {
		c   *Claim
		err error
	}
	late := make(chan result, 1)
	go func() {
		c, err := take()
		late <- result{c, err}
	}()
	<-sg.granted // the store granted it; the answer is on its way
	r.storeFailed("reserve", errors.New("connection reset (test)"))
	var held []*Claim
	for range 2 { // floor(8 × 0.34): this gateway's store-down cap, as nothing was read of the others
		c, err := take()
		if err != nil {
			t.Fatalf("store-down reservation within the cap refused: %v", err)
		}
		held = append(held, c)
	}
	close(sg.release)
	res := <-late
	if res.c != nil {
		defer r.Release(res.c)
	}
	err = res.err
	own := r.led.ownCounts([]kvstore.EndpointID{"e0"})["e0"].Requests
	if own > 2 {
		t.Fatalf("gateway holds %d requests on e0 with the store down, store-down cap 2 (the late grant counted beside the cap)", own)
	}
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.Status != 429 {
		t.Fatalf("late grant over the cap: got %v, want a 429 after the queue timeout", err)
	}
	for _, c := range held {
		r.Release(c)
	}
}
