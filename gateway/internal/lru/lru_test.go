package lru

import (
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"testing"
)

func strCache(limit, shards int) *Cache[string, string] {
	seed := maphash.MakeSeed()
	return New[string, string](limit, shards, func(s string) uint64 { return maphash.String(seed, s) })
}

// TestEvictionOrder: with one shard, the least recently used value (added or read) goes first.
func TestEvictionOrder(t *testing.T) {
	c := strCache(30, 1)
	for _, k := range []string{"a", "b", "c"} {
		if !c.Add(k, k, 10, nil) {
			t.Fatalf("Add(%q) refused", k)
		}
	}
	if _, ok := c.Get("a", nil); !ok { // a is now the most recently used; b the least
		t.Fatal("a missing")
	}
	c.Add("d", "d", 10, nil)
	if _, ok := c.Get("b", nil); ok {
		t.Error("b survived; it was the least recently used")
	}
	for _, k := range []string{"a", "c", "d"} {
		if v, ok := c.Get(k, nil); !ok || v != k {
			t.Errorf("Get(%q) = %q, %v", k, v, ok)
		}
	}
	// One value of 25 bytes drops the two least recently used (a, then c) to fit.
	c.Add("e", "e", 25, nil)
	if n := c.Len(); n != 1 {
		t.Errorf("Len = %d after adding 25 bytes to 30 full", n)
	}
	if total, _ := c.Bytes(); total != 25 {
		t.Errorf("Bytes = %d", total)
	}
}

// TestByteBound: no shard goes over limit/shards, a value over it is refused, the newest value survives.
func TestByteBound(t *testing.T) {
	c := strCache(16*1000, 16)
	if c.ShardLimit() != 1000 {
		t.Fatalf("ShardLimit = %d", c.ShardLimit())
	}
	if c.Add("big", "big", 1001, nil) {
		t.Error("a value over a shard's limit was stored")
	}
	for i := range 10000 {
		k := fmt.Sprint(i)
		c.Add(k, k, 10+i%90, nil)
	}
	total, most := c.Bytes()
	if most > c.ShardLimit() || total > 16*1000 {
		t.Errorf("Bytes = %d, %d a shard: over the limit", total, most)
	}
	if n := c.Len(); n == 0 || n >= 10000 {
		t.Errorf("Len = %d", n)
	}
	if _, ok := c.Get("9999", nil); !ok {
		t.Error("the newest value was dropped")
	}
	if New[int, int](0, 16, func(k int) uint64 { return uint64(k) }).Add(1, 1, 1, nil) {
		t.Error("a zero-limit cache stored a value")
	}
}

// TestSharedKey: several values under one key (a hash), told apart by match and same; dropping one keeps
// the others; a dropped value is zeroed.
func TestSharedKey(t *testing.T) {
	c := New[uint64, []byte](100, 1, nil)
	hit := func(s string) func(*[]byte) bool { return func(v *[]byte) bool { return string(*v) == s } }
	c.Add(7, []byte("x"), 40, hit("x"))
	c.Add(7, []byte("y"), 40, hit("y"))
	if c.Add(7, []byte("x"), 40, hit("x")) {
		t.Error("a duplicate was stored")
	}
	if v, ok := c.Get(7, hit("y")); !ok || string(v) != "y" {
		t.Errorf("Get y = %q, %v", v, ok)
	}
	if _, ok := c.Get(7, hit("z")); ok {
		t.Error("Get z found something")
	}
	var dropped *entry[uint64, []byte]
	for _, e := range c.shards[0].byKey[7] {
		if string(e.value) == "x" {
			dropped = e
		}
	}
	c.Add(8, []byte("w"), 40, nil) // drops x, the least recently used
	if _, ok := c.Get(7, hit("x")); ok {
		t.Error("x survived")
	}
	if _, ok := c.Get(7, hit("y")); !ok {
		t.Error("y was dropped with x")
	}
	if dropped.value != nil {
		t.Error("the dropped value was not zeroed")
	}
}

