package kvstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
	"github.com/kvgate/kvgate/kvstore/testenv"
)

// TestRedisSharedRecordsAcrossGateways: two gateways' indexes on one real Redis. A speculative Record
// through A (kept out of the block keys, published) is found through B; a ClearEndpoint through A removes
// it at B; it expires on its TTL; a long Record still goes into Redis. A gateway of an earlier release
// (every Record a script: SharedRecordMaxTTL < 0) and a new one on the same Redis: the new one finds the
// old one's records, the old one does not see the new one's shared records (only their engines' events).
func TestRedisSharedRecordsAcrossGateways(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	pfx := freshPrefix()
	open := func(recMax time.Duration) *kvstore.RedisIndex {
		idx, err := kvstore.NewRedisIndex(srv.Client(t), kvstore.RedisConfig{Prefix: pfx, SharedRecordMaxTTL: recMax})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = idx.Close() })
		return idx
	}
	a, b, old := open(0), open(0), open(-1)
	k := kvstore.Hasher{}.Keys(make([]uint32, 16*8), 16, kvstore.ExtraKeys{})
	// Subscriptions start with a gateway's first call.
	for _, idx := range []*kvstore.RedisIndex{a, b, old} {
		if _, err := idx.Match(ctx, "m", k); err != nil {
			t.Fatal(err)
		}
	}
	// The event: Redis counts A's and B's subscriptions to the records channel (old has none).
	rc, channel := srv.Client(t), pfx+":"+kvstore.LayoutVersion+":records"
	testenv.Eventually(t, 5*time.Second, "A's and B's subscriptions to "+channel, func() bool {
		n, err := rc.PubSubNumSub(ctx, channel).Result()
		return err == nil && n[channel] == 2
	})
	eventually := func(idx kvstore.Index, want ...kvstore.EndpointMatch) {
		t.Helper()
		var got []kvstore.EndpointMatch
		for start := time.Now(); time.Since(start) < 2*time.Second; time.Sleep(5 * time.Millisecond) {
			var err error
			if got, err = idx.Match(ctx, "m", k); err != nil {
				t.Fatal(err)
			}
			if sameMatches(got, want) {
				return
			}
		}
		t.Fatalf("match = %+v, want %+v", got, want)
	}
	if err := a.Add(ctx, "m", "e1", kvstore.TierCPU, k[:2]); err != nil {
		t.Fatal(err)
	}
	if err := a.Record(ctx, "m", "e0", k[:6], 800*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := a.Record(ctx, "m", "e1", k[:4], 800*time.Millisecond); err != nil { // over CPU: counts GPU
		t.Fatal(err)
	}
	t0 := time.Now()
	eventually(b, kvstore.EndpointMatch{Endpoint: "e0", GPUBlocks: 6}, kvstore.EndpointMatch{Endpoint: "e1", GPUBlocks: 4})
	t.Logf("a record through A was found through B after %v", time.Since(t0))
	// Not in Redis: the gateway of the earlier release sees the confirmed entries only.
	eventually(old, kvstore.EndpointMatch{Endpoint: "e1", CPUBlocks: 2})
	// A clear through A reaches B.
	if err := a.ClearEndpoint(ctx, "m", "e0"); err != nil {
		t.Fatal(err)
	}
	eventually(b, kvstore.EndpointMatch{Endpoint: "e1", GPUBlocks: 4})
	// Expiry.
	eventually(b, kvstore.EndpointMatch{Endpoint: "e1", CPUBlocks: 2})
	// The old gateway's record (a script into the block keys) is found by the new ones; a new gateway's long
	// record goes into Redis too, where the old one finds it.
	if err := old.Record(ctx, "m", "e2", k[:3], time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := b.Record(ctx, "m", "e3", k[:5], time.Minute+kvstore.DefaultSharedRecordMaxTTL); err != nil {
		t.Fatal(err)
	}
	want := []kvstore.EndpointMatch{{Endpoint: "e1", CPUBlocks: 2}, {Endpoint: "e2", GPUBlocks: 3}, {Endpoint: "e3", GPUBlocks: 5}}
	eventually(a, want...)
	eventually(old, want...)
}

func sameMatches(got, want []kvstore.EndpointMatch) bool {
	if len(got) != len(want) {
		return false
	}
	for _, w := range want {
		found := false
		for _, g := range got {
			if g == w {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}
