package gateway

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// TestFencedGatewayStopsIngesting (#12 item 5), two gateways on one real Redis and one simulated engine:
// another holder's newer fencing token is recorded for the endpoint (as when a gateway takes the
// ingestion lease over while the ingesting one is paused), so the ingesting gateway's next index write is
// refused. That gateway must stop ingesting the endpoint (not only count the error), the other gateway
// takes the lease over (or the first wins it again once it has expired, with a newer token), and a
// prompt sent through a gateway afterwards is in the index through the new holder's writes. Without the fence the stale gateway kept writing.
func TestFencedGatewayStopsIngesting(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	rs := redistest.Start(t)
	engines := startSims(t, 1, nil)
	yaml := gwYAML(simEndpointsYAML(engines, 64), fmt.Sprintf("store: {kind: redis, addrs: [%q]}\nspeculative_ttl: 100ms\n", rs.Addr))
	gws := []*Gateway{startGateway(t, yaml), startGateway(t, yaml)}
	waitSubscribed(t, engines, gws...)
	stale, _ := ingesterOf(gws, "e0")
	if stale == nil {
		t.Fatal("nobody ingests e0")
	}
	other := gws[0]
	if other == stale {
		other = gws[1]
	}
	c := rs.Client(t)
	ctx := context.Background()
	tok, err := c.HGet(ctx, "kvg:v1:{lease:ingest:qwen3/e0}", "token").Int64()
	if err != nil {
		t.Fatal(err)
	}
	ri, err := kvstore.NewRedisIndex(c, kvstore.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ri.RaiseFence(ctx, "qwen3", kvstore.Fence{Scope: "e0", Token: tok + 1}); err != nil {
		t.Fatal(err)
	}
	sys := longSystemPrompt(20)
	body := func(q string) string {
		return fmt.Sprintf(`{"model":"qwen3","max_tokens":1,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, sys, q)
	}
	if st, _, b := post(t, "http://"+other.Addr()+"/v1/chat/completions", body("first")); st != 200 {
		t.Fatalf("%d %s", st, b)
	}
	if !waitFor(3*IngestLeaseTick, func() bool { g, _ := ingesterOf([]*Gateway{stale}, "e0"); return g == nil }) {
		t.Fatalf("the fenced-off gateway still ingests e0: %+v", stale.IngestStats())
	}
	// A new ingester starts under a newer token: usually on the other gateway; the fenced-off one may win
	// the lease again once it has expired (then with a new token, above the fence).
	var holder *Gateway
	if !waitFor(IngestLeaseTTL+5*IngestLeaseTick, func() bool { holder, _ = ingesterOf(gws, "e0"); return holder != nil }) {
		t.Fatal("no takeover")
	}
	reader := stale
	if holder == stale {
		reader = other
	}
	// Events reach the new ingester once its subscription has arrived (ZMQ's slow joiner): send until the
	// prompt is in the index, read through the fenced-off gateway.
	n := 0
	if !waitFor(10*time.Second, func() bool {
		n++
		q := fmt.Sprintf("after the takeover, request %d: a new question long enough to fill several whole blocks of sixteen tokens each, so the engine announces them", n)
		if st, _, b := post(t, "http://"+reader.Addr()+"/v1/chat/completions", body(q)); st != 200 {
			t.Fatalf("%d %s", st, b)
		}
		time.Sleep(200 * time.Millisecond) // the speculative entry (100 ms) is gone; only confirmed ones count
		g, total := promptScore(t, reader, body(q), "e0")
		return g == total
	}) {
		t.Fatalf("the new holder's writes never reached the index: %+v", holder.IngestStats())
	}
	for _, s := range holder.IngestStats() {
		if s.Fenced {
			t.Fatalf("the new holder was fenced off: %+v", s)
		}
	}
}
