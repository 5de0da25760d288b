package kvstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/conformance"
)

func TestMemoryIndexConformance(t *testing.T) {
	conformance.RunIndex(t, func(t *testing.T) kvstore.Index {
		return kvstore.NewMemoryIndex(kvstore.MemoryConfig{Shards: 4})
	})
}

func TestMemoryIndexLRUBound(t *testing.T) {
	ctx := context.Background()
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{MaxKeys: 1000, Shards: 4})
	hot := kvstore.Hasher{Seed: 1}.Keys(make([]uint32, 16*10), 16, kvstore.ExtraKeys{})
	if err := idx.Add(ctx, "m", "hot", kvstore.TierGPU, hot); err != nil {
		t.Fatal(err)
	}
	toks := make([]uint32, 16*100)
	for round := range 50 {
		for i := range toks {
			toks[i] = uint32(round*100000 + i)
		}
		ks := kvstore.Hasher{Seed: 2}.Keys(toks, 16, kvstore.ExtraKeys{})
		if err := idx.Add(ctx, "m", "cold", kvstore.TierGPU, ks); err != nil {
			t.Fatal(err)
		}
		// Touching the hot chain keeps it resident under CLOCK.
		if _, err := idx.Match(ctx, "m", hot); err != nil {
			t.Fatal(err)
		}
		if n := idx.Len(); n > 1000 {
			t.Fatalf("round %d: %d keys > MaxKeys 1000", round, n)
		}
	}
	if n := idx.Len(); n < 900 {
		t.Fatalf("only %d keys held after 5000 inserts into a 1000-key index", n)
	}
	got, _ := idx.Match(ctx, "m", hot)
	if len(got) != 1 || got[0].GPUBlocks != 10 {
		t.Fatalf("hot chain evicted: %+v", got)
	}
	// Clearing the cold endpoint leaves only the hot chain.
	if err := idx.ClearEndpoint(ctx, "m", "cold"); err != nil {
		t.Fatal(err)
	}
	if n := idx.Len(); n != 10 {
		t.Fatalf("after clear: %d keys, want 10", n)
	}
}

func TestMemoryIndexSpeculativeFakeClock(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1000, 0)
	// One shard: sweeping is lazy per shard, on that shard's next write.
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{Shards: 1, Now: func() time.Time { return now }})
	ks := kvstore.Hasher{}.Keys(make([]uint32, 64), 16, kvstore.ExtraKeys{})
	if err := idx.Record(ctx, "m", "a", ks, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if got, _ := idx.Match(ctx, "m", ks); len(got) != 1 || got[0].GPUBlocks != 4 {
		t.Fatalf("before expiry: %+v", got)
	}
	now = now.Add(2 * time.Second) // expiry is exclusive: at the deadline the entry is gone
	if got, _ := idx.Match(ctx, "m", ks); len(got) != 0 {
		t.Fatalf("at expiry: %+v", got)
	}
	// A later write sweeps the expired entries out of the index entirely.
	if err := idx.Add(ctx, "m", "b", kvstore.TierGPU, ks[:1]); err != nil {
		t.Fatal(err)
	}
	if err := idx.Record(ctx, "m", "c", ks[3:], time.Second); err != nil {
		t.Fatal(err)
	}
	if n := idx.Len(); n != 2 {
		t.Fatalf("after sweep: %d keys, want 2", n)
	}
}

// TestMemoryIndexTableChurn drives the open-addressing table through growth and many backward-shift
// deletions, then checks every surviving key is found and every removed key is not.
func TestMemoryIndexTableChurn(t *testing.T) {
	ctx := context.Background()
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{Shards: 1})
	toks := make([]uint32, 20000)
	for i := range toks {
		toks[i] = uint32(i * 31)
	}
	ks := kvstore.Hasher{Seed: 3}.Keys(toks, 1, kvstore.ExtraKeys{})
	if err := idx.Add(ctx, "m", "a", kvstore.TierGPU, ks); err != nil {
		t.Fatal(err)
	}
	var removed []kvstore.BlockKey
	for i, k := range ks {
		if i%3 != 0 {
			removed = append(removed, k)
		}
	}
	if err := idx.Remove(ctx, "m", "a", kvstore.TierGPU, removed); err != nil {
		t.Fatal(err)
	}
	if n := idx.Len(); n != len(ks)-len(removed) {
		t.Fatalf("len %d, want %d", n, len(ks)-len(removed))
	}
	for i, k := range ks {
		got, err := idx.Match(ctx, "m", []kvstore.BlockKey{k})
		if err != nil {
			t.Fatal(err)
		}
		if want := i%3 == 0; (len(got) == 1) != want {
			t.Fatalf("key %d: match %+v, want present=%v", i, got, want)
		}
	}
	if err := idx.ClearEndpoint(ctx, "m", "a"); err != nil {
		t.Fatal(err)
	}
	if n := idx.Len(); n != 0 {
		t.Fatalf("after clear: %d keys", n)
	}
}
