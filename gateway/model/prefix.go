package model

import (
	"container/list"
	"hash/maphash"
	"sync"
)

// prefixCache remembers, per conversation, the IDs of the longest prompt prefix that ended at a stable
// added-token boundary (tokenizer.SplitAdded). Entries are found by a hash of the prompt's first headBytes
// bytes and confirmed by comparing the whole prefix text, so a hit is exact. It is a bounded LRU split into
// shards by that hash.
type prefixCache struct {
	seed   maphash.Seed
	shards [prefixShards]prefixShard
}

const (
	prefixShards = 16
	// headBytes is how much of a prompt identifies its conversation for the lookup; prompts (and cached
	// prefixes) shorter than this are not cached.
	headBytes = 256
	// maxPerHead bounds the prefixes kept for one conversation head (branches of the same conversation).
	maxPerHead = 8
)

type prefixShard struct {
	mu     sync.Mutex
	byHead map[uint64][]*prefixEntry
	order  list.List // of *prefixEntry, front = most recently used
	bytes  int
	limit  int
	clock  uint64 // use stamps for choosing the victim among one head's entries
}

type prefixEntry struct {
	head   uint64
	text   string       // the prefix (a substring of the prompt it came from); "" once evicted
	parent *prefixEntry // the shorter prefix this one extends, nil for a root
	delta  []uint32     // the IDs after the parent's; never modified after insertion
	total  int          // number of IDs of the whole prefix
	depth  int          // number of ancestors
	size   int
	used   uint64 // shard clock at the last hit or insertion
	el     *list.Element
}

func newPrefixCache(limitBytes int) *prefixCache {
	c := &prefixCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].byHead = map[uint64][]*prefixEntry{}
		c.shards[i].limit = limitBytes / prefixShards
	}
	return c
}

// head returns the lookup hash of a prompt of at least headBytes bytes.
func (c *prefixCache) head(prompt string) uint64 { return maphash.String(c.seed, prompt[:headBytes]) }

// maxChain bounds how many entries one prefix's IDs are spread over; a deeper one is stored whole.
const maxChain = 64

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

// longest returns the longest cached prefix of prompt and its length in bytes, or nil.
func (c *prefixCache) longest(h uint64, prompt string) (*prefixEntry, int) {
	sh := &c.shards[h%prefixShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var best *prefixEntry
	for _, e := range sh.byHead[h] {
		n := len(e.text)
		if n > len(prompt) || (best != nil && n <= len(best.text)) {
			continue
		}
		if !sameText(prompt[:n], e.text) {
			continue
		}
		best = e
	}
	if best == nil {
		return nil, 0
	}
	sh.order.MoveToFront(best.el)
	sh.clock++
	best.used = sh.clock
	return best, len(best.text)
}

// put stores a prefix of a prompt that keeps retained bytes alive: parent (may be nil) is the cached prefix
// it extends and delta the IDs after the parent's. The shorter prefixes of the same conversation stay (up to
// maxPerHead, least recently used out first) so that a branch (an edited or regenerated turn) still finds
// its common prefix.
func (c *prefixCache) put(h uint64, text string, parent *prefixEntry, delta []uint32, retained int) {
	e := &prefixEntry{head: h, text: text, parent: parent, delta: delta, total: len(delta)}
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
	sh := &c.shards[h%prefixShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e.size > sh.limit {
		return
	}
	sh.clock++
	e.used = sh.clock
	list := sh.byHead[h]
	for _, old := range list {
		if sameText(old.text, text) {
			return // a concurrent request stored it already
		}
	}
	if len(list) >= maxPerHead {
		lru := list[0]
		for _, x := range list[1:] {
			if x.used < lru.used {
				lru = x
			}
		}
		sh.remove(lru)
	}
	sh.byHead[h] = append(sh.byHead[h], e)
	e.el = sh.order.PushFront(e)
	sh.bytes += e.size
	for sh.bytes > sh.limit {
		sh.remove(sh.order.Back().Value.(*prefixEntry))
	}
}

// remove drops e if it is still cached.
func (sh *prefixShard) remove(e *prefixEntry) {
	list := sh.byHead[e.head]
	for i, x := range list {
		if x == e {
			list = append(list[:i:i], list[i+1:]...)
			if len(list) == 0 {
				delete(sh.byHead, e.head)
			} else {
				sh.byHead[e.head] = list
			}
			sh.order.Remove(e.el)
			sh.bytes -= e.size
			e.text = "" // its prompt may be freed; descendants only need its delta
			return
		}
	}
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
