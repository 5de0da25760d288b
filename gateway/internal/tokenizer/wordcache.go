package tokenizer

import (
	"encoding/binary"
	"hash/maphash"
	"sync/atomic"
)

// wordCache is a bounded, lock-free, two-way set-associative cache from a pre-token to its BPE IDs. It
// caches words, never whole inputs.
//
// Each slot is 16 atomic 64-bit words guarded by a sequence number (a seqlock): a writer makes the
// sequence odd with a compare-and-swap (skipping the slot if another writer holds it), stores the entry and
// makes it even again; a reader copies the entry and keeps it only if the sequence was even and unchanged.
// All accesses are atomic, so readers never block and the race detector has nothing to report. The cache
// holds no pointers and allocates nothing after construction: garbage collections do not walk it, and a
// miss costs no allocation (see RATIONALE.md).
type wordCache struct {
	slots []cacheSlot
	mask  uint64
	seed  maphash.Seed
}

const (
	// wordCacheSlots bounds the cache: 2^16 slots of 128 bytes (8 MiB).
	wordCacheSlots = 1 << 16
	// maxCachedWord and maxCachedIDs bound what one slot holds.
	maxCachedWord = 48
	maxCachedIDs  = 16
	keyWords      = maxCachedWord / 8
	idWords       = maxCachedIDs / 2
)

// cacheSlot layout: seq; meta = hash tag (high 48 bits) | word length (8 bits) | ID count (8 bits);
// the word's bytes, zero-padded; the IDs, two per word.
type cacheSlot struct {
	seq  atomic.Uint64
	meta atomic.Uint64
	key  [keyWords]atomic.Uint64
	ids  [idWords]atomic.Uint64
}

func newWordCache(slots int) *wordCache {
	return &wordCache{slots: make([]cacheSlot, slots), mask: uint64(slots - 1), seed: maphash.MakeSeed()}
}

// packKey returns w's bytes as little-endian words, zero-padded (len(w) <= maxCachedWord).
func packKey(w string) (k [keyWords]uint64) {
	var buf [maxCachedWord]byte
	copy(buf[:], w)
	for i := range k {
		k[i] = binary.LittleEndian.Uint64(buf[8*i:])
	}
	return k
}

func metaOf(h uint64, wordLen, nIDs int) uint64 {
	return h&^0xFFFF | uint64(wordLen)<<8 | uint64(nIDs)
}

// get appends the cached IDs of w to dst. It returns w's hash for a following put.
func (c *wordCache) get(dst []uint32, w string) ([]uint32, uint64, bool) {
	h := maphash.String(c.seed, w)
	key := packKey(w)
	nk := (len(w) + 7) / 8
	i := h & c.mask
	for way := range uint64(2) {
		sl := &c.slots[i^way]
		s1 := sl.seq.Load()
		if s1&1 != 0 {
			continue
		}
		meta := sl.meta.Load()
		if meta>>16 != h>>16 || int(meta>>8&0xFF) != len(w) {
			continue
		}
		match := true
		for j := 0; j < nk; j++ {
			if sl.key[j].Load() != key[j] {
				match = false
				break
			}
		}
		if !match {
			continue
		}
		n := int(meta & 0xFF)
		var ids [maxCachedIDs]uint32
		for j := 0; j < (n+1)/2; j++ {
			v := sl.ids[j].Load()
			ids[2*j], ids[2*j+1] = uint32(v), uint32(v>>32)
		}
		if sl.seq.Load() != s1 {
			continue // a writer replaced the entry while we read it
		}
		return append(dst, ids[:n]...), h, true
	}
	return dst, h, false
}

// put stores the IDs of w (len(w) <= maxCachedWord; longer ID lists are not cached).
func (c *wordCache) put(h uint64, w string, ids []uint32) {
	if len(ids) > maxCachedIDs || len(w) > maxCachedWord {
		return
	}
	i := h & c.mask
	// Prefer an empty way, else evict one chosen by a hash bit.
	way := (h >> 40) & 1
	if c.slots[i].meta.Load() == 0 {
		way = 0
	} else if c.slots[i^1].meta.Load() == 0 {
		way = 1
	}
	sl := &c.slots[i^way]
	s := sl.seq.Load()
	if s&1 != 0 || !sl.seq.CompareAndSwap(s, s+1) {
		return // another writer holds the slot; caching is best effort
	}
	key := packKey(w)
	for j := range key {
		sl.key[j].Store(key[j])
	}
	for j := 0; j < (len(ids)+1)/2; j++ {
		v := uint64(ids[2*j])
		if 2*j+1 < len(ids) {
			v |= uint64(ids[2*j+1]) << 32
		}
		sl.ids[j].Store(v)
	}
	sl.meta.Store(metaOf(h, len(w), len(ids)))
	sl.seq.Store(s + 2)
}

// reset empties the cache (benchmarks use it to measure cold encoding). Concurrent encoders stay correct.
func (c *wordCache) reset() {
	for i := range c.slots {
		sl := &c.slots[i]
		s := sl.seq.Load()
		if s&1 != 0 || !sl.seq.CompareAndSwap(s, s+1) {
			continue
		}
		sl.meta.Store(0)
		sl.seq.Store(s + 2)
	}
}
