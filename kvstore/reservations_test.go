package kvstore_test

import (
	"testing"

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

func TestRedisClusterReservations(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	conformance.RunReservations(t, func(t *testing.T) kvstore.Reservations {
		r, err := kvstore.NewRedisReservations(cl.Client(t), kvstore.RedisConfig{Prefix: freshPrefix()})
		if err != nil {
			t.Fatal(err)
		}
		return r
	})
}
