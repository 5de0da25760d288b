package sim

import (
	"container/list"
)

// digest is a full sha256_cbor block hash (vLLM's BlockHash bytes).
type digest [32]byte

// tier is where a cached block lives.
type tier uint8

const (
	tierGPU tier = 1
	tierCPU tier = 2
)

func (t tier) medium() string {
	if t == tierCPU {
		return "CPU"
	}
	return "GPU"
}

// kvEvent is one cache event before it is turned into a kvevents value.
type kvEvent struct {
	kind   string // kvevents.TagBlockStored, TagBlockRemoved, TagAllBlocksCleared
	medium tier
	hashes []digest
	parent *digest
	tokens []uint32 // nil for CPU placeholders and removals
	lora   string
	// placeholder marks a CPU store without parent/tokens/block size (vLLM's default offload events).
	placeholder bool
}

// block is one physical GPU block.
type block struct {
	ref    int
	hashed bool
	hash   digest
	parent *digest
	tokens []uint32
	lora   string
	elem   *list.Element // in lru while hashed && ref == 0
}

// cpuBlock is one block held by the CPU tier.
type cpuBlock struct {
	hash   digest
	parent *digest
	tokens []uint32
	lora   string
	elem   *list.Element
}

// kvCache is a paged KV cache: a GPU pool of fixed-size blocks with a prefix-cache hash map and LRU
// eviction of unreferenced cached blocks, and an optional CPU tier that takes the blocks the GPU evicts,
// itself LRU. Blocks referenced by running requests are pinned. Every change that vLLM would report is
// appended to events. Not safe for concurrent use (the engine holds its lock).
type kvCache struct {
	blockSize       int
	capacity        int
	cpuCapacity     int
	selfDescribing  bool
	allocated       int // blocks ever handed out from the never-used pool
	free            []*block
	cached          map[digest]*block
	lru             *list.List // *block, front = least recently used
	pinned          int        // blocks with ref > 0
	cpu             map[digest]*cpuBlock
	cpuLRU          *list.List // *cpuBlock
	events          []kvEvent
	offloadedBlocks uint64 // GPU → CPU block copies
	reloadedBlocks  uint64 // CPU → GPU block copies
}

func newKVCache(blockSize, gpuBlocks, cpuBlocks int, selfDescribing bool) *kvCache {
	return &kvCache{
		blockSize:      blockSize,
		capacity:       gpuBlocks,
		cpuCapacity:    cpuBlocks,
		selfDescribing: selfDescribing,
		cached:         make(map[digest]*block),
		lru:            list.New(),
		cpu:            make(map[digest]*cpuBlock),
		cpuLRU:         list.New(),
	}
}

// usage is the fraction of GPU blocks referenced by running requests (vLLM's kv_cache_usage_perc).
func (c *kvCache) usage() float64 { return float64(c.pinned) / float64(c.capacity) }

// available is the number of GPU blocks a new request could take: never-used, free or evictable.
func (c *kvCache) available() int { return c.capacity - c.pinned }

// match returns the request's prefix match: the tier of each consecutive held block from block 0, at most
// maxBlocks. GPU wins when both tiers hold a block.
func (c *kvCache) match(hashes []digest, maxBlocks int) []tier {
	var run []tier
	for i, h := range hashes {
		if i >= maxBlocks {
			break
		}
		if _, ok := c.cached[h]; ok {
			run = append(run, tierGPU)
		} else if _, ok := c.cpu[h]; ok {
			run = append(run, tierCPU)
		} else {
			break
		}
	}
	return run
}

// seqBlocks is the blocks one request holds, block i covering tokens [i*B, (i+1)*B).
type seqBlocks []*block

// allocate gives a request its blocks: the prefix match run (GPU hits referenced, CPU hits reloaded into
// new GPU blocks), then fresh blocks up to total. It returns false and changes nothing when the GPU cannot
// hold them. hashes are the prompt's full-block hashes, lora its adapter.
func (c *kvCache) allocate(run []tier, total int, hashes []digest, lora string) (seqBlocks, bool) {
	gpuHits := 0
	pinnedHits := 0 // GPU hits already referenced by another request
	for i, t := range run {
		if t == tierGPU {
			gpuHits++
			if c.cached[hashes[i]].ref > 0 {
				pinnedHits++
			}
		}
	}
	// Fresh blocks needed; GPU hits that are currently evictable stop being available once referenced.
	need := total - gpuHits
	if need > c.available()-(gpuHits-pinnedHits) {
		return nil, false
	}
	// Pin every GPU hit before allocating anything, so no allocation below can evict one of them; keep the
	// CPU hits' contents, since an offload below may push them out of the CPU tier.
	blocks := make(seqBlocks, total)
	cpuHits := make(map[int]*cpuBlock)
	for i, t := range run {
		if t == tierGPU {
			b := c.cached[hashes[i]]
			c.ref(b)
			blocks[i] = b
		} else {
			cpuHits[i] = c.cpu[hashes[i]]
			c.cpuLRU.MoveToBack(cpuHits[i].elem)
		}
	}
	for i := range run {
		cb, ok := cpuHits[i]
		if !ok {
			continue
		}
		b := c.fresh()
		c.reloadedBlocks++
		b.tokens = cb.tokens
		c.register(b, hashes[i], parentOf(hashes, i), lora)
		c.events = append(c.events, kvEvent{kind: "BlockStored", medium: tierGPU, hashes: []digest{hashes[i]},
			parent: parentOf(hashes, i), tokens: cb.tokens, lora: lora})
		blocks[i] = b
	}
	for i := len(run); i < total; i++ {
		blocks[i] = c.fresh()
	}
	return blocks, true
}

