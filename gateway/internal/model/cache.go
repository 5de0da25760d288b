package model

import (
	"hash/maphash"

	"github.com/kvgate/kvgate/gateway/internal/lru"
)

// segmentCache is a bounded LRU from a run of prompt text to its token IDs (an lru.Cache keyed by the
// text, one value per key), split into shards by the text's hash so concurrent requests rarely wait on the
// same lock. An entry counts its text, its IDs (4 bytes each) and 64 bytes.
type segmentCache struct {
	c *lru.Cache[string, []uint32]
}

const segmentShards = 16

func newSegmentCache(limitBytes int) *segmentCache {
	seed := maphash.MakeSeed()
	return &segmentCache{c: lru.New[string, []uint32](limitBytes, segmentShards,
		func(s string) uint64 { return maphash.String(seed, s) })}
}

func (c *segmentCache) get(s string) ([]uint32, bool) { return c.c.Get(s, nil) }

func (c *segmentCache) put(s string, ids []uint32) { c.c.Add(s, ids, len(s)+4*len(ids)+64, nil) }

// len returns the number of cached segments (tests).
func (c *segmentCache) len() int { return c.c.Len() }
