package kvstore

import (
	"math/rand/v2"
	"testing"
)

// TestSpecTableModel drives specTable with random raises, deletes and lookups on few keys (long probe runs,
// wrap-around at the table's end, backward shifts) and checks every answer against a Go map.
func TestSpecTableModel(t *testing.T) {
	type k struct {
		ik  uint64
		hid uint16
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var tb specTable
	model := map[k]int64{}
	for i := range 200000 {
		// Keys share low bits in bunches so probe runs collide and wrap.
		key := k{ik: uint64(rng.IntN(300)) << 58 >> uint(rng.IntN(2)), hid: uint16(rng.IntN(3))}
		switch op := rng.IntN(10); {
		case op < 5:
			exp := int64(1 + rng.IntN(1000))
			want := model[key] < exp
			if want {
				model[key] = exp
			}
			if got := tb.raise(key.ik, key.hid, exp); got != want {
				t.Fatalf("op %d: raise(%v, %d) = %v, want %v", i, key, exp, got, want)
			}
		case op < 8:
			delete(model, key)
			tb.del(key.ik, key.hid)
		default:
			if got := tb.get(key.ik, key.hid); got != model[key] {
				t.Fatalf("op %d: get(%v) = %d, want %d", i, key, got, model[key])
			}
		}
		if tb.count != len(model) {
			t.Fatalf("op %d: count %d, want %d", i, tb.count, len(model))
		}
	}
	for key, exp := range model {
		if got := tb.get(key.ik, key.hid); got != exp {
			t.Fatalf("final get(%v) = %d, want %d", key, got, exp)
		}
	}
}
