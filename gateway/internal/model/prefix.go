package model

import (
	"container/list"
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// prefixCache remembers the IDs of prompt prefixes that end at a stable added-token boundary
// (tokenizer.SplitAdded). An entry is keyed by the prefix's length and a hash of its last keyBytes bytes;
// a lookup probes the token ends of a new prompt from its end backwards (tokenizer.AddedTokenEnds), so the
// previous turn of a conversation is found after a few probes, and confirms a hit by comparing the whole
// prefix text, so a hit is exact. An entry's IDs live in an idArena shared with the conversation's other
// turns and with the slices EncodePrompt returns, see RATIONALE.md. It is a bounded LRU split into shards
// by key.
type prefixCache struct {
	seed   maphash.Seed
	shards [prefixShards]prefixShard
	// ends holds the texts of the added tokens cached prefixes end with (one or two per chat template,
	// e.g. "<|im_start|>"), copy-on-write under endsMu; nil while nothing is cached. A lookup searches
	// the prompt backwards for them instead of testing every byte for an added token's end. manyEnds is
	// set once more than maxEndTokens were seen: lookups then walk every added-token end.
	ends     atomic.Pointer[[]string]
	endsMu   sync.Mutex
	manyEnds atomic.Bool
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
	// maxEndTokens bounds prefixCache.ends.
	maxEndTokens = 8
)

type prefixShard struct {
	mu    sync.Mutex
	byKey map[uint64][]*prefixEntry
	order list.List // of *prefixEntry, front = most recently used
	bytes int
	limit int
}

type prefixEntry struct {
	key   uint64
	text  string   // the prefix (a substring of the prompt it came from); "" once evicted
	ids   []uint32 // the prefix's IDs (a view of arena), or for a branch the IDs of the prefix it branched from
	delta []uint32 // nil, or for a branch the IDs after ids
	arena *idArena // where ids live and where the conversation's next turn appends; nil for a branch
	size  int
	el    *list.Element
}

// idArena is the append-only backing array of one conversation's IDs. ids[:len(ids)] are never written
// again: cached entries and returned slices are views of it (clipped to their length, so an append by a
// caller reallocates), and a later turn of the conversation appends after len(ids), or to a larger copy
// when the capacity is used up (older views keep the older array). Only the appending needs mu.
type idArena struct {
	mu  sync.Mutex
	ids []uint32
}

// arenaCap is the capacity of an arena array for n IDs: a quarter more, and at least 1024 more (a turn).
func arenaCap(n int) int { return n + max(n/4, 1024) }

// newArena makes an arena holding ids (whose spare capacity it takes over).
func newArena(ids []uint32) *idArena { return &idArena{ids: ids} }

// view returns ids[:n] as a read-only view (len == cap).
func view(ids []uint32, n int) []uint32 { return ids[:n:n] }

// promote copies a branch entry's IDs (prefix, then delta) into a new arena, now that it has a next turn
// (the one copy a branch costs, made once per continuation), and returns the arena and its view.
func promote(prefix, delta []uint32) (*idArena, []uint32) {
	n := len(prefix) + len(delta)
	buf := make([]uint32, n, arenaCap(n))
	copy(buf[copy(buf, prefix):], delta)
	return newArena(buf), view(buf, n)
}

// extend returns a view of prefix (a view of a's array of length n, ending at a cached boundary) followed
// by more, appending more to the arena if the IDs after n are still free or already start with more's
// first IDs (the same conversation's previous turn). ok is false when the IDs after n belong to a
// different continuation (a branch); the caller then copies prefix to a new arena.
// capacity is the capacity of the array ids is a view of.
func (a *idArena) extend(prefix []uint32, more []uint32) (ids []uint32, capacity int, ok bool) {
	n := len(prefix)
	a.mu.Lock()
	defer a.mu.Unlock()
	have := a.ids[n:]
	k := 0
	for k < len(have) && k < len(more) && have[k] == more[k] {
		k++
	}
	switch {
	case k == len(more): // the IDs are already there (the same prompt again)
		return view(a.ids, n+k), cap(a.ids), true
	case k < len(have): // the array continues differently: a branch
		return nil, 0, false
	}
	need := len(a.ids) + len(more) - k
	if need > cap(a.ids) {
		// Grow by about a quarter, so a growing conversation copies each ID about four times in all (a
		// few hundred nanoseconds per turn) and the spare capacity stays small. slices.Grow does not
		// zero the part it copies.
		a.ids = slices.Grow(a.ids[:len(a.ids):len(a.ids)], arenaCap(need)-len(a.ids))
	}
	a.ids = append(a.ids, more[k:]...)
	return view(a.ids, need), cap(a.ids), true
}

func newPrefixCache(limitBytes int) *prefixCache {
	c := &prefixCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].byKey = map[uint64][]*prefixEntry{}
		c.shards[i].limit = limitBytes / prefixShards
	}
	return c
}

