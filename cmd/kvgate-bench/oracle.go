package main

import (
	"container/list"
	"encoding/binary"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"
)

// blockChain returns the chained keys of the full blocks of ids (block i's key folds in block i−1's), so
// two sequences share key i exactly when their first (i+1)·blockSize tokens are equal.
func blockChain(ids []uint32, blockSize int) []uint64 {
	n := len(ids) / blockSize
	keys := make([]uint64, n)
	var parent uint64
	buf := make([]byte, 8+4*blockSize)
	for i := range n {
		binary.LittleEndian.PutUint64(buf, parent)
		for j, t := range ids[i*blockSize : (i+1)*blockSize] {
			binary.LittleEndian.PutUint32(buf[8+4*j:], t)
		}
		parent = xxhash.Sum64(buf)
		keys[i] = parent
	}
	return keys
}

// blockCache is a prefix cache of block keys: infinite (capacity 0) or one LRU of capacity blocks. Hits
// counts the leading blocks of a sequence it holds; Add inserts every block (tail blocks least recent,
// so an eviction takes a sequence's tail before its head, as vLLM frees a finished request's blocks).
type blockCache struct {
	capacity int
	order    *list.List // front = most recent; values are block keys
	at       map[uint64]*list.Element
}

func newBlockCache(capacity int) *blockCache {
	return &blockCache{capacity: capacity, order: list.New(), at: map[uint64]*list.Element{}}
}

// Hits returns how many leading keys the cache holds.
func (c *blockCache) Hits(keys []uint64) int {
	n := 0
	for n < len(keys) {
		if _, ok := c.at[keys[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// Add inserts or refreshes keys, the first key most recent.
func (c *blockCache) Add(keys []uint64) {
	for i := len(keys) - 1; i >= 0; i-- {
		k := keys[i]
		if e, ok := c.at[k]; ok {
			c.order.MoveToFront(e)
			continue
		}
		c.at[k] = c.order.PushFront(k)
		if c.capacity > 0 && c.order.Len() > c.capacity {
			old := c.order.Back()
			c.order.Remove(old)
			delete(c.at, old.Value.(uint64))
		}
	}
}

// oracleRequest is one sent request as the oracle sees it: its prompt's token IDs at its send time, and
// prompt plus answer (the blocks an engine caches once the answer is generated) at its finish time.
type oracleRequest struct {
	Start, Finish time.Duration
	Prompt        []uint32
	Answer        []uint32 // the answer's token IDs (empty: prompt blocks only)
	OK            bool     // the request was answered (a refused request caches nothing)
}

// oracleResult is what the two ceilings would serve, in tokens, per request (index as given).
type oracleResult struct {
	Infinite, LRU []int64
}

// oracleCached replays reqs in time order against one infinite cache and one LRU of lruBlocks blocks:
// each request looks up its prompt at its start (whole blocks) and the cache stores its prompt then, and
// its prompt plus answer at its finish. No router over any fleet can beat the infinite cache on the same
// arrivals; no fleet of that total capacity can beat the LRU much (it ignores pinned running blocks).
func oracleCached(reqs []oracleRequest, blockSize, lruBlocks int) oracleResult {
	type event struct {
		at     time.Duration
		finish bool
		i      int
	}
	ev := make([]event, 0, 2*len(reqs))
	for i, r := range reqs {
		ev = append(ev, event{r.Start, false, i})
		if r.OK {
			ev = append(ev, event{r.Finish, true, i})
		}
	}
	slices.SortStableFunc(ev, func(a, b event) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		if a.finish != b.finish { // finishes first at equal times
			if a.finish {
				return -1
			}
			return 1
		}
		return a.i - b.i
	})
	inf, lru := newBlockCache(0), newBlockCache(max(lruBlocks, 1))
	out := oracleResult{Infinite: make([]int64, len(reqs)), LRU: make([]int64, len(reqs))}
	for _, e := range ev {
		r := reqs[e.i]
		if e.finish {
			keys := blockChain(append(slices.Clip(r.Prompt), r.Answer...), blockSize)
			inf.Add(keys)
			lru.Add(keys)
			continue
		}
		keys := blockChain(r.Prompt, blockSize)
		out.Infinite[e.i] = int64(inf.Hits(keys) * blockSize)
		out.LRU[e.i] = int64(lru.Hits(keys) * blockSize)
		if r.OK {
			inf.Add(keys)
			lru.Add(keys)
		}
	}
	return out
}
