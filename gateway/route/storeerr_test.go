package route

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/kvgate/kvgate/gateway/openai"
	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// Which errors of a real redis-server store mean "unreachable": refusals and error replies do not; a stopped
// server, timeouts and closed connections do.
func TestStoreUnreachableClassification(t *testing.T) {
	rs := redistest.Start(t)
	ctx := context.Background()
	st, err := kvstore.OpenStore(ctx, kvstore.StoreConfig{Kind: "redis", Addrs: []string{rs.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cands := []kvstore.Candidate{{Endpoint: "e0", Limits: kvstore.Limits{MaxRequests: 1}}}
	_, refused := st.Reservations.Reserve(ctx, cands, kvstore.Cost{Requests: 1}, 0) // ttl 0: invalid argument
	if _, err := st.Reservations.Reserve(ctx, cands, kvstore.Cost{Requests: 1}, time.Minute); err != nil {
		t.Fatal(err)
	}
	_, full := st.Reservations.Reserve(ctx, cands, kvstore.Cost{Requests: 1}, time.Minute)
	st.Redis.Set(ctx, "plain", "v", 0)
	wrongType := st.Redis.LPush(ctx, "plain", "x").Err()
	for name, err := range map[string]error{"invalid argument": refused, "no capacity": full, "WRONGTYPE reply": wrongType,
		"cancelled": fmt.Errorf("op: %w", context.Canceled), "not found": kvstore.ErrNotFound} {
		if err == nil {
			t.Fatalf("%s: no error", name)
		}
		if storeUnreachable(err) {
			t.Errorf("%s (%v) classified unreachable", name, err)
		}
	}
	rs.Stop()
	down, cancel := context.WithTimeout(ctx, 300*time.Millisecond) // go-redis retries its dials meanwhile
	defer cancel()
	_, matchErr := st.Index.Match(down, "m", []kvstore.BlockKey{1})
	for name, err := range map[string]error{"ping": st.Ping(down), "match": matchErr,
		"deadline": fmt.Errorf("op: %w", context.DeadlineExceeded)} {
		if err == nil || !storeUnreachable(err) {
			t.Errorf("%s (%v) not classified unreachable", name, err)
		}
	}
}

// A reservation a reachable Redis refuses (here a lease TTL of 0, an invalid argument) answers 500 at once
// and leaves the store up; it once switched the gateway to store-down routing.
func TestReserveRefusalKeepsStoreUp(t *testing.T) {
	rs := redistest.Start(t)
	st, err := kvstore.OpenStore(context.Background(), kvstore.StoreConfig{Kind: "redis", Addrs: []string{rs.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r, m := newRouter(t, fakeEngines(t, 2), st.Index, st.Reservations, st, func(o *Options) { o.LeaseTTL = 0 })
	body := []byte(`{"model":"qwen3","messages":[{"role":"user","content":"hello"}]}`)
	req, _ := openai.ParseRequest(openai.Chat, body)
	p, err := r.Plan(context.Background(), m, "", req, body)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = r.Reserve(context.Background(), p, nil)
	if oe, ok := errors.AsType[*openai.Error](err); !ok || oe.Status != http.StatusInternalServerError || !errors.Is(err, kvstore.ErrInvalidArgument) {
		t.Fatalf("reserve: %v", err)
	}
	if d := time.Since(start); d >= m.QueueTimeout {
		t.Errorf("refusal waited %v (queue timeout %v)", d, m.QueueTimeout)
	}
	if s := r.StoreStatus(); s.Down || s.LoadOnlyRequests != 0 {
		t.Fatalf("store status %+v", s)
	}
}
