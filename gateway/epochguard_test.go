package gateway

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/kvstore/redistest"
)

// A client guarded by the epoch marker keeps working while the marker holds, refuses every connection to a
// Redis that restarted empty (no command reaches it: go-redis would otherwise retry the command there
// silently), and connects again once the router stops requiring the old epoch. On a non-zero DB, which the
// guard selects itself before reading.
func TestEpochGuardRefusesRestartedRedis(t *testing.T) {
	rs := redistest.Start(t)
	ctx := context.Background()
	plain := redis.NewClient(&redis.Options{Addr: rs.Addr, DB: 2, MaxRetries: -1})
	defer plain.Close()
	ep, err := redisEpoch{plain}.Epoch(ctx)
	if err != nil || len(ep) != 24 {
		t.Fatalf("epoch %q %v", ep, err)
	}
	if again, _ := (redisEpoch{plain}).Epoch(ctx); again != ep {
		t.Fatalf("second read %q, first %q", again, ep)
	}
	var enforce atomic.Bool
	enforce.Store(true)
	guarded := redis.NewClient(&redis.Options{Addr: rs.Addr, DB: 2})
	defer guarded.Close()
	guarded.AddHook(epochGuard{db: 2, timeout: 1e9, expect: func() (string, bool) { return ep, enforce.Load() }})
	if err := guarded.Set(ctx, "k", "before", 0).Err(); err != nil {
		t.Fatalf("marker holds, connection refused: %v", err)
	}
	// The guard's own commands left the connection clean for go-redis (RESP3 handshake, then SET and GET).
	if v, err := guarded.Get(ctx, "k").Result(); err != nil || v != "before" {
		t.Fatalf("get %q %v", v, err)
	}

	unguarded := redis.NewClient(&redis.Options{Addr: rs.Addr, DB: 2})
	defer unguarded.Close()
	if err := unguarded.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	rs.Restart()
	// What the guard prevents: go-redis retries on a new connection and the caller never hears of the restart.
	if err := unguarded.Ping(ctx).Err(); err != nil {
		t.Fatalf("unguarded client after the restart: %v (expected a silent retry)", err)
	}
	err = guarded.Set(ctx, "k", "after", 0).Err()
	if err == nil || !(errors.Is(err, errEpochChanged) || strings.Contains(err.Error(), errEpochChanged.Error())) {
		t.Fatalf("set on a restarted Redis: %v, want the epoch refusal", err)
	}
	if err := plain.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("the refused SET reached the new server: %v", err)
	}
	// The router is down and recovering: nothing is required; the client works on the new server.
	enforce.Store(false)
	if err := guarded.Set(ctx, "k", "recovered", 0).Err(); err != nil {
		t.Fatalf("after recovery: %v", err)
	}
}

// With a password the guard authenticates itself; a marker of another epoch is refused.
func TestEpochGuardAuthAndForeignMarker(t *testing.T) {
	rs := redistest.Start(t)
	ctx := context.Background()
	admin := rs.Client(t)
	if err := admin.ConfigSet(ctx, "requirepass", "pw").Err(); err != nil {
		t.Fatal(err)
	}
	plain := redis.NewClient(&redis.Options{Addr: rs.Addr, Password: "pw", MaxRetries: -1})
	defer plain.Close()
	ep, err := redisEpoch{plain}.Epoch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var enforce atomic.Bool
	enforce.Store(true)
	guard := epochGuard{password: "pw", timeout: 1e9, expect: func() (string, bool) { return ep, enforce.Load() }}
	guarded := redis.NewClient(&redis.Options{Addr: rs.Addr, Password: "pw", MaxRetries: -1})
	defer guarded.Close()
	guarded.AddHook(guard)
	if err := guarded.Ping(ctx).Err(); err != nil {
		t.Fatalf("with AUTH: %v", err)
	}
	if err := plain.Set(ctx, storeEpochKey, "someone-else", 0).Err(); err != nil {
		t.Fatal(err)
	}
	other := redis.NewClient(&redis.Options{Addr: rs.Addr, Password: "pw", MaxRetries: -1})
	defer other.Close()
	other.AddHook(guard)
	if err := other.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "someone-else") {
		t.Fatalf("ping with another epoch's marker: %v", err)
	}
	// Without the password the guard's AUTH-less read is refused by the server: an error, not a pass.
	noauth := redis.NewClient(&redis.Options{Addr: rs.Addr, Password: "pw", MaxRetries: -1})
	defer noauth.Close()
	noauth.AddHook(epochGuard{timeout: 1e9, expect: guard.expect})
	if err := noauth.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("guard without the password: %v", err)
	}
}
