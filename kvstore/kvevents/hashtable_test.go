package kvevents

import (
	"math/rand/v2"
	"testing"

	"github.com/kvgate/kvgate/kvstore"
)

// TestHashTableModel drives hashTable with random puts, in-place updates, deletes and lookups on few,
// sequential and high-bit-only engine hashes (long probe runs, wrap-around, backward shifts, growth) and
// checks every answer against a Go map.
func TestHashTableModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var tb hashTable
	model := map[EngineHash]kvstore.BlockKey{}
	for i := range 200000 {
		h := EngineHash(rng.IntN(500))
		if rng.IntN(2) == 0 {
			h <<= 55 // same low bits
		}
		switch op := rng.IntN(10); {
		case op < 5:
			e, added := tb.put(h)
			_, had := model[h]
			if added == had {
				t.Fatalf("op %d: put(%d) added=%v, model had=%v", i, h, added, had)
			}
			if !added && e.key != model[h] {
				t.Fatalf("op %d: put(%d) key %d, want %d", i, h, e.key, model[h])
			}
			k := kvstore.BlockKey(rng.Uint64())
			e.key = k
			model[h] = k
		case op < 8:
			delete(model, h)
			tb.del(h)
		default:
			e := tb.get(h)
			k, ok := model[h]
			if (e != nil) != ok || (ok && e.key != k) {
				t.Fatalf("op %d: get(%d) = %v, want %d (%v)", i, h, e, k, ok)
			}
		}
		if tb.len() != len(model) {
			t.Fatalf("op %d: len %d, want %d", i, tb.len(), len(model))
		}
	}
	tb.reset()
	if tb.len() != 0 || tb.get(0) != nil {
		t.Fatal("reset left entries")
	}
}
