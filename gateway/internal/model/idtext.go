package model

import (
	"container/list"
	"sync"
	"unsafe"
	"weak"
)

// DefaultIDTextCacheBytes bounds the token-ID text cache of a Model built by Load or New (AppendIDsJSON):
// the formatted text it keeps, about 7 bytes per ID (a 128k-token conversation takes about 1.1 MiB, so
// the default holds about 30 of them). It keeps no ID array alive.
const DefaultIDTextCacheBytes = 32 << 20

// idTextCache keeps the JSON text of recent ID arrays returned by the Model's encoders, keyed by the
// array: a conversation's next turn is a longer view of the same append-only array (an idArena), so only
// its new IDs are formatted. It is one LRU under one mutex (held for map and list operations only, never
// while formatting).
type idTextCache struct {
	mu sync.Mutex
	// byBase is keyed by a weak pointer to the array's first ID: it does not keep the array alive, and an
	// array allocated later at the same address gets another key (weak pointers name objects, not
	// addresses), so an entry is only ever found for the array whose IDs it formatted.
	byBase map[weak.Pointer[uint32]]*idTextEntry
	order  list.List // of *idTextEntry, front = most recently used
	bytes  int
	limit  int
}

// idTextEntry is the text of base's array's first n IDs: "[" then the IDs joined by ",", without the
// closing "]". text is append-only (bytes below its length are never written again).
type idTextEntry struct {
	base weak.Pointer[uint32]
	n    int
	text []byte
	size int
	el   *list.Element
}

func newIDTextCache(limit int) *idTextCache {
	if limit <= 0 {
		return nil
	}
	return &idTextCache{byBase: map[weak.Pointer[uint32]]*idTextEntry{}, limit: limit}
}

// AppendIDsJSON appends ids as a JSON array to dst, exactly format(dst, ids), where format is
// openai.AppendIDs (passed in: gateway/internal/openai's tests import this package) or any function writing "["
// then the IDs in decimal joined by "," then "]". ids must be a
// result of this Model's EncodeChat, EncodeChatRequest, EncodePrompt or EncodeCompletion (read-only, as
// they document): the text of the array they are a view of is cached, and a later, longer view of the
// same array (the conversation's next turn, appended in place) formats only the IDs after the cached
// ones. The cache is exact because those arrays are never written below the length of any view returned
// (model RATIONALE.md); a slice from elsewhere that is later modified would make the text stale, so other
// callers use openai.AppendIDs.
func (m *Model) AppendIDsJSON(dst []byte, ids []uint32, format func(dst []byte, ids []uint32) []byte) []byte {
	c := m.idText
	if c == nil || len(ids) == 0 {
		return format(dst, ids)
	}
	base := weak.Make(unsafe.SliceData(ids))
	c.mu.Lock()
	e := c.byBase[base]
	var text []byte
	n := 0
	if e != nil && e.n <= len(ids) {
		text, n = e.text, e.n
		c.order.MoveToFront(e.el)
	}
	c.mu.Unlock()
	start := len(dst)
	switch {
	case n == len(ids):
		return append(append(dst, text...), ']')
	case n > 0:
		dst = append(dst, text...)
		p := len(dst)
		dst = format(dst, ids[n:])
		dst[p] = ',' // format's "[" continues the cached text
	default:
		dst = format(dst, ids)
	}
	out := dst[start : len(dst)-1] // without "]"
	c.mu.Lock()
	defer c.mu.Unlock()
	if e != nil && c.byBase[base] == e && e.n == n && len(e.text) == len(text) {
		// Extend the entry (no concurrent request of the conversation got there first).
		old := cap(e.text)
		e.text = append(e.text, out[len(text):]...)
		e.n = len(ids)
		c.bytes += cap(e.text) - old
		e.size += cap(e.text) - old
		c.evict()
		return dst
	}
	if n > 0 || c.byBase[base] != nil {
		return dst
	}
	// Room for about a quarter more IDs, as the arenas have.
	e = &idTextEntry{base: base, n: len(ids), text: append(make([]byte, 0, len(out)+max(len(out)/4, 8192)), out...)}
	e.size = cap(e.text) + 128
	if e.size > c.limit {
		return dst
	}
	c.byBase[base] = e
	e.el = c.order.PushFront(e)
	c.bytes += e.size
	c.evict()
	return dst
}

// evict drops least recently used entries until the cache is within its limit; c.mu is held.
func (c *idTextCache) evict() {
	for c.bytes > c.limit {
		e := c.order.Back().Value.(*idTextEntry)
		c.order.Remove(e.el)
		delete(c.byBase, e.base)
		c.bytes -= e.size
		e.text = nil
	}
}
