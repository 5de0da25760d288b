package kvstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/conformance"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

func TestMemoryReservationsConformance(t *testing.T) {
	conformance.RunReservations(t, func(t *testing.T) kvstore.Reservations {
		return kvstore.NewMemoryReservations(nil)
	})
}

func TestRedisReservationsConformance(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	conformance.RunReservations(t, func(t *testing.T) kvstore.Reservations {
		r, err := kvstore.NewRedisReservations(c, kvstore.RedisConfig{Prefix: freshPrefix()})
		if err != nil {
			t.Fatal(err)
		}
		return r
	})
}

// TestRedisReservationsThreeClients races 50 goroutines over three separate Redis clients (three
// gateways) for 10 slots.
func TestRedisReservationsThreeClients(t *testing.T) {
	srv := redistest.Start(t)
	prefix := freshPrefix()
	var handles []kvstore.Reservations
	for range 3 {
		r, err := kvstore.NewRedisReservations(srv.Client(t), kvstore.RedisConfig{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		handles = append(handles, r)
	}
	conformance.HammerReservations(t, handles)
}

// TestMemoryReservationsFakeClock checks expiry on the injected clock: a lease counts until its deadline,
// not at it, and a renewal moves the deadline.
func TestMemoryReservationsFakeClock(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(5000, 0)
	r := kvstore.NewMemoryReservations(func() time.Time { return now })
	ranked := []kvstore.Candidate{{Endpoint: "a", Limits: kvstore.Limits{MaxRequests: 1}}}
	one := kvstore.Cost{Requests: 1, Tokens: 7}
	l, err := r.Reserve(ctx, ranked, one, 10*time.Second)
	if err != nil || !l.Expires.Equal(now.Add(10*time.Second)) {
		t.Fatalf("reserve: %+v %v", l, err)
	}
	now = now.Add(9 * time.Second)
	if _, err := r.Reserve(ctx, ranked, one, time.Second); !errors.Is(err, kvstore.ErrNoCapacity) {
		t.Fatalf("before expiry: %v", err)
	}
	l, err = r.Renew(ctx, l, 10*time.Second) // now deadline at +19 s
	if err != nil || !l.Expires.Equal(now.Add(10*time.Second)) {
		t.Fatalf("renew: %+v %v", l, err)
	}
	now = now.Add(9 * time.Second)
	if m, _ := r.InFlight(ctx, []kvstore.EndpointID{"a"}); m["a"] != one {
		t.Fatalf("renewed lease not counted: %v", m)
	}
	now = now.Add(time.Second) // exactly at the deadline: expired
	if m, _ := r.InFlight(ctx, []kvstore.EndpointID{"a"}); len(m) != 0 {
		t.Fatalf("at deadline: %v", m)
	}
	if _, err := r.Renew(ctx, l, time.Second); !errors.Is(err, kvstore.ErrLeaseNotLive) {
		t.Fatalf("renew after expiry: %v", err)
	}
	if _, err := r.Reserve(ctx, ranked, one, time.Second); err != nil {
		t.Fatalf("after expiry: %v", err)
	}
}

func TestShardedRedisReservationsConformance(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	conformance.RunReservations(t, func(t *testing.T) kvstore.Reservations {
		r, err := kvstore.NewShardedRedisReservations(c, kvstore.RedisConfig{Prefix: freshPrefix()})
		if err != nil {
			t.Fatal(err)
		}
		return r
	})
}

// TestShardedRedisReservationsThreeClients is the hammer on the sharded layout (three Redis clients).
func TestShardedRedisReservationsThreeClients(t *testing.T) {
	srv := redistest.Start(t)
	prefix := freshPrefix()
	var handles []kvstore.Reservations
	for range 3 {
		r, err := kvstore.NewShardedRedisReservations(srv.Client(t), kvstore.RedisConfig{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		handles = append(handles, r)
	}
	conformance.HammerReservations(t, handles)
}
