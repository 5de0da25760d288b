package sim

import (
	"testing"
)

// testHashes returns the sha256_cbor digests (seed "0") of n blocks of 16 tokens starting at first.
func testPrompt(n int, first uint32) ([]uint32, []digest) {
	toks := make([]uint32, n*16)
	for i := range toks {
		toks[i] = first + uint32(i)
	}
	h, _ := newBlockHasher("0")
	return toks, h.blockHashes(toks, 16, "", "")
}

func kinds(evs []kvEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.kind+"/"+e.medium.medium())
	}
	return out
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// serveOne admits, computes and releases one prompt, as the scheduler does.
func serveOne(t *testing.T, c *kvCache, toks []uint32, hs []digest, total int) []tier {
	t.Helper()
	run := c.match(hs, (len(toks)-1)/16)
	blocks, ok := c.allocate(run, total, hs, "")
	if !ok {
		t.Fatalf("allocate %d blocks failed (available %d)", total, c.available())
	}
	c.commit(blocks, hs, toks, "", len(run), len(hs))
	c.release(blocks)
	return run
}

func TestKVCacheStoreHitEvictOffload(t *testing.T) {
	c := newKVCache(16, 4, 2, true)
	a, ha := testPrompt(3, 1)    // 3 full blocks
	b, hb := testPrompt(3, 1000) // another 3
	run := serveOne(t, c, a, ha, 3)
	if len(run) != 0 {
		t.Fatalf("cold run = %v", run)
	}
	ev := c.takeEvents()
	if got := kinds(ev); !equalStrings(got, []string{"BlockStored/GPU"}) || len(ev[0].hashes) != 3 || ev[0].parent != nil || len(ev[0].tokens) != 48 {
		t.Fatalf("cold events = %v (hashes %d tokens %d)", got, len(ev[0].hashes), len(ev[0].tokens))
	}
	// Warm: at most (48-1)/16 = 2 blocks can hit (the last token is always computed).
	if run := serveOne(t, c, a, ha, 3); len(run) != 2 || run[0] != tierGPU || run[1] != tierGPU {
		t.Fatalf("warm run = %v", run)
	}
	c.takeEvents()
	// b needs 3 blocks; 1 is never used, 2 must be evicted (the LRU ones: a's tail first, as vLLM frees in reverse).
	serveOne(t, c, b, hb, 3)
	ev = c.takeEvents()
	want := []string{"BlockRemoved/GPU", "BlockStored/CPU", "BlockRemoved/GPU", "BlockStored/CPU", "BlockStored/GPU"}
	if got := kinds(ev); !equalStrings(got, want) {
		t.Fatalf("eviction events = %v, want %v", got, want)
	}
	// CPU events are self-describing: parent and the block's tokens.
	if ev[1].parent == nil || len(ev[1].tokens) != 16 || ev[1].placeholder {
		t.Fatalf("CPU store not self-describing: %+v", ev[1])
	}
	if c.offloadedBlocks != 2 {
		t.Fatalf("offloaded = %d", c.offloadedBlocks)
	}
	// a now: block 0 on GPU? The evicted ones were the least recently used.
	run = c.match(ha, 2)
	gpu, cpu := 0, 0
	for _, x := range run {
		if x == tierGPU {
			gpu++
		} else {
			cpu++
		}
	}
	if len(run) != 2 || cpu == 0 {
		t.Fatalf("match of a after eviction = %v", run)
	}
	// Reloading a's CPU blocks re-stores them on GPU.
	serveOne(t, c, a, ha, 3)
	if c.reloadedBlocks != uint64(cpu) {
		t.Fatalf("reloaded = %d, want %d", c.reloadedBlocks, cpu)
	}
}

func TestKVCachePinnedBlocksNotEvicted(t *testing.T) {
	c := newKVCache(16, 4, 0, true)
	a, ha := testPrompt(2, 1)
	run := c.match(ha, 1)
	blocks, ok := c.allocate(run, 4, ha, "")
	if !ok {
		t.Fatal("first allocation failed")
	}
	c.commit(blocks, ha, a, "", 0, 2)
	if c.usage() != 1 {
		t.Fatalf("usage = %v, want 1", c.usage())
	}
	b, hb := testPrompt(1, 500)
	if _, ok := c.allocate(nil, 1, hb, ""); ok {
		t.Fatal("allocation succeeded while every block is pinned")
	}
	// A second request sharing a's blocks only needs its fresh ones.
	run = c.match(ha, 1)
	if len(run) != 1 {
		t.Fatalf("shared prefix run = %v", run)
	}
	c.release(blocks)
	if c.usage() != 0 {
		t.Fatalf("usage after release = %v", c.usage())
	}
	c.takeEvents()
	if _, ok := c.allocate(nil, 4, hb, ""); !ok {
		t.Fatal("allocation failed after release")
	}
	if got := kinds(c.takeEvents()); !equalStrings(got, []string{"BlockRemoved/GPU", "BlockRemoved/GPU"}) {
		t.Fatalf("events = %v", got)
	}
	_ = b
}

func TestKVCachePlaceholderAndCPUEviction(t *testing.T) {
	c := newKVCache(16, 1, 1, false)
	a, ha := testPrompt(1, 1)
	b, hb := testPrompt(1, 100)
	d, hd := testPrompt(1, 200)
	serveOne(t, c, append(a, 0), ha, 1)
	serveOne(t, c, append(b, 0), hb, 1)
	serveOne(t, c, append(d, 0), hd, 1)
	ev := c.takeEvents()
	want := []string{"BlockStored/GPU", "BlockRemoved/GPU", "BlockStored/CPU", "BlockStored/GPU",
		"BlockRemoved/GPU", "BlockRemoved/CPU", "BlockStored/CPU", "BlockStored/GPU"}
	if got := kinds(ev); !equalStrings(got, want) {
		t.Fatalf("events = %v, want %v", got, want)
	}
	if !ev[2].placeholder || ev[2].tokens != nil || ev[2].hashes[0] != ha[0] {
		t.Fatalf("CPU store = %+v, want a token-less placeholder of a's block", ev[2])
	}
	if ev[5].hashes[0] != ha[0] {
		t.Fatal("CPU tier evicted the wrong block")
	}
	c.reset()
	if g, cpu := c.cachedBlocks(); g != 0 || cpu != 0 {
		t.Fatalf("after reset: gpu %d cpu %d", g, cpu)
	}
	if got := kinds(c.takeEvents()); !equalStrings(got, []string{"AllBlocksCleared/GPU"}) {
		t.Fatalf("reset events = %v", got)
	}
}
