package tokenizer

import (
	"fmt"
	"slices"
	"sync"
	"testing"
)

// TestWordCacheContention hammers a 4-slot cache from several goroutines with more words than slots, so
// writers constantly replace entries readers are copying: a hit must always return exactly the IDs stored
// for that word (the seqlock discards torn reads). Run it with -race.
func TestWordCacheContention(t *testing.T) {
	c := newWordCache(4)
	idsOf := func(w string) []uint32 {
		n := len(w) % (maxCachedIDs + 1)
		ids := make([]uint32, n)
		for i := range ids {
			ids[i] = uint32(len(w)*1000 + i)
		}
		return ids
	}
	var words []string
	for i := range 64 {
		words = append(words, fmt.Sprintf("w%0*d", i%40+1, i))
	}
	var wg sync.WaitGroup
	hits := make([]int, 6)
	for g := range 6 {
		wg.Go(func() {
			for k := range 20000 {
				// Each word is asked for four times in a row, so a goroutine hits its own put unless
				// another goroutine replaced the slot in between: hits are certain, not left to scheduling.
				w := words[(k/4*7+g*13)%len(words)]
				if got, h, ok := c.get(nil, w); ok {
					hits[g]++
					if !slices.Equal(got, idsOf(w)) {
						t.Errorf("%q: got %v, want %v", w, got, idsOf(w))
						return
					}
				} else {
					c.put(h, w, idsOf(w))
				}
			}
		})
	}
	wg.Wait()
	total := 0
	for _, h := range hits {
		total += h
	}
	if total == 0 {
		t.Error("no hits at all")
	}
	// Words too long or with too many IDs are not cached.
	long := string(make([]byte, maxCachedWord+1))
	_, h, _ := c.get(nil, "x")
	c.put(h, "x", make([]uint32, maxCachedIDs+1))
	if _, _, ok := c.get(nil, "x"); ok {
		t.Error("an entry with too many IDs was cached")
	}
	c.put(0, long, []uint32{1})
	c.reset()
	for _, w := range words {
		if _, _, ok := c.get(nil, w); ok {
			t.Fatalf("%q cached after reset", w)
		}
	}
}
