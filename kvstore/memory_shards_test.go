package kvstore_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore"
)

// TestMemoryIndexShardCounts runs one random sequence of Add, Record, Remove and ClearConfirmed calls
// (1 to 600 keys per call, duplicates included, so both the per-shard bucketing of writes and its
// one-lock-per-key fallback above 256 shards are used) on indexes with 1, 8 and 512 shards and no
// eviction, and checks that every Match answers the same on all of them.
func TestMemoryIndexShardCounts(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1e9, 0)
	clock := func() time.Time { return now }
	var idxs []*kvstore.MemoryIndex
	for _, n := range []int{1, 8, 512} {
		idxs = append(idxs, kvstore.NewMemoryIndex(kvstore.MemoryConfig{Shards: n, MaxKeys: 1 << 20, Now: clock}))
	}
	rng := rand.New(rand.NewPCG(7, 8))
	pool := make([]kvstore.BlockKey, 3000)
	for i := range pool {
		pool[i] = kvstore.BlockKey(rng.Uint64())
	}
	pick := func() []kvstore.BlockKey {
		ks := make([]kvstore.BlockKey, 1+rng.IntN(600))
		for i := range ks {
			ks[i] = pool[rng.IntN(len(pool))]
		}
		return ks
	}
	matched := 0 // blocks matched over all queries: the comparison must not be of empty answers only
	for step := range 400 {
		ep := kvstore.EndpointID("e" + strconv.Itoa(rng.IntN(6)))
		tier := kvstore.Tier(1 + rng.IntN(2))
		ks := pick()
		op := rng.IntN(10)
		ttl := time.Duration(1+rng.IntN(3)) * time.Second
		for _, idx := range idxs {
			var err error
			switch {
			case op < 4:
				err = idx.Add(ctx, "m", ep, tier, ks)
			case op < 6:
				err = idx.Record(ctx, "m", ep, ks, ttl)
			case op < 9:
				err = idx.Remove(ctx, "m", ep, tier, ks)
			default:
				err = idx.ClearConfirmed(ctx, "m", ep)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		now = now.Add(300 * time.Millisecond)
		q := ks // long runs: the keys just written
		if rng.IntN(2) == 0 {
			q = pick()
		}
		var want []kvstore.EndpointMatch
		for i, idx := range idxs {
			got, err := idx.Match(ctx, "m", q)
			if err != nil {
				t.Fatal(err)
			}
			slices.SortFunc(got, func(a, b kvstore.EndpointMatch) int { return strings.Compare(string(a.Endpoint), string(b.Endpoint)) })
			if i == 0 {
				want = got
				for _, m := range got {
					matched += m.GPUBlocks + m.CPUBlocks
				}
				continue
			}
			if !slices.Equal(got, want) {
				t.Fatalf("step %d: %d-shard index answers %v, 1-shard index %v", step, []int{1, 8, 512}[i], got, want)
			}
		}
	}
	if matched < 1000 {
		t.Fatalf("only %d blocks matched in all queries: the test compares almost nothing", matched)
	}
	t.Logf("%d blocks matched", matched)
}