func parentOf(hashes []digest, i int) *digest {
	if i == 0 {
		return nil
	}
	p := hashes[i-1]
	return &p
}

// ref pins b.
func (c *kvCache) ref(b *block) {
	if b.ref == 0 {
		c.pinned++
		if b.elem != nil {
			c.lru.Remove(b.elem)
			b.elem = nil
		}
	}
	b.ref++
}

// fresh returns a pinned, unhashed block: never-used, free, or the least recently used cached block
// (evicted: BlockRemoved on GPU, and offloaded to the CPU tier when there is one).
func (c *kvCache) fresh() *block {
	var b *block
	switch {
	case len(c.free) > 0:
		b = c.free[len(c.free)-1]
		c.free = c.free[:len(c.free)-1]
	case c.allocated < c.capacity:
		c.allocated++
		b = &block{}
	default:
		e := c.lru.Front()
		b = e.Value.(*block)
		c.lru.Remove(e)
		b.elem = nil
		c.evict(b)
	}
	b.ref = 1
	c.pinned++
	return b
}

// evict drops b's hash from the GPU prefix cache, reporting it, and offloads it to the CPU tier.
func (c *kvCache) evict(b *block) {
	delete(c.cached, b.hash)
	c.events = append(c.events, kvEvent{kind: "BlockRemoved", medium: tierGPU, hashes: []digest{b.hash}})
	if c.cpuCapacity > 0 {
		c.offload(b)
	}
	*b = block{}
}

// offload copies an evicted GPU block into the CPU tier, evicting the CPU tier's LRU block when full.
func (c *kvCache) offload(b *block) {
	if cb, ok := c.cpu[b.hash]; ok {
		c.cpuLRU.MoveToBack(cb.elem)
		return
	}
	if len(c.cpu) >= c.cpuCapacity {
		e := c.cpuLRU.Front()
		old := e.Value.(*cpuBlock)
		c.cpuLRU.Remove(e)
		delete(c.cpu, old.hash)
		c.events = append(c.events, kvEvent{kind: "BlockRemoved", medium: tierCPU, hashes: []digest{old.hash}})
	}
	cb := &cpuBlock{hash: b.hash, parent: b.parent, tokens: b.tokens, lora: b.lora}
	cb.elem = c.cpuLRU.PushBack(cb)
	c.cpu[b.hash] = cb
	c.offloadedBlocks++
	ev := kvEvent{kind: "BlockStored", medium: tierCPU, hashes: []digest{b.hash}, lora: b.lora}
	if c.selfDescribing {
		ev.parent, ev.tokens = b.parent, b.tokens
	} else {
		ev.placeholder = true
	}
	c.events = append(c.events, ev)
}

// register makes b the cached block of hash h (b must be pinned and unhashed).
func (c *kvCache) register(b *block, h digest, parent *digest, lora string) {
	b.hashed, b.hash, b.parent, b.lora = true, h, parent, lora
	c.cached[h] = b
}

// commit caches the request's prompt blocks [from, to) that just became computed, reporting each run of
// newly cached blocks as one BlockStored (as vLLM's cache_full_blocks does). A block whose hash another
// request cached meanwhile stays private to this request.
func (c *kvCache) commit(blocks seqBlocks, hashes []digest, tokens []uint32, lora string, from, to int) {
	var ev *kvEvent
	for i := from; i < to && i < len(hashes); i++ {
		b := blocks[i]
		if b.hashed {
			ev = nil
			continue
		}
		if _, dup := c.cached[hashes[i]]; dup {
			ev = nil
			continue
		}
		b.tokens = tokens[i*c.blockSize : (i+1)*c.blockSize]
		c.register(b, hashes[i], parentOf(hashes, i), lora)
		if ev == nil {
			c.events = append(c.events, kvEvent{kind: "BlockStored", medium: tierGPU, parent: parentOf(hashes, i), lora: lora})
			ev = &c.events[len(c.events)-1]
		}
		ev.hashes = append(ev.hashes, hashes[i])
		ev.tokens = append(ev.tokens, b.tokens...)
	}
}

// release unpins a request's blocks: cached ones become evictable (most recently used), the others free.
func (c *kvCache) release(blocks seqBlocks) {
	// vLLM frees a request's blocks in reverse order so that its tail is evicted first.
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		b.ref--
		if b.ref > 0 {
			continue
		}
		c.pinned--
		if b.hashed {
			b.elem = c.lru.PushBack(b)
		} else {
			*b = block{}
			c.free = append(c.free, b)
		}
	}
}

// reset drops every cached hash on both tiers (vLLM's reset_prefix_cache) and reports AllBlocksCleared.
// Blocks held by running requests stay allocated but are no longer shared.
func (c *kvCache) reset() {
	for h, b := range c.cached {
		delete(c.cached, h)
		b.hashed = false
		if b.elem != nil {
			c.lru.Remove(b.elem)
			*b = block{}
			c.free = append(c.free, b)
		}
	}
	clear(c.cpu)
	c.cpuLRU.Init()
	c.events = append(c.events, kvEvent{kind: "AllBlocksCleared"})
}

// takeEvents returns and clears the pending events.
func (c *kvCache) takeEvents() []kvEvent {
	ev := c.events
	c.events = nil
	return ev
}

// cachedBlocks returns the number of blocks in the GPU and CPU prefix caches.
func (c *kvCache) cachedBlocks() (gpu, cpu int) { return len(c.cached), len(c.cpu) }
