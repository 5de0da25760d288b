package chattemplate

import (
	"container/list"
	"hash/maphash"
	"slices"
	"sync"
	"unsafe"
)

// PromptCache keeps the prompts of recent native renders (Qwen3's template, plain requests: native.go) so
// that the next turn of a conversation writes only its new messages: the prompt of a request whose first
// k messages are those of a cached render is the cached prompt's first bytes followed by the new
// messages' text, appended in place to the same byte array. The cached prefix is confirmed by comparing
// every earlier message's role and content with the cached bytes (memory speed, no hash trusted), so a
// cached render is exact. A nil *PromptCache caches nothing.
//
// Prompts returned through a PromptCache are views of its append-only arrays: bytes below an array's
// length are never written again, and a conversation's consecutive prompts share their common prefix's
// memory (so a later exact comparison of the two, such as gateway/internal/model's prefix cache does, finds the
// same pointer and costs nothing). It is a bounded LRU split into shards by key; safe for concurrent use.
type PromptCache struct {
	seed   maphash.Seed
	shards [promptShards]promptShard
}

const (
	promptShards = 16
	// promptProbes bounds the message counts a lookup tries, from the request's own count downwards (the
	// next turn of a conversation adds two messages: the assistant's reply and the user's next message).
	promptProbes = 8
	// promptKeyTail is how many bytes of the last message's content a key hashes.
	promptKeyTail = 64
)

type promptShard struct {
	mu    sync.Mutex
	byKey map[uint64][]*promptEntry
	order list.List // of *promptEntry, front = most recently used
	bytes int
	limit int
}

// promptEntry is the render of a request's first msgs messages: text (a view of arena's array, without the
// generation prompt that may follow it there).
type promptEntry struct {
	key   uint64
	msgs  int
	text  string
	arena *byteArena
	size  int
	el    *list.Element
}

// byteArena is the append-only byte array one conversation's prompts are views of. b[:len(b)] is never
// written again; only appending needs mu.
type byteArena struct {
	mu sync.Mutex
	b  []byte
}

// promptArenaCap is the capacity of an arena array for n bytes: a quarter more, at least 4 KiB more.
func promptArenaCap(n int) int { return n + max(n/4, 4096) }

// NewPromptCache returns a PromptCache holding at most limitBytes: each entry counts its arena array's
// capacity (conservative: a conversation's entries share one array) plus 128 bytes. limitBytes <= 0 gives
// nil (no cache). A prompt over limitBytes/16 is not cached.
func NewPromptCache(limitBytes int) *PromptCache {
	if limitBytes <= 0 {
		return nil
	}
	c := &PromptCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].byKey = map[uint64][]*promptEntry{}
		c.shards[i].limit = limitBytes / promptShards
	}
	return c
}

// nativeMsg is one message of a native render: its role and content.
type nativeMsg struct{ role, content string }

// Fixed texts of Qwen3's template around a message.
const (
	imStart = "<|im_start|>"
	imEnd   = "<|im_end|>\n"
)

// segLen is the length of m's text in the prompt.
func (m nativeMsg) segLen() int { return len(imStart) + len(m.role) + 1 + len(m.content) + len(imEnd) }

func appendSeg(b []byte, m nativeMsg) []byte {
	b = append(b, imStart...)
	b = append(b, m.role...)
	b = append(b, '\n')
	b = append(b, m.content...)
	return append(b, imEnd...)
}

// key is the key of the render of msgs[:k], whose text is n bytes long.
func (c *PromptCache) key(msgs []nativeMsg, k, n int) uint64 {
	last := msgs[k-1]
	tail := last.content[len(last.content)-min(len(last.content), promptKeyTail):]
	return maphash.String(c.seed, tail) ^ uint64(n)*0x9E3779B97F4A7C15 ^ uint64(k)<<48 ^ uint64(len(last.role))
}

