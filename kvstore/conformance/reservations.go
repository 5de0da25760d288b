package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore"
)

// ReservationsFactory returns new, empty reservations for one subtest. Calling it again within a subtest
// must return another handle on the same state when shared is true (a second gateway), which the hammer
// test uses when the backend supports it.
type ReservationsFactory func(t *testing.T) kvstore.Reservations

func cand(ep string, maxReq, maxTok int64) kvstore.Candidate {
	return kvstore.Candidate{Endpoint: kvstore.EndpointID(ep), Limits: kvstore.Limits{MaxRequests: maxReq, MaxTokens: maxTok}}
}

func inflight(t *testing.T, r kvstore.Reservations, ep string) kvstore.Cost {
	t.Helper()
	m, err := r.InFlight(context.Background(), []kvstore.EndpointID{kvstore.EndpointID(ep)})
	if err != nil {
		t.Fatal(err)
	}
	c := m[kvstore.EndpointID(ep)]
	if c.Requests < 0 || c.Tokens < 0 {
		t.Fatalf("negative in-flight %+v on %s", c, ep)
	}
	return c
}

// RunReservations runs the reservations conformance suite against reservations made by newRes. Expiry
// tests use real time (TTLs of 100-300 ms), since Redis leases expire on the server's clock.
func RunReservations(t *testing.T, newRes ReservationsFactory) {
	ctx := context.Background()
	one := kvstore.Cost{Requests: 1, Tokens: 100}

	t.Run("FirstUnderLimits", func(t *testing.T) {
		r := newRes(t)
		ranked := []kvstore.Candidate{cand("a", 2, 0), cand("b", 0, 250), cand("c", 1, 1000)}
		var got []kvstore.EndpointID
		for range 6 {
			l, err := r.Reserve(ctx, ranked, one, time.Minute)
			if errors.Is(err, kvstore.ErrNoCapacity) {
				got = append(got, "-")
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if l.ID == "" || l.Cost != one || time.Until(l.Expires) < 50*time.Second || time.Until(l.Expires) > 70*time.Second {
				t.Fatalf("lease %+v", l)
			}
			got = append(got, l.Endpoint)
		}
		want := []kvstore.EndpointID{"a", "a", "b", "b", "c", "-"}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("order %v, want %v", got, want)
		}
		if c := inflight(t, r, "a"); c != (kvstore.Cost{Requests: 2, Tokens: 200}) {
			t.Fatalf("a in flight %+v", c)
		}
		if c := inflight(t, r, "b"); c != (kvstore.Cost{Requests: 2, Tokens: 200}) {
			t.Fatalf("b in flight %+v", c)
		}
		// A cost larger than a token limit never fits; zero limits are unlimited.
		if _, err := r.Reserve(ctx, []kvstore.Candidate{cand("d", 0, 50)}, one, time.Minute); !errors.Is(err, kvstore.ErrNoCapacity) {
			t.Fatalf("oversized cost: %v", err)
		}
		for range 20 {
			if _, err := r.Reserve(ctx, []kvstore.Candidate{cand("e", 0, 0)}, one, time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		if c := inflight(t, r, "e"); c.Requests != 20 || c.Tokens != 2000 {
			t.Fatalf("e in flight %+v", c)
		}
		m, err := r.InFlight(ctx, []kvstore.EndpointID{"a", "zz"})
		if err != nil || len(m) != 1 {
			t.Fatalf("in flight of a and unknown: %v %v", m, err)
		}
	})
	t.Run("ReleaseIsIdempotent", func(t *testing.T) {
		r := newRes(t)
		l1, err := r.Reserve(ctx, []kvstore.Candidate{cand("a", 1, 0)}, one, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Reserve(ctx, []kvstore.Candidate{cand("a", 1, 0)}, one, time.Minute); !errors.Is(err, kvstore.ErrNoCapacity) {
			t.Fatalf("second reserve: %v", err)
		}
		for range 3 {
			if err := r.Release(ctx, l1); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.Release(ctx, kvstore.Lease{ID: "no-such-lease", Endpoint: "a", Cost: one}); err != nil {
			t.Fatal(err)
		}
		if c := inflight(t, r, "a"); c != (kvstore.Cost{}) {
			t.Fatalf("after release: %+v", c)
		}
		l2, err := r.Reserve(ctx, []kvstore.Candidate{cand("a", 1, 0)}, one, time.Minute)
		if err != nil || l2.ID == l1.ID {
			t.Fatalf("reserve after release: %+v %v", l2, err)
		}
		if _, err := r.Renew(ctx, l1, time.Minute); !errors.Is(err, kvstore.ErrLeaseNotLive) {
			t.Fatalf("renew released lease: %v", err)
		}
	})
	t.Run("ExpiryAndRenew", func(t *testing.T) {
		r := newRes(t)
		short, err := r.Reserve(ctx, []kvstore.Candidate{cand("a", 2, 0)}, one, 150*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		renewed, err := r.Reserve(ctx, []kvstore.Candidate{cand("a", 2, 0)}, one, 150*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		nl, err := r.Renew(ctx, renewed, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if !nl.Expires.After(renewed.Expires) || nl.ID != renewed.ID || nl.Endpoint != "a" {
			t.Fatalf("renewed %+v from %+v", nl, renewed)
		}
		time.Sleep(300 * time.Millisecond)
		// The short lease stopped counting; the renewed one still counts.
		if c := inflight(t, r, "a"); c != one {
			t.Fatalf("after expiry: %+v, want %+v", c, one)
		}
		if _, err := r.Renew(ctx, short, time.Minute); !errors.Is(err, kvstore.ErrLeaseNotLive) {
			t.Fatalf("renew expired lease: %v", err)
		}
		// Releasing an expired lease is not an error and does not go negative.
		if err := r.Release(ctx, short); err != nil {
			t.Fatal(err)
		}
		if c := inflight(t, r, "a"); c != one {
			t.Fatalf("after late release: %+v", c)
		}
		if err := r.Release(ctx, nl); err != nil {
			t.Fatal(err)
		}
		if c := inflight(t, r, "a"); c != (kvstore.Cost{}) {
			t.Fatalf("after release: %+v", c)
		}
	})
	t.Run("InvalidInput", func(t *testing.T) {
		r := newRes(t)
		if _, err := r.Reserve(ctx, nil, one, time.Minute); !errors.Is(err, kvstore.ErrNoCapacity) {
			t.Fatalf("no candidates: %v", err)
		}
		if _, err := r.Reserve(ctx, []kvstore.Candidate{cand("a", 1, 0)}, kvstore.Cost{Requests: -1}, time.Minute); !errors.Is(err, kvstore.ErrInvalidArgument) {
			t.Fatalf("negative cost: %v", err)
		}
		if _, err := r.Reserve(ctx, []kvstore.Candidate{cand("a", 1, 0)}, one, 0); !errors.Is(err, kvstore.ErrInvalidArgument) {
			t.Fatalf("zero ttl: %v", err)
		}
		if _, err := r.Renew(ctx, kvstore.Lease{ID: "x"}, 0); !errors.Is(err, kvstore.ErrInvalidArgument) {
			t.Fatalf("zero renew ttl: %v", err)
		}
		if err := r.Release(ctx, kvstore.Lease{}); err != nil {
			t.Fatalf("release of zero lease: %v", err)
		}
	})
	t.Run("Hammer", func(t *testing.T) {
		r := newRes(t)
		HammerReservations(t, []kvstore.Reservations{r})
	})
}

// HammerReservations races 50 goroutines (spread over the given handles on one shared state, e.g. three
// Redis clients) for 10 slots on two endpoints; exactly 10 must win. It then checks that after release,
// and separately after expiry, all 10 can be taken again, and that counters never go negative.
func HammerReservations(t *testing.T, handles []kvstore.Reservations) {
	ctx := context.Background()
	ranked := []kvstore.Candidate{cand("h-a", 6, 0), cand("h-b", 4, 0)}
	cost := kvstore.Cost{Requests: 1, Tokens: 10}
	race := func(ttl time.Duration) []kvstore.Lease {
		t.Helper()
		var mu sync.Mutex
		var won []kvstore.Lease
		var failed atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range 50 {
			wg.Go(func() {
				<-start
				l, err := handles[g%len(handles)].Reserve(ctx, ranked, cost, ttl)
				switch {
				case err == nil:
					mu.Lock()
					won = append(won, l)
					mu.Unlock()
				case errors.Is(err, kvstore.ErrNoCapacity):
					failed.Add(1)
				default:
					t.Error(err)
				}
			})
		}
		close(start)
		wg.Wait()
		if len(won) != 10 || failed.Load() != 40 {
			t.Fatalf("%d won, %d refused; want 10 and 40", len(won), failed.Load())
		}
		per := map[kvstore.EndpointID]int{}
		ids := map[string]bool{}
		for _, l := range won {
			per[l.Endpoint]++
			if ids[l.ID] {
				t.Fatalf("duplicate lease ID %s", l.ID)
			}
			ids[l.ID] = true
		}
		if per["h-a"] != 6 || per["h-b"] != 4 {
			t.Fatalf("per endpoint %v, want h-a 6 h-b 4", per)
		}
		m, err := handles[0].InFlight(ctx, []kvstore.EndpointID{"h-a", "h-b"})
		if err != nil {
			t.Fatal(err)
		}
		if m["h-a"] != (kvstore.Cost{Requests: 6, Tokens: 60}) || m["h-b"] != (kvstore.Cost{Requests: 4, Tokens: 40}) {
			t.Fatalf("in flight %v", m)
		}
		return won
	}
	won := race(time.Minute)
	// Release everything concurrently, twice each.
	var wg sync.WaitGroup
	for i, l := range won {
		for k := range 2 {
			wg.Go(func() {
				if err := handles[(i+k)%len(handles)].Release(ctx, l); err != nil {
					t.Error(err)
				}
			})
		}
	}
	wg.Wait()
	for _, ep := range []string{"h-a", "h-b"} {
		if c := inflight(t, handles[0], ep); c != (kvstore.Cost{}) {
			t.Fatalf("%s after release: %+v", ep, c)
		}
	}
	won = race(200 * time.Millisecond)
	time.Sleep(350 * time.Millisecond)
	// All expired: the slots are free again, and late releases leave counters at zero.
	for _, ep := range []string{"h-a", "h-b"} {
		if c := inflight(t, handles[0], ep); c != (kvstore.Cost{}) {
			t.Fatalf("%s after expiry: %+v", ep, c)
		}
	}
	for _, l := range won {
		if err := handles[0].Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	race(time.Minute)
}
