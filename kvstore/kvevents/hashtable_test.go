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

// TestHashTableEvictCLOCK bounds the table at 1,000 entries while 20,000 fresh hashes arrive and 50 hot
// ones are touched after every 100 arrivals: evict must return entries the model holds (each once), keep
// every answer of get right after its backward shifts, and never evict a hot entry (CLOCK's second chance:
// a hot entry is touched again before the hand comes round twice). The hot entries arrive after the first
// eviction: that one finds every entry referenced, sweeps once and evicts where it started, whatever it is.
func TestHashTableEvictCLOCK(t *testing.T) {
	const limit, fresh, hot = 1000, 20000, 50
	rng := rand.New(rand.NewPCG(5, 6))
	var tb hashTable
	model := map[EngineHash]kvstore.BlockKey{}
	add := func(h EngineHash) {
		for tb.len() >= limit {
			eh, e, ok := tb.evict()
			if !ok {
				t.Fatal("evict on a full table reported empty")
			}
			k, had := model[eh]
			if !had || k != e.key {
				t.Fatalf("evicted %d (key %d), model has %d (%v)", eh, e.key, k, had)
			}
			if eh < hot {
				t.Fatalf("hot entry %d evicted", eh)
			}
			delete(model, eh)
		}
		e, added := tb.put(h)
		if !added {
			t.Fatalf("put(%d) found an entry", h)
		}
		e.key = kvstore.BlockKey(rng.Uint64())
		model[h] = e.key
	}
	for i := range limit + 1 {
		add(EngineHash(hot + fresh + i))
	}
	for h := range EngineHash(hot) {
		add(h)
	}
	for i := range fresh {
		add(EngineHash(hot + i))
		if i%100 == 0 {
			for h := range EngineHash(hot) {
				tb.get(h).touch()
			}
		}
		if tb.len() != len(model) || tb.len() > limit {
			t.Fatalf("arrival %d: len %d, model %d, limit %d", i, tb.len(), len(model), limit)
		}
	}
	for h, k := range model {
		if e := tb.get(h); e == nil || e.key != k {
			t.Fatalf("get(%d) = %v, want key %d", h, e, k)
		}
	}
	if _, _, ok := (&hashTable{}).evict(); ok {
		t.Fatal("evict on an empty table returned an entry")
	}
}
