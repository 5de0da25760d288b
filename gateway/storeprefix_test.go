package gateway

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// TestStorePrefixSeparatesFleets: two fleets on one redis-server with store.prefix fleet-a and fleet-b.
// Every key either writes starts with its prefix; a prompt routed (and ingested) in fleet A scores nothing
// in fleet B's index; an endpoint full in fleet A's reservations is free in B's; each fleet has its own
// epoch marker and policy state.
func TestStorePrefixSeparatesFleets(t *testing.T) {
	t.Parallel() // waits on its own redis-server, engine and gateways only; asserts no latency bound
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	rs := redistest.Start(t)
	engines := startSims(t, 1, nil)
	yaml := func(prefix string) string {
		return gwYAML(simEndpointsYAML(engines, 2), fmt.Sprintf("store: {kind: redis, addrs: [%q], prefix: %q}\n", rs.Addr, prefix))
	}
	a := startGateway(t, yaml("fleet-a"))
	b := startGateway(t, yaml("fleet-b"))
	body := chatBody(false, 1, "Only fleet A routes this prompt. "+strings.Repeat("alpha beta gamma ", 40))
	if st, _, out := post(t, "http://"+a.Addr()+"/v1/chat/completions", body); st != 200 {
		t.Fatalf("through fleet A: %d %s", st, out)
	}
	// Index: both fleets ingest the one engine's events (each has its own ingestion lease), so compare
	// entries only one fleet wrote.
	ctx := context.Background()
	keys := []kvstore.BlockKey{0xa1, 0xa2, 0xa3}
	if err := a.store.Index.Add(ctx, "qwen3", "only-a", kvstore.TierGPU, keys); err != nil {
		t.Fatal(err)
	}
	if m, err := a.store.Index.Match(ctx, "qwen3", keys); err != nil || len(m) != 1 {
		t.Fatalf("fleet A's own entries: %v %v", m, err)
	}
	if m, err := b.store.Index.Match(ctx, "qwen3", keys); err != nil || len(m) != 0 {
		t.Fatalf("fleet B sees fleet A's entries: %v %v", m, err)
	}
	// Reservations: fill e0 (limit 2) in fleet A; fleet B's are untouched.
	cand := []kvstore.Candidate{{Endpoint: "e0", Limits: kvstore.Limits{MaxRequests: 2}}}
	for range 2 {
		if _, err := a.store.Reservations.Reserve(ctx, cand, kvstore.Cost{Requests: 1}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.store.Reservations.Reserve(ctx, cand, kvstore.Cost{Requests: 1}, time.Minute); err == nil {
		t.Fatal("fleet A over its limit")
	}
	if _, err := b.store.Reservations.Reserve(ctx, cand, kvstore.Cost{Requests: 1}, time.Minute); err != nil {
		t.Fatalf("fleet B refused on an endpoint only fleet A filled: %v", err)
	}
	// Epoch markers and fleet state: one of each per prefix; every key under one of the two prefixes.
	ea, err := a.store.Epoch.Epoch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	eb, err := b.store.Epoch.Epoch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ea == eb {
		t.Fatalf("both fleets have epoch %q", ea)
	}
	c := rs.Client(t)
	all, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var na, nb int
	for _, k := range all {
		switch {
		case strings.HasPrefix(k, "fleet-a:"):
			na++
		case strings.HasPrefix(k, "fleet-b:"):
			nb++
		default:
			t.Errorf("key %q under neither prefix", k)
		}
	}
	for _, p := range []string{"fleet-a", "fleet-b"} {
		for _, want := range []string{":{res}:epoch", ":{res}:leases", ":{blobs}:gateways"} {
			if n, _ := c.Exists(ctx, p+":"+kvstore.LayoutVersion+want).Result(); n != 1 {
				t.Errorf("no %s%s", p, want)
			}
		}
	}
	t.Logf("%d keys under fleet-a, %d under fleet-b", na, nb)
	if _, err := config.Parse([]byte(yaml("bad{tag}"))); err == nil || !strings.Contains(err.Error(), "store.prefix") {
		t.Fatalf("a prefix with a hash-tag brace: %v", err)
	}
}
