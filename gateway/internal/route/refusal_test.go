package route

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// A reservation a reachable Redis refuses (here a lease TTL of 0, an invalid argument) is ErrStoreRefused (the
// server's 500) at once and leaves the store up; it once switched the gateway to store-down routing.
func TestReserveRefusalKeepsStoreUp(t *testing.T) {
	rs := redistest.Start(t)
	st, err := kvstore.OpenStore(context.Background(), kvstore.StoreConfig{Kind: "redis", Addrs: []string{rs.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	g := guarded(t, st.Reservations, st.Index, st.Epoch, 0.5)
	r, m := newRouter(t, fakeEngines(t, 2), g, g, func(o *Options) { o.LeaseTTL = 0 })
	body := []byte(`{"model":"qwen3","messages":[{"role":"user","content":"hello"}]}`)
	req, _ := parseChat(body)
	p, err := r.Plan(context.Background(), m, "", req, body)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = r.Reserve(context.Background(), p, nil)
	if !errors.Is(err, ErrStoreRefused) || !errors.Is(err, kvstore.ErrInvalidArgument) {
		t.Fatalf("reserve: %v", err)
	}
	if d := time.Since(start); d >= m.QueueTimeout {
		t.Errorf("refusal waited %v (queue timeout %v)", d, m.QueueTimeout)
	}
	if s := g.Status(); s.Down || r.LoadOnlyRequests() != 0 {
		t.Fatalf("store status %+v", s)
	}
}