// TestMaxPerKey: a key keeps at most MaxPerKey values; one more drops the oldest stored under it (not the
// least recently used of the shard), its bytes are released and the others stay found.
func TestMaxPerKey(t *testing.T) {
	c := New[uint64, string](1<<20, 1, nil)
	hit := func(s string) func(*string) bool { return func(v *string) bool { return *v == s } }
	c.Add(1, "other", 10, nil)
	for i := range MaxPerKey + 3 {
		s := fmt.Sprint("v", i)
		if !c.Add(7, s, 10, hit(s)) {
			t.Fatalf("Add %s refused", s)
		}
	}
	if n := len(c.shards[0].byKey[7]); n != MaxPerKey {
		t.Errorf("key 7 holds %d values, want %d", n, MaxPerKey)
	}
	for i := range MaxPerKey + 3 {
		s := fmt.Sprint("v", i)
		if _, ok := c.Get(7, hit(s)); ok != (i >= 3) {
			t.Errorf("Get %s: found %v", s, ok)
		}
	}
	if _, ok := c.Get(1, nil); !ok {
		t.Error("a value under another key was dropped")
	}
	if total, _ := c.Bytes(); total != 10*(MaxPerKey+1) {
		t.Errorf("Bytes = %d, want %d", total, 10*(MaxPerKey+1))
	}
}

// BenchmarkCollidingKey: values added under one key with distinct texts, then a miss looked up, as the
// prefix cache does for a stream of prompts that differ only before the bytes its key hashes.
func BenchmarkCollidingKey(b *testing.B) {
	c := New[uint64, string](1<<30, 1, nil)
	tail := string(make([]byte, 4096))
	for i := range 10000 {
		s := fmt.Sprintf("%06d", i) + tail
		c.Add(7, s, len(s), func(v *string) bool { return *v == s })
	}
	miss := "x00000" + tail
	b.ResetTimer()
	for range b.N {
		c.Get(7, func(v *string) bool { return *v == miss })
	}
}

// TestGrow: a value grows in place, its size counts, and going over the limit drops the oldest.
func TestGrow(t *testing.T) {
	c := New[string, []int](100, 1, nil)
	c.Add("old", []int{0}, 30, nil)
	c.Add("k", []int{1}, 30, nil)
	if c.Grow("none", func(*[]int) (int, bool) { return 0, true }) {
		t.Error("Grow of a missing key reported true")
	}
	if !c.Grow("k", func(v *[]int) (int, bool) { *v = append(*v, 2); return 50, true }) {
		t.Fatal("Grow failed")
	}
	if v, ok := c.Get("k", nil); !ok || !slices.Equal(v, []int{1, 2}) {
		t.Errorf("Get k = %v, %v", v, ok)
	}
	if _, ok := c.Get("old", nil); ok {
		t.Error("old survived a growth to 110 bytes")
	}
	if total, _ := c.Bytes(); total != 80 {
		t.Errorf("Bytes = %d, want 80", total)
	}
}

// TestConcurrent: many goroutines adding, reading and growing stay within the bound (run with -race).
func TestConcurrent(t *testing.T) {
	c := strCache(16*500, 16)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				k := fmt.Sprint((g*7 + i) % 300)
				if v, ok := c.Get(k, func(v *string) bool { return *v == k }); ok && v != k {
					t.Errorf("Get(%q) = %q", k, v)
				}
				c.Add(k, k, 20, func(v *string) bool { return *v == k })
				c.Grow(k, func(v *string) (int, bool) { return 1, len(*v) < 3 })
			}
		}()
	}
	wg.Wait()
	if _, most := c.Bytes(); most > c.ShardLimit() {
		t.Errorf("a shard holds %d bytes, over %d", most, c.ShardLimit())
	}
}

func BenchmarkGetHit(b *testing.B) {
	c := strCache(1<<20, 16)
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("segment %d of some prompt text", i)
		c.Add(keys[i], keys[i], 100, nil)
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		c.Get(keys[i%len(keys)], nil)
	}
}

func BenchmarkAddEvict(b *testing.B) {
	c := strCache(16*1000, 16)
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = fmt.Sprintf("segment %d of some prompt text", i)
	}
	for i := 0; b.Loop(); i++ {
		c.Add(keys[i%len(keys)], "", 100, nil)
	}
}
