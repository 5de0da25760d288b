package kvstore_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// commandCalls returns the calls per command ("time", "zrangebyscore", ...) in INFO commandstats.
func commandCalls(t *testing.T, c *redis.Client) map[string]int {
	t.Helper()
	s, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, l := range strings.Split(s, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				out[strings.TrimPrefix(name, "cmdstat_")], _ = strconv.Atoi(v)
			}
		}
	}
	return out
}

// waitServerPast waits until the server's clock is past exp (what expiry means for a Redis lease).
func waitServerPast(t *testing.T, c *redis.Client, exp time.Time) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		now, err := c.Time(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		if now.After(exp) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("server time %v never passed %v", now, exp)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRedisReservationScriptsCommands: a Reserve reads the clock once and reaps nothing while its
// candidate fits, and a Release runs neither TIME nor the reap (kvstore/RATIONALE.md, "What a reservation
// costs Redis"). The previous scripts ran TIME and ZRANGEBYSCORE in both: 40 of each for these 20 cycles.
func TestRedisReservationScriptsCommands(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	c := srv.Client(t)
	r, err := kvstore.NewRedisReservations(c, kvstore.RedisConfig{Prefix: freshPrefix()})
	if err != nil {
		t.Fatal(err)
	}
	cands := []kvstore.Candidate{{Endpoint: "a", Limits: kvstore.Limits{MaxRequests: 4}}}
	one := kvstore.Cost{Requests: 1, Tokens: 100}
	if l, err := r.Reserve(ctx, cands, one, time.Minute); err != nil { // loads the scripts
		t.Fatal(err)
	} else if err := r.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		l, err := r.Reserve(ctx, cands, one, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	calls := commandCalls(t, c)
	if calls["evalsha"] != 40 || calls["time"] != 20 || calls["zrangebyscore"] != 0 {
		t.Fatalf("20 reserve/release cycles: evalsha %d, time %d, zrangebyscore %d; want 40, 20, 0",
			calls["evalsha"], calls["time"], calls["zrangebyscore"])
	}
	if m, err := r.InFlight(ctx, []kvstore.EndpointID{"a"}); err != nil || len(m) != 0 {
		t.Fatalf("in flight after the cycles: %v, %v", m, err)
	}
}

// TestRedisReserveReapsWhenFull: an endpoint full only of expired leases grants a Reserve (the reap runs
// when the limit check fails, then the candidate is checked again), and the expired leases are gone.
// Nothing else reaps in between: no InFlight, no Renew.
func TestRedisReserveReapsWhenFull(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := freshPrefix()
	r, err := kvstore.NewRedisReservations(c, kvstore.RedisConfig{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	cands := []kvstore.Candidate{
		{Endpoint: "a", Limits: kvstore.Limits{MaxRequests: 2}},
		{Endpoint: "b", Limits: kvstore.Limits{MaxRequests: 2}},
	}
	one := kvstore.Cost{Requests: 1, Tokens: 10}
	var last time.Time
	for range 2 {
		l, err := r.Reserve(ctx, cands, one, 50*time.Millisecond)
		if err != nil || l.Endpoint != "a" {
			t.Fatalf("reserve: %+v, %v", l, err)
		}
		last = l.Expires
	}
	live, err := r.Reserve(ctx, cands, one, time.Minute) // a is full: b
	if err != nil || live.Endpoint != "b" {
		t.Fatalf("reserve with a full: %+v, %v", live, err)
	}
	waitServerPast(t, c, last)
	l, err := r.Reserve(ctx, cands, one, time.Minute)
	if err != nil || l.Endpoint != "a" {
		t.Fatalf("reserve with a full of expired leases: %+v, %v (want a)", l, err)
	}
	base := prefix + ":" + kvstore.LayoutVersion + ":{res}:"
	if n := c.ZCard(ctx, base+"leases").Val(); n != 2 {
		t.Fatalf("lease ZSET holds %d leases after the reap, want 2 (a's new one and b's)", n)
	}
	if v := c.HMGet(ctx, base+"inflight", "r:a", "t:a", "r:b").Val(); v[0] != "1" || v[1] != "10" || v[2] != "1" {
		t.Fatalf("counters r:a t:a r:b = %v, want 1 10 1", v)
	}
}

// prevScript is the previous release's reservation script name (testdata/reservations_prev: the reap
// prologue, then the call's own file).
func prevScript(t *testing.T, name string) *redis.Script {
	t.Helper()
	var src []byte
	for _, f := range []string{"res_reap", name} {
		b, err := os.ReadFile("testdata/reservations_prev/" + f + ".lua")
		if err != nil {
			t.Fatal(err)
		}
		src = append(src, b...)
	}
	return redis.NewScript(string(src))
}

// TestRedisReservationScriptsMixedFleet: the previous release's reservation scripts and this release's on
// the same keys of one redis-server (a rolling upgrade: no key or value changed, so none is versioned).
// Leases taken by either are released, renewed, counted and reaped by the other.
func TestRedisReservationScriptsMixedFleet(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := freshPrefix()
	r, err := kvstore.NewRedisReservations(c, kvstore.RedisConfig{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	base := prefix + ":" + kvstore.LayoutVersion + ":{res}:"
	keys := []string{base + "inflight", base + "leases", base + "ld", base + "seq"}
	oldReserve, oldRelease := prevScript(t, "res_reserve"), prevScript(t, "res_release")
	oldRenew, oldInFlight := prevScript(t, "res_renew"), prevScript(t, "res_inflight")
	cands := []kvstore.Candidate{{Endpoint: "ep-1", Limits: kvstore.Limits{MaxRequests: 2, MaxTokens: 300}}}
	cost := kvstore.Cost{Requests: 1, Tokens: 120}
	oldGrant := func(ttl time.Duration) (kvstore.Lease, error) {
		res, err := oldReserve.Run(ctx, c, keys, ttl.Milliseconds(), cost.Requests, cost.Tokens, 0, 0,
			"ep-1", cands[0].Limits.MaxRequests, cands[0].Limits.MaxTokens).Slice()
		if err != nil {
			return kvstore.Lease{}, err
		}
		if len(res) == 0 {
			return kvstore.Lease{}, kvstore.ErrNoCapacity
		}
		return kvstore.Lease{ID: res[0].(string), Endpoint: "ep-1", Cost: cost, Expires: time.UnixMilli(res[1].(int64))}, nil
	}
	oldCounts := func() []int64 {
		v, err := oldInFlight.Run(ctx, c, keys, "ep-1").Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	counts := func(want kvstore.Cost) {
		t.Helper()
		m, err := r.InFlight(ctx, []kvstore.EndpointID{"ep-1"})
		if err != nil {
			t.Fatal(err)
		}
		if o := oldCounts(); m["ep-1"] != want || o[0] != want.Requests || o[1] != want.Tokens {
			t.Fatalf("in flight: this release %+v, previous %v; want %+v", m["ep-1"], o, want)
		}
	}
	// An old grant, a new one: the endpoint is full for both (2 requests, 240 of 300 tokens).
	lo, err := oldGrant(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := r.Reserve(ctx, cands, cost, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	counts(kvstore.Cost{Requests: 2, Tokens: 240})
	if _, err := oldGrant(time.Minute); !errors.Is(err, kvstore.ErrNoCapacity) {
		t.Fatalf("old reserve on a full endpoint: %v", err)
	}
	if _, err := r.Reserve(ctx, cands, cost, time.Minute); !errors.Is(err, kvstore.ErrNoCapacity) {
		t.Fatalf("reserve on a full endpoint: %v", err)
	}
	// Each renews and releases the other's lease.
	if exp, err := oldRenew.Run(ctx, c, keys, ln.ID, 60000).Int64(); err != nil || exp <= 0 {
		t.Fatalf("old renew of a new lease: %d, %v", exp, err)
	}
	if _, err := r.Renew(ctx, lo, time.Minute); err != nil {
		t.Fatalf("renew of an old lease: %v", err)
	}
	if err := r.Release(ctx, lo); err != nil {
		t.Fatal(err)
	}
	if err := oldRelease.Run(ctx, c, keys, ln.ID).Err(); err != nil {
		t.Fatal(err)
	}
	counts(kvstore.Cost{})
	// Expired leases of either release are reaped by the other's reserve when they fill the endpoint.
	lo, err = oldGrant(50 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	ln, err = r.Reserve(ctx, cands, cost, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	waitServerPast(t, c, ln.Expires.Add(time.Millisecond))
	waitServerPast(t, c, lo.Expires.Add(time.Millisecond))
	l1, err := r.Reserve(ctx, cands, cost, time.Minute) // reaps both
	if err != nil {
		t.Fatal(err)
	}
	if n := c.ZCard(ctx, base+"leases").Val(); n != 1 {
		t.Fatalf("leases after this release's reap: %d, want 1", n)
	}
	ln, err = r.Reserve(ctx, cands, cost, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	waitServerPast(t, c, ln.Expires.Add(time.Millisecond))
	if _, err := oldGrant(time.Minute); err != nil { // the old script reaps the new expired lease
		t.Fatal(err)
	}
	if n := c.HLen(ctx, base+"ld").Val(); n != 2 {
		t.Fatalf("lease data after the old reap: %d, want 2", n)
	}
	counts(kvstore.Cost{Requests: 2, Tokens: 240})
	_ = l1
}
