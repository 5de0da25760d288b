package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// TestIndexLayoutRollingUpgrade: a rolling upgrade from Redis index layout 1 to layout 2 on one real
// redis-server (kvstore/RATIONALE.md, "Rolling upgrade to layout 2"). Old gateways run `store.index_layout:
// 1` (the code path of the releases before layout 2); new ones run the default (0: follow the store's
// marker). During the window a prefix ingested through either is found by the other: a new gateway's
// ingester writes both layouts and its Match reads layout 1. The operator then sets the marker (here through
// redis-cli's SET, as the README says) once no old gateway is left, and the new gateways use layout 2 only:
// new prefixes are found again through every gateway, and layout 1 gets no new block keys.
//
// Speculative records last 100 ms here, so every match checked after that comes from the index.
func TestIndexLayoutRollingUpgrade(t *testing.T) {
	t.Parallel() // waits on its own redis-server, engines and gateways only; asserts no latency bound
	if testing.Short() {
		t.Skip("starts redis-server and several gateways")
	}
	rs := redistest.Start(t)
	c := rs.Client(t)
	engines := startSims(t, 2, nil)
	store := func(layout string) string {
		return fmt.Sprintf("store: {kind: redis, addrs: [%q]%s}\nspeculative_ttl: 100ms\n", rs.Addr, layout)
	}
	oldYAML := gwYAML(simEndpointsYAML(engines, 64), store(", index_layout: 1"))
	newYAML := gwYAML(simEndpointsYAML(engines, 64), store(""))
	sys := func(n int) string { return longSystemPrompt(20+n) + fmt.Sprintf(" Family %d.", n) }
	body := func(n int, q string) string {
		return fmt.Sprintf(`{"model":"qwen3","max_tokens":2,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, sys(n), q)
	}
	// routeAndWait routes prompt family n through g, waits until the engine's events are ingested and the
	// speculative records are gone, and returns the endpoint.
	routeAndWait := func(g *Gateway, n int) string {
		t.Helper()
		st, h, b := post(t, "http://"+g.Addr()+"/v1/chat/completions", body(n, "first"))
		if st != 200 {
			t.Fatalf("route %d: %d %s", n, st, b)
		}
		return h.Get("x-kvgate-endpoint")
	}
	// matched returns the GPU blocks g's index holds for family n on ep (the explain route).
	matched := func(g *Gateway, n int, ep string) int {
		t.Helper()
		var ex struct {
			Endpoints []struct {
				ID        string `json:"id"`
				GPUBlocks int    `json:"gpu_blocks"`
			} `json:"endpoints"`
		}
		st, _, b := post(t, "http://"+g.Addr()+"/admin/v1/route", body(n, "second"), "Authorization", "Bearer admintok")
		if st != 200 || json.Unmarshal(b, &ex) != nil {
			t.Fatalf("explain: %d %s", st, b)
		}
		for _, e := range ex.Endpoints {
			if e.ID == ep {
				return e.GPUBlocks
			}
		}
		return 0
	}
	found := func(g *Gateway, n int, ep, what string) {
		t.Helper()
		if !waitFor(10*time.Second, func() bool { return matched(g, n, ep) >= 20 }) {
			t.Fatalf("%s: family %d on %s: %d GPU blocks matched", what, n, ep, matched(g, n, ep))
		}
	}
	ingests := func(g *Gateway) bool { return len(g.IngestStats()) == len(engines) }
	// primed sends each engine a request directly until g, which ingests every endpoint, has applied
	// events of each (a new subscriber misses what is published before its subscription is in place).
	primed := func(g *Gateway) {
		t.Helper()
		for i := 0; ; i++ {
			for _, e := range engines {
				post(t, "http://"+e.HTTPAddr()+"/v1/completions", fmt.Sprintf(`{"model":"qwen3","max_tokens":1,"prompt":"prime %d: %s"}`, i, strings.Repeat("prime the event stream of this engine ", 8)))
			}
			ok := waitFor(300*time.Millisecond, func() bool {
				for _, s := range g.IngestStats() {
					if !s.HaveSeq || s.Resyncing && s.Batches == 0 {
						return false
					}
				}
				return len(g.IngestStats()) == len(engines)
			})
			if ok {
				return
			}
			if i == 50 {
				t.Fatalf("ingesters of %s never applied events: %+v", g.Addr(), g.IngestStats())
			}
		}
	}
	stop := func(g *Gateway) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.Close(ctx); err != nil {
			t.Logf("close: %v", err)
		}
	}

	// The window, step 1: a new gateway N1 ingests (it started first), an old one O1 beside it.
	t.Log("step 1")
	n1 := startGateway(t, newYAML)
	if !waitFor(10*time.Second, func() bool { return ingests(n1) }) {
		t.Fatal("n1 never ingested both endpoints")
	}
	o1 := startGateway(t, oldYAML)
	waitSubscribed(t, engines, n1, o1)
	ep := routeAndWait(o1, 1)
	time.Sleep(300 * time.Millisecond)
	found(o1, 1, ep, "routed through the old gateway, ingested by the new one, read by the old one")
	found(n1, 1, ep, "the same through the new gateway")

	// Step 2: N1 is replaced; the old gateway takes the ingestion over, a new gateway N2 joins.
	t.Log("step 2")
	stop(n1)
	if !waitFor(15*time.Second, func() bool { return ingests(o1) }) {
		t.Fatal("o1 never took the ingestion over")
	}
	n2 := startGateway(t, newYAML)
	primed(o1)
	ep = routeAndWait(n2, 2)
	time.Sleep(300 * time.Millisecond)
	found(n2, 2, ep, "routed through the new gateway, ingested by the old one, read by the new one")
	found(o1, 2, ep, "the same through the old gateway")

	// Step 3: the last old gateway goes; N2 ingests. Then the operator finishes the upgrade.
	t.Log("step 3")
	stop(o1)
	if !waitFor(15*time.Second, func() bool { return ingests(n2) }) {
		t.Fatal("n2 never took the ingestion over")
	}
	n3 := startGateway(t, newYAML)
	primed(n2)
	if ri, ok := n3.store.Index.(*kvstore.RedisIndex); !ok || ri.Layout(context.Background()) != 0 {
		t.Fatal("a new gateway before the marker is not in the upgrade window")
	}
	if err := c.Set(context.Background(), "kvg:v1:index-layout", "2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, g := range []*Gateway{n2, n3} { // every gateway reads the marker once a second
		ri, ok := g.store.Index.(*kvstore.RedisIndex)
		if !ok {
			t.Fatalf("store index %T", g.store.Index)
		}
		if !waitFor(5*time.Second, func() bool { return ri.Layout(context.Background()) == 2 }) {
			t.Fatalf("%s still on layout %d after the marker", g.Addr(), ri.Layout(context.Background()))
		}
	}
	v1Before := countKeys(t, c, "kvg:v1:{qwen3}:b:*")
	ep = routeAndWait(n3, 3)
	time.Sleep(300 * time.Millisecond)
	found(n2, 3, ep, "after the upgrade: routed through one new gateway, found by the other")
	found(n3, 3, ep, "after the upgrade, through the gateway it was routed through")
	if v1After := countKeys(t, c, "kvg:v1:{qwen3}:b:*"); v1After != v1Before {
		t.Fatalf("layout-1 block keys %d → %d after the upgrade was finished", v1Before, v1After)
	}
	if n := countKeys(t, c, "kvg:v2:{*:qwen3}:h:*"); n == 0 {
		t.Fatal("no layout-2 family hashes")
	}
}

func countKeys(t *testing.T, c *redis.Client, pattern string) int {
	t.Helper()
	n := 0
	iter := c.Scan(context.Background(), 0, pattern, 1000).Iterator()
	for iter.Next(context.Background()) {
		n++
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}