// enabled reports whether the cache can hold anything.
func (c *prefixCache) enabled() bool { return c.shards[0].limit > 0 }

// noteEnd records tok, the text of the added token a cached prefix ends with, in c.ends.
func (c *prefixCache) noteEnd(tok string) {
	if l := c.ends.Load(); l != nil && slices.Contains(*l, tok) {
		return
	}
	c.endsMu.Lock()
	defer c.endsMu.Unlock()
	var l []string
	if old := c.ends.Load(); old != nil {
		if slices.Contains(*old, tok) {
			return
		}
		l = slices.Clone(*old)
	}
	if len(l) == maxEndTokens {
		c.manyEnds.Store(true)
		return
	}
	l = append(l, strings.Clone(tok))
	c.ends.Store(&l)
}

// probeEnds calls probe with the positions in prompt where a cached prefix may end, from the end
// backwards, until probe returns false, the position falls below minPrefix or maxProbes were tried.
// Candidates are the ends of the texts in c.ends; once there are too many of those, every added-token end
// (tokenizer.AddedTokenEnds, which addedEnds is) is tried. Either way a candidate is only a place to look
// up: lookup compares the text.
func (c *prefixCache) probeEnds(prompt string, addedEnds func(string, func(int) bool), probe func(p int) bool) {
	probes := 0
	if c.manyEnds.Load() {
		addedEnds(prompt, func(p int) bool {
			if p < minPrefix || probes == maxProbes {
				return false
			}
			probes++
			return probe(p)
		})
		return
	}
	l := c.ends.Load()
	if l == nil {
		return
	}
	ends := *l
	for hi := len(prompt); probes < maxProbes; probes++ {
		// The last end at or before hi of any of the texts.
		p := -1
		for _, tok := range ends {
			if i := strings.LastIndex(prompt[:hi], tok); i >= 0 {
				p = max(p, i+len(tok))
			}
		}
		if p < minPrefix || !probe(p) {
			return
		}
		hi = p - 1
	}
}

// key returns the key of prompt[:n].
func (c *prefixCache) key(prompt string, n int) uint64 {
	return maphash.String(c.seed, prompt[n-min(n, keyBytes):n]) ^ uint64(n)*0x9E3779B97F4A7C15
}

// lookup returns the cached prefix prompt[:n]: its IDs in arena, or for a branch (nil arena) its IDs as
// ids then delta; ok is false when it is not cached.
func (c *prefixCache) lookup(prompt string, n int) (ids, delta []uint32, arena *idArena, ok bool) {
	k := c.key(prompt, n)
	sh := &c.shards[k%prefixShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for _, e := range sh.byKey[k] {
		if sameText(prompt[:n], e.text) {
			sh.order.MoveToFront(e.el)
			return e.ids, e.delta, e.arena, true
		}
	}
	return nil, nil, nil, false
}

// put stores prompt[:n], whose IDs are ids (a view of arena), keeping retained bytes alive (the prompt
// text and the array ids is a view of).
func (c *prefixCache) put(prompt string, n int, ids []uint32, arena *idArena, retained int) {
	c.insert(&prefixEntry{text: prompt[:n], ids: ids, arena: arena}, retained)
}

// putBranch stores prompt[:n], whose IDs are base (a cached prefix's view, shared) then delta, keeping
// retained bytes alive.
func (c *prefixCache) putBranch(prompt string, n int, base, delta []uint32, retained int) {
	c.insert(&prefixEntry{text: prompt[:n], ids: base, delta: delta}, retained)
}

func (c *prefixCache) insert(e *prefixEntry, retained int) {
	k := c.key(e.text, len(e.text))
	e.key = k
	// A conversation's entries share one array, but each counts it whole: conservative, and it covers
	// the older arrays a growth leaves behind for the older entries.
	e.size = retained + 128
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
	e.text, e.ids, e.delta, e.arena = "", nil, nil, nil // entries are only read under the lock; lookups returned copies
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
