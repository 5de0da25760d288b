package kvstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
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

// TestMemoryIndexStress runs matches against concurrent adds, removes, records, clears and evictions (a
// 2,000-key bound under a larger working set) and checks every result stays possible.
func TestMemoryIndexStress(t *testing.T) {
	ctx := context.Background()
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{MaxKeys: 2000, Shards: 4})
	var chains [][]kvstore.BlockKey
	for c := range 40 {
		toks := make([]uint32, 16*100)
		for i := range toks {
			toks[i] = uint32(c*100000 + i)
		}
		chains = append(chains, kvstore.Hasher{}.Keys(toks, 16, kvstore.ExtraKeys{}))
	}
	var wg sync.WaitGroup
	var writers atomic.Int32
	writers.Store(3)
	for w := range 3 {
		wg.Go(func() {
			ep := kvstore.EndpointID(fmt.Sprintf("w%d", w))
			defer func() { writers.Add(-1) }()
			for i := range 3000 {
				ch := chains[(i*7+w)%len(chains)]
				var err error
				switch i % 5 {
				case 0, 1:
					err = idx.Add(ctx, "m", ep, kvstore.Tier(1+i%2), ch[:10+i%90])
				case 2:
					err = idx.Remove(ctx, "m", ep, kvstore.TierGPU, ch[i%50:i%50+5])
				case 3:
					err = idx.Record(ctx, "m", ep, ch[:20], time.Millisecond*time.Duration(1+i%3))
				case 4:
					if i%40 == 4 {
						err = idx.ClearEndpoint(ctx, "m", ep)
					}
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	hits := 0
	for i := 0; writers.Load() > 0 || i < 1000; i++ {
		ch := chains[i%len(chains)]
		got, err := idx.Match(ctx, "m", ch)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) > 0 {
			hits++
		}
		if len(got) > 3 {
			t.Fatalf("%d endpoints matched, only 3 write", len(got))
		}
		for _, m := range got {
			if m.GPUBlocks < 0 || m.CPUBlocks < 0 || m.GPUBlocks+m.CPUBlocks == 0 || m.GPUBlocks+m.CPUBlocks > len(ch) {
				t.Fatalf("impossible match %+v", m)
			}
		}
		if n := idx.Len(); n > 2000 {
			t.Fatalf("%d keys over the bound", n)
		}
	}
	wg.Wait()
	t.Logf("%d matches with hits, %d keys at the end", hits, idx.Len())
	if hits < 100 || idx.Len() < 500 {
		t.Fatalf("stress too light: %d hits, %d keys", hits, idx.Len())
	}
}

func TestMemoryIndexEndpointCapConformance(t *testing.T) {
	conformance.RunEndpointCap(t, func(t *testing.T, perEndpoint int) kvstore.Index {
		return kvstore.NewMemoryIndex(kvstore.MemoryConfig{Shards: 4, MaxKeysPerEndpoint: perEndpoint})
	})
}

// Within the per-endpoint cap the memory index evicts the endpoint's least recently used entries: a block
// matched after every Add survives a 1,000-block flood of its endpoint, one never matched again does not,
// and the other endpoints' entries and the global count are untouched.
func TestMemoryIndexEndpointCapLRU(t *testing.T) {
	ctx := context.Background()
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{Shards: 1, MaxKeysPerEndpoint: 64})
	ks := kvstore.Hasher{Seed: 9}.Keys(make([]uint32, 4*1002), 4, kvstore.ExtraKeys{})
	// CLOCK, not exact LRU: on the first eviction every entry is still referenced (new entries start so), the
	// hand clears them all and evicts where it started. Fill past the cap first so hot and cold enter a
	// running clock.
	hot, cold, flood := ks[0], ks[1], ks[2:]
	if err := idx.Add(ctx, "m", "e0", kvstore.TierGPU, flood[:70]); err != nil {
		t.Fatal(err)
	}
	flood = flood[70:]
	for _, k := range []kvstore.BlockKey{hot, cold} {
		if err := idx.Add(ctx, "m", "e0", kvstore.TierGPU, []kvstore.BlockKey{k}); err != nil {
			t.Fatal(err)
		}
	}
	has := func(k kvstore.BlockKey) bool {
		ms, err := idx.Match(ctx, "m", []kvstore.BlockKey{k})
		if err != nil {
			t.Fatal(err)
		}
		return len(ms) == 1 && ms[0].GPUBlocks == 1
	}
	for _, k := range flood {
		if err := idx.Add(ctx, "m", "e0", kvstore.TierGPU, []kvstore.BlockKey{k}); err != nil {
			t.Fatal(err)
		}
		if !has(hot) {
			t.Fatal("the hot block was evicted although it was matched after every Add")
		}
	}
	if has(cold) {
		t.Fatal("the cold block survived 930 Adds under a cap of 64")
	}
	if n := idx.Len(); n != 64 {
		t.Fatalf("index holds %d entries, want the cap (64)", n)
	}
	if !has(flood[len(flood)-1]) {
		t.Fatal("the newest block was evicted")
	}
}
