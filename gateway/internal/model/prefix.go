package model

import (
	"hash/maphash"
	"iter"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/kvgate/kvgate/gateway/internal/lru"
)

// prefixCache remembers the IDs of prompt prefixes that end at a stable added-token boundary
// (tokenizer.SplitAdded). An entry is keyed by the prefix's length and hashes of its first and last keyBytes bytes;
// a lookup probes the token ends of a new prompt from its end backwards (tokenizer.AddedTokenEnds), so the
// previous turn of a conversation is found after a few probes, and confirms a hit by comparing the whole
// prefix text, so a hit is exact. An entry's IDs live in an idArena (lru.Arena) shared with the conversation's other
// turns and with the slices EncodePrompt returns, see RATIONALE.md. It is a bounded LRU split into shards
// by key (lru.Cache).
type prefixCache struct {
	seed maphash.Seed
	c    *lru.Cache[uint64, prefixEntry]
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

// prefixEntry is one cached prefix: its text (a substring of the prompt it came from) and its IDs, a
// view of arena, or for a branch (nil arena) the IDs of the prefix it branched from then delta.
type prefixEntry struct {
	text  string
	ids   []uint32
	delta []uint32
	arena *idArena
}

// idArena is the append-only backing array of one conversation's IDs (lru.Arena): cached entries and
// returned slices are views of it.
type idArena = lru.Arena[uint32]

// arenaSpare is the least spare capacity of an ID arena: about a turn.
const arenaSpare = 1024

// arenaCap is the capacity of an arena array for n IDs: a quarter more, and at least 1024 more (a turn).
func arenaCap(n int) int { return lru.ArenaCap(n, arenaSpare) }

// newArena makes an arena holding ids (whose spare capacity it takes over).
func newArena(ids []uint32) *idArena { return lru.NewArena(ids, arenaSpare) }

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

func newPrefixCache(limitBytes int) *prefixCache {
	// Keys are hashes already: a key's shard is key % prefixShards.
	return &prefixCache{seed: maphash.MakeSeed(),
		c: lru.New[uint64, prefixEntry](limitBytes, prefixShards, func(k uint64) uint64 { return k })}
}

// enabled reports whether the cache can hold anything.
func (c *prefixCache) enabled() bool { return c.c.ShardLimit() > 0 }

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

// key returns the key of prompt[:n]: its length and hashes of its first and last keyBytes bytes. The tail
// tells a conversation's turns apart; the head, prompts of one length that share their ending (a fixed
// instruction after a variable opening), which with the tail alone shared one key and made every lookup
// compare against all of them.
// head is headHash(prompt), computed once for all the probes of one prompt (the head of every prefix of at
// least keyBytes bytes is the prompt's).
func (c *prefixCache) key(prompt string, n int, head uint64) uint64 {
	if n < keyBytes {
		head = c.headHash(prompt[:n])
	}
	tail := maphash.String(c.seed, prompt[n-min(n, keyBytes):n])
	return tail ^ bits.RotateLeft64(head, 29) ^ uint64(n)*0x9E3779B97F4A7C15
}

// headHash hashes s's first keyBytes bytes (all of s when shorter): the head part of key.
func (c *prefixCache) headHash(s string) uint64 {
	return maphash.String(c.seed, s[:min(len(s), keyBytes)])
}

// lookup returns the cached prefix prompt[:n]: its IDs in arena, or for a branch (nil arena) its IDs as
// ids then delta; ok is false when it is not cached.
func (c *prefixCache) lookup(prompt string, n int, head uint64) (ids, delta []uint32, arena *idArena, ok bool) {
	e, ok := c.c.Get(c.key(prompt, n, head), func(e *prefixEntry) bool { return sameText(prompt[:n], e.text) })
	return e.ids, e.delta, e.arena, ok
}

// put stores prompt[:n], whose IDs are ids (a view of arena), keeping retained bytes alive (the prompt
// text and the array ids is a view of).
func (c *prefixCache) put(prompt string, n int, ids []uint32, arena *idArena, retained int) {
	c.insert(prefixEntry{text: prompt[:n], ids: ids, arena: arena}, retained)
}

// putBranch stores prompt[:n], whose IDs are base (a cached prefix's view, shared) then delta, keeping
// retained bytes alive.
func (c *prefixCache) putBranch(prompt string, n int, base, delta []uint32, retained int) {
	c.insert(prefixEntry{text: prompt[:n], ids: base, delta: delta}, retained)
}

// insert stores e unless a concurrent request stored its text already. A conversation's entries share one
// array, but each counts it whole (retained, plus 128 bytes): conservative, and it covers the older arrays
// a growth leaves behind for the older entries.
func (c *prefixCache) insert(e prefixEntry, retained int) {
	c.c.Add(c.key(e.text, len(e.text), c.headHash(e.text)), e, retained+128, func(old *prefixEntry) bool { return sameText(old.text, e.text) })
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

// cachedPrefix is the longest cached prefix of a prompt that longest found: prompt[:base], whose IDs are
// ids, a view of arena (a branch entry is promoted to an arena of its own). base is 0 when none was found.
type cachedPrefix struct {
	base  int
	ids   []uint32
	arena *idArena
}

// longest looks up prompt[:p] for each p that ends yields (the places a cached prefix may end, longest
// first: text cuts for completions, added-token ends for chat prompts) and returns the first hit, with
// prompt's text after the hit repaired to valid UTF-8 (a cached prefix is valid UTF-8 and ends after a
// token, so only the rest needs repairing). ends may be nil: no lookup.
func (c *prefixCache) longest(prompt string, ends iter.Seq[int]) (string, cachedPrefix) {
	var hit cachedPrefix
	if ends != nil {
		head := c.headHash(prompt)
		for p := range ends {
			ids, delta, arena, ok := c.lookup(prompt, p, head)
			if !ok {
				continue
			}
			hit = cachedPrefix{base: p, ids: ids, arena: arena}
			if arena == nil {
				hit.arena, hit.ids = promote(ids, delta)
			}
			break
		}
	}
	if !utf8.ValidString(prompt[hit.base:]) {
		prompt = prompt[:hit.base] + strings.ToValidUTF8(prompt[hit.base:], "\uFFFD")
	}
	return prompt, hit
}
