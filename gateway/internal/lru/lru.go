// Package lru is the gateway's one byte-bounded, sharded least-recently-used cache (Cache) and the one
// append-only array that cached views point into (Arena). The model's segment, prefix and token-text
// caches and the chat template's rendered-prompt cache are thin wrappers over them: what differs between
// those (how a key is made, how a hit is confirmed, what a branch costs) stays in the callers and is
// passed in as small functions.
package lru

import "sync"

// Cache maps keys of type K to values of type V. Several values may share one key (a key that is a hash
// of the text it stands for): a lookup passes a match function that confirms the value it wants, so a hit
// is exact whatever the hash. Each value is stored with a size in bytes chosen by the caller (what it
// keeps alive, usually with a fixed overhead added); a shard holds at most limitBytes/shards bytes, and a
// value larger than that is not stored. When an insert or a growth takes a shard over its limit, the
// shard's least recently used values are dropped until it is within it; a dropped value is zeroed, so the
// cache keeps nothing it has dropped alive.
//
// A key holds at most MaxPerKey values: storing one more drops the oldest stored under that key first.
// Keys that hash only part of a text (the model's prefix cache hashes a prefix's first and last 256 bytes
// and its length) collide for prompts that differ only outside those parts; without the bound every request of such
// a stream would compare its text with all of them (measured: 41% of a gateway's CPU, growing with the
// cache, see gateway/RATIONALE.md).
//
// The shards are chosen by the caller's hash of the key, so concurrent requests rarely wait on one lock.
// A Cache is safe for concurrent use; match, same and grow functions run under the shard's lock and must
// not call the Cache.
type Cache[K comparable, V any] struct {
	hash   func(K) uint64
	shards []shard[K, V]
}

// MaxPerKey is the most values a Cache keeps under one key.
const MaxPerKey = 8

type shard[K comparable, V any] struct {
	mu    sync.Mutex
	byKey map[K][]*entry[K, V]
	root  entry[K, V] // root.next is the most recently used entry, root.prev the least; a ring
	bytes int
	limit int
}

// entry is one value in its shard's recency ring.
type entry[K comparable, V any] struct {
	key        K
	value      V
	size       int
	prev, next *entry[K, V]
}

// New returns a Cache of shards shards (at least 1) holding at most limitBytes in all, limitBytes/shards
// in each. hash picks a key's shard (hash(k) % shards); it may be nil when shards is 1. A limitBytes
// below shards gives a cache that stores nothing.
func New[K comparable, V any](limitBytes, shards int, hash func(K) uint64) *Cache[K, V] {
	shards = max(shards, 1)
	c := &Cache[K, V]{hash: hash, shards: make([]shard[K, V], shards)}
	for i := range c.shards {
		sh := &c.shards[i]
		sh.byKey = map[K][]*entry[K, V]{}
		sh.limit = max(limitBytes, 0) / shards
		sh.root.next, sh.root.prev = &sh.root, &sh.root
	}
	return c
}

// ShardLimit returns the bytes one shard may hold: limitBytes/shards as given to New.
func (c *Cache[K, V]) ShardLimit() int { return c.shards[0].limit }

func (c *Cache[K, V]) shard(k K) *shard[K, V] {
	if len(c.shards) == 1 {
		return &c.shards[0]
	}
	return &c.shards[c.hash(k)%uint64(len(c.shards))]
}

// Get returns a copy of the first value stored under k for which match returns true (nil match: the
// first value), oldest stored first, and marks it most recently used; ok is false when there is none.
func (c *Cache[K, V]) Get(k K, match func(*V) bool) (v V, ok bool) {
	sh := c.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for _, e := range sh.byKey[k] {
		if match == nil || match(&e.value) {
			sh.toFront(e)
			return e.value, true
		}
	}
	return v, false
}

// Add stores v under k with size bytes, as the most recently used value, unless size is over a shard's
// limit or a value already stored under k satisfies same (nil same: any value under k, so a key holds at
// most one value), dropping the oldest value stored under k first when k holds MaxPerKey, then drops
// least recently used values until the shard is within its limit. It reports
// whether v was stored (it may have been dropped again at once only if it alone is over the limit, which
// the size check excludes).
func (c *Cache[K, V]) Add(k K, v V, size int, same func(*V) bool) bool {
	sh := c.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if size > sh.limit {
		return false
	}
	l := sh.byKey[k]
	for _, old := range l {
		if same == nil || same(&old.value) {
			return false
		}
	}
	if len(l) >= MaxPerKey {
		sh.remove(l[0])
		l = sh.byKey[k]
	}
	e := &entry[K, V]{key: k, value: v, size: size}
	sh.byKey[k] = append(l, e)
	sh.pushFront(e)
	sh.bytes += size
	sh.evict()
	return true
}

// Grow calls grow on the values stored under k, oldest first, until one returns ok; that value's size
// grows by the bytes grow returns (the value was changed in place), the shard drops least recently used
// values until it is within its limit (which may drop the grown value itself), and Grow reports true.
// The grown value's recency is unchanged.
func (c *Cache[K, V]) Grow(k K, grow func(*V) (bytes int, ok bool)) bool {
	sh := c.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for _, e := range sh.byKey[k] {
		if n, ok := grow(&e.value); ok {
			e.size += n
			sh.bytes += n
			sh.evict()
			return true
		}
	}
	return false
}

// Len returns the number of values stored.
func (c *Cache[K, V]) Len() int {
	n := 0
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for _, l := range sh.byKey {
			n += len(l)
		}
		sh.mu.Unlock()
	}
	return n
}

// Bytes returns the sizes of the stored values added up, and the most any one shard holds.
func (c *Cache[K, V]) Bytes() (total, maxShard int) {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		total += sh.bytes
		maxShard = max(maxShard, sh.bytes)
		sh.mu.Unlock()
	}
	return total, maxShard
}

func (sh *shard[K, V]) pushFront(e *entry[K, V]) {
	e.prev, e.next = &sh.root, sh.root.next
	e.next.prev = e
	sh.root.next = e
}

func (sh *shard[K, V]) unlink(e *entry[K, V]) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

func (sh *shard[K, V]) toFront(e *entry[K, V]) {
	if sh.root.next != e {
		sh.unlink(e)
		sh.pushFront(e)
	}
}

// evict drops least recently used entries until the shard is within its limit; sh.mu is held.
func (sh *shard[K, V]) evict() {
	for sh.bytes > sh.limit && sh.root.prev != &sh.root {
		sh.remove(sh.root.prev)
	}
}

// remove drops e, which is stored, from its key's list and the ring, and zeroes its value.
func (sh *shard[K, V]) remove(e *entry[K, V]) {
	l := sh.byKey[e.key]
	for i, x := range l {
		if x == e {
			l = append(l[:i:i], l[i+1:]...)
			break
		}
	}
	if len(l) == 0 {
		delete(sh.byKey, e.key)
	} else {
		sh.byKey[e.key] = l
	}
	sh.unlink(e)
	sh.bytes -= e.size
	var zero V
	e.value = zero
}
