package model

import (
	"container/list"
	"hash/maphash"
	"sync"
)

// segmentCache is a bounded LRU from a run of prompt text to its token IDs, split into shards by the
// text's hash so concurrent requests rarely wait on the same lock.
type segmentCache struct {
	seed   maphash.Seed
	shards [segmentShards]segmentShard
}

const segmentShards = 16

type segmentShard struct {
	mu    sync.Mutex
	items map[string]*list.Element
	order list.List // front = most recently used
	bytes int
	limit int
}

type segmentEntry struct {
	text string
	ids  []uint32
}

func newSegmentCache(limitBytes int) *segmentCache {
	c := &segmentCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].items = map[string]*list.Element{}
		c.shards[i].limit = limitBytes / segmentShards
	}
	return c
}

func (c *segmentCache) shard(s string) *segmentShard {
	return &c.shards[maphash.String(c.seed, s)%segmentShards]
}

func (c *segmentCache) get(s string) ([]uint32, bool) {
	sh := c.shard(s)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	el, ok := sh.items[s]
	if !ok {
		return nil, false
	}
	sh.order.MoveToFront(el)
	return el.Value.(*segmentEntry).ids, true
}

func entrySize(e *segmentEntry) int { return len(e.text) + 4*len(e.ids) + 64 }

func (c *segmentCache) put(s string, ids []uint32) {
	e := &segmentEntry{text: s, ids: ids}
	size := entrySize(e)
	sh := c.shard(s)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if size > sh.limit {
		return
	}
	if _, ok := sh.items[s]; ok {
		return
	}
	sh.items[s] = sh.order.PushFront(e)
	sh.bytes += size
	for sh.bytes > sh.limit {
		back := sh.order.Back()
		old := back.Value.(*segmentEntry)
		sh.order.Remove(back)
		delete(sh.items, old.text)
		sh.bytes -= entrySize(old)
	}
}

// len returns the number of cached segments (tests).
func (c *segmentCache) len() int {
	n := 0
	for i := range c.shards {
		c.shards[i].mu.Lock()
		n += len(c.shards[i].items)
		c.shards[i].mu.Unlock()
	}
	return n
}
