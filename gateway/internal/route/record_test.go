package route

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore"
)

// recordingIndex passes everything to a MemoryIndex and reports the keys of each Record call.
type recordingIndex struct {
	*kvstore.MemoryIndex
	got chan []kvstore.BlockKey
}

func (r recordingIndex) Record(ctx context.Context, model string, ep kvstore.EndpointID, keys []kvstore.BlockKey, ttl time.Duration) error {
	err := r.MemoryIndex.Record(ctx, model, ep, keys, ttl) // written before the test hears of it
	r.got <- slices.Clone(keys)
	return err
}

// Record writes only the keys past the matched GPU prefix for an endpoint whose events feed the index, and
// every key for one without events (its speculative entries are all the index knows of it).
func TestRecordSkipsMatchedPrefixWithEvents(t *testing.T) {
	for _, events := range []bool{true, false} {
		eps := fakeEngines(t, 1)
		eps[0].Events = events
		idx := recordingIndex{kvstore.NewMemoryIndex(kvstore.MemoryConfig{}), make(chan []kvstore.BlockKey, 1)}
		r, m := newRouter(t, eps, idx, kvstore.NewMemoryReservations(nil))
		body := []byte(`{"model":"qwen3","messages":[{"role":"user","content":"` + strings.Repeat("refund rules for damaged items ", 40) + `"}]}`)
		req, err := parseChat(body)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		p, err := r.Plan(ctx, m, "", req, body)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Keys) < 4 {
			t.Fatalf("only %d block keys", len(p.Keys))
		}
		half := len(p.Keys) / 2
		if err := idx.Add(ctx, "qwen3", "e0", kvstore.TierGPU, p.Keys[:half]); err != nil {
			t.Fatal(err)
		}
		if p, err = r.Plan(ctx, m, "", req, body); err != nil {
			t.Fatal(err)
		}
		c, err := r.Reserve(ctx, p, nil)
		if err != nil {
			t.Fatal(err)
		}
		if p.Candidates[c.Index].GPUBlocks != half {
			t.Fatalf("matched %d blocks, want %d", p.Candidates[c.Index].GPUBlocks, half)
		}
		r.Record(ctx, p, c)
		r.Release(c)
		want := p.Keys
		if events {
			want = p.Keys[half:]
		}
		select {
		case got := <-idx.got:
			if !slices.Equal(got, want) {
				t.Fatalf("events=%v: recorded %d keys, want the %d from block %d", events, len(got), len(want), len(p.Keys)-len(want))
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("events=%v: nothing recorded", events)
		}
	}
}

// A routed hit keeps an unconfirmed prefix counted (#11 item 1): vLLM announces nothing on a cache hit, so a
// prefix whose entries were demoted after an ingestion takeover would otherwise age out although every
// request keeps it warm on the engine. Without HitTTL the prefix is gone after the unconfirmed TTL.
func TestRoutedHitKeepsUnconfirmedPrefix(t *testing.T) {
	for _, hitTTL := range []time.Duration{time.Minute, 0} {
		var mu sync.Mutex
		now := time.Unix(1_800_000_000, 0)
		clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
		advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
		eps := fakeEngines(t, 1)
		eps[0].Events = true
		mi := kvstore.NewMemoryIndex(kvstore.MemoryConfig{Now: clock})
		idx := recordingIndex{mi, make(chan []kvstore.BlockKey, 4)}
		r, m := newRouter(t, eps, idx, kvstore.NewMemoryReservations(nil), func(o *Options) { o.Now = clock; o.HitTTL = hitTTL })
		body := []byte(`{"model":"qwen3","messages":[{"role":"user","content":"` + strings.Repeat("refund rules for damaged items ", 40) + `"}]}`)
		req, err := parseChat(body)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		p, err := r.Plan(ctx, m, "", req, body)
		if err != nil {
			t.Fatal(err)
		}
		n := len(p.Keys)
		if err := mi.Add(ctx, "qwen3", "e0", kvstore.TierGPU, p.Keys); err != nil {
			t.Fatal(err)
		}
		if err := mi.Demote(ctx, "qwen3", "e0", time.Minute); err != nil {
			t.Fatal(err)
		}
		route := func() int {
			t.Helper()
			p, err := r.Plan(ctx, m, "", req, body)
			if err != nil {
				t.Fatal(err)
			}
			c, err := r.Reserve(ctx, p, nil)
			if err != nil {
				t.Fatal(err)
			}
			r.Record(ctx, p, c)
			r.Release(c)
			if hitTTL > 0 {
				select {
				case <-idx.got:
				case <-time.After(3 * time.Second):
					t.Fatal("the routed hit was not recorded")
				}
			}
			return p.Candidates[c.Index].GPUBlocks
		}
		advance(50 * time.Second)
		if g := route(); g != n {
			t.Fatalf("hitTTL %v: matched %d of %d blocks before the TTL", hitTTL, g, n)
		}
		advance(50 * time.Second) // 100 s after the demotion
		ms, err := mi.Match(ctx, "qwen3", p.Keys)
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		if len(ms) == 1 {
			got = ms[0].GPUBlocks
		}
		want := n
		if hitTTL == 0 {
			want = 0
		}
		if got != want {
			t.Fatalf("hitTTL %v: %d blocks 100 s after the demotion, want %d", hitTTL, got, want)
		}
	}
}
