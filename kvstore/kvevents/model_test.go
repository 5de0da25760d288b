package kvevents

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvgate/kvgate/kvstore"
)

// TestIngestAgainstModel applies random engine behaviour (GPU stores continuing a prefix, evictions,
// offload placeholders before and after the GPU removal, CPU drops, cache resets) through an Ingester into
// the memory index, and after every batch compares each prompt's match with what a plain model of the
// engine's two tiers says.
func TestIngestAgainstModel(t *testing.T) {
	const chains, blocks = 8, 6
	for _, seed := range []uint64{1, 2, 3, 4, 5} {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
			ing, err := NewIngester(IngesterConfig{Endpoint: "e0", Model: testModel, BlockSize: 16, Hasher: kvstore.Hasher{Seed: 7}, Index: idx})
			if err != nil {
				t.Fatal(err)
			}
			toks := make([][]uint32, chains)
			for c := range toks {
				toks[c] = tokens(10000*c, blocks*16)
			}
			hash := func(c, i int) EngineHash { return EngineHash(1000*c + i + 1) }
			var gpu, cpu [chains][blocks]bool
			ctx := context.Background()
			for seq := range uint64(2000) {
				var evs []Event
				for range 1 + rng.IntN(4) {
					c, i := rng.IntN(chains), rng.IntN(blocks)
					switch op := rng.IntN(20); {
					case op < 7: // store the run of blocks missing from GPU, from the first one on
						first := 0
						for first < blocks && gpu[c][first] {
							first++
						}
						if first == blocks {
							continue
						}
						last := first
						for last+1 < blocks && !gpu[c][last+1] && rng.IntN(3) > 0 {
							last++
						}
						s := BlockStored{TokenIDs: toks[c][16*first : 16*(last+1)], BlockSize: 16, Medium: "GPU"}
						for j := first; j <= last; j++ {
							s.BlockHashes = append(s.BlockHashes, hash(c, j))
							gpu[c][j] = true
						}
						if first > 0 {
							p := hash(c, first-1)
							s.ParentBlockHash = &p
						}
						evs = append(evs, s)
					case op < 11 && gpu[c][i]: // evict from GPU
						evs = append(evs, BlockRemoved{BlockHashes: []EngineHash{hash(c, i)}, Medium: "GPU"})
						gpu[c][i] = false
					case op < 14 && gpu[c][i] && !cpu[c][i]: // offload (placeholder), maybe right after eviction
						if rng.IntN(2) == 0 {
							evs = append(evs, BlockRemoved{BlockHashes: []EngineHash{hash(c, i)}, Medium: "GPU"})
							gpu[c][i] = false
						}
						evs = append(evs, BlockStored{BlockHashes: []EngineHash{hash(c, i)}, Medium: "CPU"})
						cpu[c][i] = true
					case op < 18 && cpu[c][i]: // drop from CPU
						evs = append(evs, BlockRemoved{BlockHashes: []EngineHash{hash(c, i)}, Medium: "CPU"})
						cpu[c][i] = false
					case op == 19 && rng.IntN(10) == 0: // reset: kvgate forgets both tiers
						evs = append(evs, AllBlocksCleared{})
						gpu, cpu = [chains][blocks]bool{}, [chains][blocks]bool{}
					}
				}
				layout := []Layout{LayoutArrayLast, LayoutMap, LayoutLoRAName}[rng.IntN(3)]
				ing.handle(ctx, seq, mustEncode(t, batch(evs...), layout, HashUint))
				for c := range chains {
					wantG, wantC := 0, 0
					for i := 0; i < blocks && (gpu[c][i] || cpu[c][i]); i++ {
						if gpu[c][i] {
							wantG++
						} else {
							wantC++
						}
					}
					if g, cc := match(t, idx, toks[c], kvstore.ExtraKeys{}); g != wantG || cc != wantC {
						t.Fatalf("seq %d chain %d: match %d GPU %d CPU, model %d, %d\ngpu %v\ncpu %v\nstats %+v",
							seq, c, g, cc, wantG, wantC, gpu[c], cpu[c], ing.Stats())
					}
				}
			}
			s := ing.Stats()
			t.Logf("batches %d events %d blocks added %d clears %d mapped %d", s.Batches, s.Events, s.Blocks, s.Clears, s.MappedHashes)
			if s.Orphans+s.Unresolved+s.UnknownRemoved+s.KeyConflicts+s.DecodeErrors != 0 || s.Blocks == 0 {
				t.Fatalf("stats %+v", s)
			}
		})
	}
}