// lookup returns the longest cached render of a prefix of msgs (at most promptProbes tried, from all of
// msgs downwards): k messages, their text (a view of arena). offs[i] is the text length of msgs[:i].
func (c *PromptCache) lookup(msgs []nativeMsg, offs []int) (k int, text string, arena *byteArena) {
	for k = len(msgs); k > 0 && k > len(msgs)-promptProbes; k-- {
		key := c.key(msgs, k, offs[k])
		sh := &c.shards[key%promptShards]
		sh.mu.Lock()
		for _, e := range sh.byKey[key] {
			if e.msgs == k && len(e.text) == offs[k] && sameRender(e.text, msgs[:k]) {
				sh.order.MoveToFront(e.el)
				text, arena = e.text, e.arena
				break
			}
		}
		sh.mu.Unlock()
		if arena != nil {
			return k, text, arena
		}
	}
	return 0, "", nil
}

// sameRender reports whether text is the render of msgs (its length was checked): every message's fixed
// parts, role and content compared with the bytes at its place.
func sameRender(text string, msgs []nativeMsg) bool {
	off := 0
	for _, m := range msgs {
		n := m.segLen()
		s := text[off : off+n]
		if s[:len(imStart)] != imStart || s[len(imStart):len(imStart)+len(m.role)] != m.role ||
			s[len(imStart)+len(m.role)] != '\n' || s[n-len(imEnd):] != imEnd ||
			s[len(imStart)+len(m.role)+1:n-len(imEnd)] != m.content {
			return false
		}
		off += n
	}
	return true
}

// put caches text (a view of arena), the render of msgs[:k].
func (c *PromptCache) put(msgs []nativeMsg, k int, text string, arena *byteArena, capacity int) {
	e := &promptEntry{key: c.key(msgs, k, len(text)), msgs: k, text: text, arena: arena, size: capacity + 128}
	sh := &c.shards[e.key%promptShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e.size > sh.limit {
		return
	}
	for _, old := range sh.byKey[e.key] {
		if old.msgs == k && old.text == text {
			return // a concurrent request, or the same request again, stored it already
		}
	}
	sh.byKey[e.key] = append(sh.byKey[e.key], e)
	e.el = sh.order.PushFront(e)
	sh.bytes += e.size
	for sh.bytes > sh.limit {
		sh.remove(sh.order.Back().Value.(*promptEntry))
	}
}

func (sh *promptShard) remove(e *promptEntry) {
	l := sh.byKey[e.key]
	for i, x := range l {
		if x == e {
			l = append(l[:i:i], l[i+1:]...)
			if len(l) == 0 {
				delete(sh.byKey, e.key)
			} else {
				sh.byKey[e.key] = l
			}
			break
		}
	}
	sh.order.Remove(e.el)
	sh.bytes -= e.size
	e.text, e.arena = "", nil
}

// extend returns prefix (a view of a's array ending at a cached render's end) followed by more, as a view
// of a's array: more is appended in place when the bytes after prefix are free or are the start of more
// (the previous turn's generation prompt). ok is false when they belong to another continuation (a
// branch: an edited or regenerated message); the caller then copies prefix into a new arena.
func (a *byteArena) extend(prefix string, more []byte) (s string, capacity int, ok bool) {
	n := len(prefix)
	a.mu.Lock()
	defer a.mu.Unlock()
	have := a.b[n:]
	k := 0
	for k < len(have) && k < len(more) && have[k] == more[k] {
		k++
	}
	switch {
	case k == len(more):
		return bytesView(a.b, n+k), cap(a.b), true
	case k < len(have):
		return "", 0, false
	}
	need := len(a.b) + len(more) - k
	if need > cap(a.b) {
		// Grow by about a quarter (each byte is copied about four times over a conversation); older
		// views keep the older array.
		a.b = slices.Grow(a.b[:len(a.b):len(a.b)], promptArenaCap(need)-len(a.b))
	}
	a.b = append(a.b, more[k:]...)
	return bytesView(a.b, need), cap(a.b), true
}

// bytesView is b[:n] as a string sharing b's memory; b[:n] must never be written again.
func bytesView(b []byte, n int) string {
	if n == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), n)
}
