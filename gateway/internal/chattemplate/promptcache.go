package chattemplate

import (
	"hash/maphash"
	"unsafe"

	"github.com/kvgate/kvgate/gateway/internal/lru"
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
// same pointer and costs nothing). It is a bounded LRU split into shards by key (lru.Cache); safe for concurrent use.
type PromptCache struct {
	seed maphash.Seed
	c    *lru.Cache[uint64, promptEntry]
}

const (
	promptShards = 16
	// promptProbes bounds the message counts a lookup tries, from the request's own count downwards (the
	// next turn of a conversation adds two messages: the assistant's reply and the user's next message).
	promptProbes = 8
	// promptKeyTail is how many bytes of the last message's content a key hashes.
	promptKeyTail = 64
)

// promptEntry is the render of a request's first msgs messages: text (a view of arena's array, without the
// generation prompt that may follow it there).
type promptEntry struct {
	msgs  int
	text  string
	arena *byteArena
}

// byteArena is the append-only byte array one conversation's prompts are views of (lru.Arena).
type byteArena = lru.Arena[byte]

// promptArenaSpare is the least spare capacity of a prompt arena, in bytes.
const promptArenaSpare = 4096

// promptArenaCap is the capacity of an arena array for n bytes: a quarter more, at least 4 KiB more.
func promptArenaCap(n int) int { return lru.ArenaCap(n, promptArenaSpare) }

// newByteArena makes an arena holding b (whose spare capacity it takes over).
func newByteArena(b []byte) *byteArena { return lru.NewArena(b, promptArenaSpare) }

// NewPromptCache returns a PromptCache holding at most limitBytes: each entry counts its arena array's
// capacity (conservative: a conversation's entries share one array) plus 128 bytes. limitBytes <= 0 gives
// nil (no cache). A prompt over limitBytes/16 is not cached.
func NewPromptCache(limitBytes int) *PromptCache {
	if limitBytes <= 0 {
		return nil
	}
	// Keys are hashes already: a key's shard is key % promptShards.
	return &PromptCache{seed: maphash.MakeSeed(),
		c: lru.New[uint64, promptEntry](limitBytes, promptShards, func(k uint64) uint64 { return k })}
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
		e, ok := c.c.Get(c.key(msgs, k, offs[k]), func(e *promptEntry) bool {
			return e.msgs == k && len(e.text) == offs[k] && sameRender(e.text, msgs[:k])
		})
		if ok {
			return k, e.text, e.arena
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

// put caches text (a view of arena, whose array has the given capacity), the render of msgs[:k], unless
// a concurrent request, or the same request again, stored it already. An entry counts its arena array's
// capacity plus 128 bytes.
func (c *PromptCache) put(msgs []nativeMsg, k int, text string, arena *byteArena, capacity int) {
	c.c.Add(c.key(msgs, k, len(text)), promptEntry{msgs: k, text: text, arena: arena}, capacity+128,
		func(old *promptEntry) bool { return old.msgs == k && old.text == text })
}

// extend returns prefix (a view of a's array ending at a cached render's end) followed by more, as a view
// of a's array (lru.Arena.Extend): more is appended in place when the bytes after prefix are free or are
// the start of more (the previous turn's generation prompt). ok is false when they belong to another
// continuation (a branch: an edited or regenerated message); the caller then copies prefix into a new
// arena.
func extend(a *byteArena, prefix string, more []byte) (s string, capacity int, ok bool) {
	b, capacity, ok := a.Extend(len(prefix), more)
	return bytesView(b, len(b)), capacity, ok
}

// bytesView is b[:n] as a string sharing b's memory; b[:n] must never be written again.
func bytesView(b []byte, n int) string {
	if n == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), n)
}
