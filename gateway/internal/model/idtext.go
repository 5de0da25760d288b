package model

import (
	"unsafe"
	"weak"

	"github.com/kvgate/kvgate/gateway/internal/lru"
)

// DefaultIDTextCacheBytes bounds the token-ID text cache of a Model built by Load or New (AppendIDsJSON):
// the formatted text it keeps, about 7 bytes per ID (a 128k-token conversation takes about 1.1 MiB, so
// the default holds about 30 of them). It keeps no ID array alive.
const DefaultIDTextCacheBytes = 32 << 20

// idTextCache keeps the JSON text of recent ID arrays returned by the Model's encoders, keyed by the
// array: a conversation's next turn is a longer view of the same append-only array (an idArena), so only
// its new IDs are formatted. It is one LRU under one mutex (an lru.Cache of one shard, one entry per key;
// the lock is held for map and list operations only, never while formatting). An entry counts its text's
// capacity plus 128 bytes.
//
// The key is a weak pointer to the array's first ID: it does not keep the array alive, and an array
// allocated later at the same address gets another key (weak pointers name objects, not addresses), so
// an entry is only ever found for the array whose IDs it formatted.
type idTextCache struct {
	c *lru.Cache[weak.Pointer[uint32], idTextEntry]
}

// idTextEntry is the text of its key's array's first n IDs: "[" then the IDs joined by ",", without the
// closing "]". text is append-only (bytes below its length are never written again).
type idTextEntry struct {
	n    int
	text []byte
}

func newIDTextCache(limit int) *idTextCache {
	if limit <= 0 {
		return nil
	}
	return &idTextCache{c: lru.New[weak.Pointer[uint32], idTextEntry](limit, 1, nil)}
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
	e, _ := c.c.Get(base, func(e *idTextEntry) bool { return e.n <= len(ids) })
	text, n := e.text, e.n
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
	if n > 0 {
		// Extend the entry unless a concurrent request of the conversation got there first.
		c.c.Grow(base, func(e *idTextEntry) (int, bool) {
			if e.n != n || len(e.text) != len(text) {
				return 0, false
			}
			old := cap(e.text)
			e.text = append(e.text, out[len(text):]...)
			e.n = len(ids)
			return cap(e.text) - old, true
		})
		return dst
	}
	// Room for about a quarter more IDs, as the arenas have; a concurrent request may have stored one.
	text = append(make([]byte, 0, len(out)+max(len(out)/4, 8192)), out...)
	c.c.Add(base, idTextEntry{n: len(ids), text: text}, cap(text)+128, nil)
	return dst
}
