package kvstore_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// A store whose epoch check is on keeps working while the marker holds, refuses every connection to a
// Redis that restarted empty (no command reaches it: go-redis would otherwise retry the command there
// silently), and connects again once nothing is required (the guard is recovering). On a non-zero DB: the
// check runs after go-redis's own SELECT. (Moved from the gateway package with the check.)
func TestRedisEpochCheckRefusesRestartedRedis(t *testing.T) {
	rs := redistest.Start(t)
	ctx := context.Background()
	st, err := kvstore.OpenStore(ctx, kvstore.StoreConfig{Kind: "redis", Addrs: []string{rs.Addr}, DB: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ep, err := st.Epoch.Epoch(ctx)
	if err != nil || len(ep) != 24 {
		t.Fatalf("epoch %q %v", ep, err)
	}
	if again, _ := st.Epoch.Epoch(ctx); again != ep {
		t.Fatalf("second read %q, first %q", again, ep)
	}
	plain := redis.NewClient(&redis.Options{Addr: rs.Addr, DB: 2, MaxRetries: -1})
	defer plain.Close()
	if v, err := plain.Get(ctx, st.Epoch.Key()).Result(); err != nil || v != ep {
		t.Fatalf("marker on DB 2: %q %v", v, err)
	}
	var enforce atomic.Bool
	enforce.Store(true)
	st.Epoch.Expect(func() (string, bool) { return ep, enforce.Load() })
	if err := st.Redis.Set(ctx, "k", "before", 0).Err(); err != nil {
		t.Fatalf("marker holds, connection refused: %v", err)
	}
	if v, err := st.Redis.Get(ctx, "k").Result(); err != nil || v != "before" {
		t.Fatalf("get %q %v", v, err)
	}
	unchecked := redis.NewClient(&redis.Options{Addr: rs.Addr, DB: 2})
	defer unchecked.Close()
	if err := unchecked.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	rs.Restart()
	// What the check prevents: go-redis retries on a new connection and the caller never hears of the restart.
	if err := unchecked.Ping(ctx).Err(); err != nil {
		t.Fatalf("unchecked client after the restart: %v (expected a silent retry)", err)
	}
	err = st.Redis.Set(ctx, "k", "after", 0).Err()
	if !errors.Is(err, kvstore.ErrEpochChanged) || !errors.Is(err, kvstore.ErrUnavailable) {
		t.Fatalf("set on a restarted Redis: %v, want the epoch refusal as ErrUnavailable", err)
	}
	if err := plain.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("the refused SET reached the new server: %v", err)
	}
	// The guard is down and recovering: nothing is required; the client works on the new server.
	enforce.Store(false)
	if err := st.Redis.Set(ctx, "k", "recovered", 0).Err(); err != nil {
		t.Fatalf("after recovery: %v", err)
	}
}

// With a password the check runs after go-redis's AUTH; a marker of another epoch is refused.
func TestRedisEpochCheckAuthAndForeignMarker(t *testing.T) {
	rs := redistest.Start(t)
	ctx := context.Background()
	if err := rs.Client(t).ConfigSet(ctx, "requirepass", "pw").Err(); err != nil {
		t.Fatal(err)
	}
	open := func() *kvstore.Store {
		st, err := kvstore.OpenStore(ctx, kvstore.StoreConfig{Kind: "redis", Addrs: []string{rs.Addr}, Password: "pw", Prefix: "p1"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	st := open()
	ep, err := st.Epoch.Epoch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st.Epoch.Expect(func() (string, bool) { return ep, true })
	if err := st.Ping(ctx); err != nil {
		t.Fatalf("with AUTH: %v", err)
	}
	plain := redis.NewClient(&redis.Options{Addr: rs.Addr, Password: "pw"})
	defer plain.Close()
	if err := plain.Set(ctx, st.Epoch.Key(), "someone-else", 0).Err(); err != nil {
		t.Fatal(err)
	}
	other := open()
	other.Epoch.Expect(func() (string, bool) { return ep, true })
	// OpenStore's own ping left one connection in the pool, made before the check was on: hold it, so the
	// next command needs a new connection.
	hold := other.Redis.(*redis.Client).Conn()
	defer hold.Close()
	if err := hold.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := other.Ping(ctx); err == nil || !strings.Contains(err.Error(), "someone-else") || !errors.Is(err, kvstore.ErrUnavailable) {
		t.Fatalf("ping with another epoch's marker: %v", err)
	}
}
