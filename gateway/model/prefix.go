package model

import (
	"container/list"
	"hash/maphash"
	"sync"
)

// prefixCache remembers the IDs of prompt prefixes that end at a stable added-token boundary
// (tokenizer.SplitAdded). An entry is keyed by the prefix's length and a hash of its last keyBytes bytes;
// a lookup probes the token ends of a new prompt from its end backwards (tokenizer.AddedTokenEnds), so the
// previous turn of a conversation is found after a few probes, and confirms a hit by comparing the whole
// prefix text, so a hit is exact. Entries extend a parent entry (chains), see RATIONALE.md. It is a
// bounded LRU split into shards by key.
type prefixCache struct {
	seed   maphash.Seed
	shards [prefixShards]prefixShard
}

const (
	prefixShards = 16
	// keyBytes is how much of a prefix's end its key hashes.
	keyBytes = 256
	// minPrefix is the shortest prefix worth caching, in bytes.
	minPrefix = 256
	// maxProbes bounds the token ends a lookup tries before giving up (a prompt the cache has never seen
	// costs at most this many probes plus a backward byte scan).
	maxProbes = 64
	// maxChain bounds how many entries one prefix's IDs are spread over; a deeper one is stored whole.
	maxChain = 64
)

type prefixShard struct {
	mu    sync.Mutex
	byKey map[uint64][]*prefixEntry
	order list.List // of *prefixEntry, front = most recently used
	bytes int
	limit int
}

type prefixEntry struct {
	key    uint64
	text   string       // the prefix (a substring of the prompt it came from); "" once evicted
	parent *prefixEntry // the shorter prefix this one extends, nil for a root
	delta  []uint32     // the IDs after the parent's; never modified after insertion
	total  int          // number of IDs of the whole prefix
	depth  int          // number of ancestors
	size   int
	el     *list.Element
}

func newPrefixCache(limitBytes int) *prefixCache {
	c := &prefixCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].byKey = map[uint64][]*prefixEntry{}
		c.shards[i].limit = limitBytes / prefixShards
	}
	return c
}

// key returns the key of prompt[:n].
func (c *prefixCache) key(prompt string, n int) uint64 {
	return maphash.String(c.seed, prompt[n-min(n, keyBytes):n]) ^ uint64(n)*0x9E3779B97F4A7C15
}

// appendIDs appends the IDs of the whole prefix (the deltas from the root down) to dst.
func (e *prefixEntry) appendIDs(dst []uint32) []uint32 {
	var buf [maxChain + 1]*prefixEntry
	chain := buf[:0]
	for x := e; x != nil; x = x.parent {
		chain = append(chain, x)
	}
	for i := len(chain) - 1; i >= 0; i-- {
		dst = append(dst, chain[i].delta...)
	}
	return dst
}

// lookup returns the cached entry for prompt[:n], or nil.
func (c *prefixCache) lookup(prompt string, n int) *prefixEntry {
	k := c.key(prompt, n)
	sh := &c.shards[k%prefixShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for _, e := range sh.byKey[k] {
		if sameText(prompt[:n], e.text) {
			sh.order.MoveToFront(e.el)
			return e
		}
	}
	return nil
}

// put stores prompt[:n], which keeps retained bytes alive: parent (may be nil) is the cached prefix it
// extends and delta the IDs after the parent's.
func (c *prefixCache) put(prompt string, n int, parent *prefixEntry, delta []uint32, retained int) {
	k := c.key(prompt, n)
	e := &prefixEntry{key: k, text: prompt[:n], parent: parent, delta: delta, total: len(delta)}
	if parent != nil {
		e.total += parent.total
		e.depth = parent.depth + 1
		if e.depth >= maxChain { // flatten
			e.delta = e.appendIDs(make([]uint32, 0, e.total))
			e.parent, e.depth = nil, 0
		}
	}
	// Account for the whole prefix's IDs: evicted ancestors stay reachable through parent.
	e.size = retained + 4*e.total + 128
	sh := &c.shards[k%prefixShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e.size > sh.limit {
		return
	}
	for _, old := range sh.byKey[k] {
		if sameText(old.text, e.text) {
			return // a concurrent request stored it already
		}
	}
	sh.byKey[k] = append(sh.byKey[k], e)
	e.el = sh.order.PushFront(e)
	sh.bytes += e.size
	for sh.bytes > sh.limit {
		sh.remove(sh.order.Back().Value.(*prefixEntry))
	}
}

// remove drops e, which is cached.
func (sh *prefixShard) remove(e *prefixEntry) {
	list := sh.byKey[e.key]
	for i, x := range list {
		if x == e {
			list = append(list[:i:i], list[i+1:]...)
			if len(list) == 0 {
				delete(sh.byKey, e.key)
			} else {
				sh.byKey[e.key] = list
			}
			break
		}
	}
	sh.order.Remove(e.el)
	sh.bytes -= e.size
	e.text = "" // its prompt may be freed; descendants only need its delta
}

// sameText is a == b comparing the last 256 bytes first: prefixes of one conversation's branches share all
// but their ends, so a mismatch is found without comparing the whole prompt.
func sameText(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	k := len(a) - min(len(a), 256)
	return a[k:] == b[k:] && a[:k] == b[:k]
}
