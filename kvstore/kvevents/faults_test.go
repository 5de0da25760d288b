package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// Issue #11's reproductions at the ingester, over a real libzmq publisher (testdata/pypub.py).

// storeChain returns a batch storing toks (a whole number of 16-token blocks) as one chain from block 0.
func storeChain(t *testing.T, toks []uint32) []byte {
	hs, _ := engineHashes(t, toks, kvstore.ExtraKeys{})
	return mustEncode(t, batch(BlockStored{BlockHashes: hs, TokenIDs: toks, BlockSize: 16, Medium: "GPU"}), LayoutMap, HashUint)
}

// startIngester starts an Ingester on p (with replay) into idx.
func startIngester(t *testing.T, p *pypub, idx kvstore.Index, mod func(*IngesterConfig)) *Ingester {
	t.Helper()
	cfg := IngesterConfig{Endpoint: "e0", Model: testModel, EventsAddr: p.addr(p.pubPort), ReplayAddr: p.addr(p.routerPort),
		BlockSize: 16, Hasher: kvstore.Hasher{Seed: 7}, Index: idx, BackoffMin: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	ing, err := NewIngester(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ing.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ing.Close() })
	return ing
}

// TestIngestTakeoverKeepsHeldBlocks (#11 item 1): a 45-block prefix P stored at seq 0, then many other
// batches, so the publisher's replay buffer (buffer_steps 50) no longer reaches seq 0. The first ingester
// stops (its gateway died) and a second one takes over on the same shared Redis index: on its first message
// it must not clear P, which the engine still holds. Before the fix P scored 0 after the takeover.
func TestIngestTakeoverKeepsHeldBlocks(t *testing.T) {
	rs := redistest.Start(t)
	idx, err := kvstore.NewRedisIndex(rs.Client(t), kvstore.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	p := startPub(t, 0, 0)
	p.do("bufsteps 50")
	a := startIngester(t, p, idx, nil)
	p.wait(p.sub, "subscription")
	prefix := tokens(1, 45*16)
	p.pub(0, storeChain(t, prefix))
	const others = 120
	for i := 1; i <= others; i++ {
		p.pub(uint64(i), storeChain(t, tokens(100_000+i*100, 32)))
	}
	waitStats(t, a, "the first ingester's batches", seqIs(others))
	if g, _ := match(t, idx, prefix, kvstore.ExtraKeys{}); g != 45 {
		t.Fatalf("before the takeover P scores %d blocks, want 45", g)
	}
	_ = a.Close()

	b := startIngester(t, p, idx, nil)
	// The publisher's XPUB may not report a resubscription to the same topic, so publish until the new
	// ingester has applied a message (earlier ones are lost to ZMQ's slow joiner, and replayed).
	seq := uint64(others)
	deadline := time.Now().Add(10 * time.Second)
	for !b.Stats().HaveSeq {
		if time.Now().After(deadline) {
			t.Fatal("the new ingester never applied a message")
		}
		seq++
		p.pub(seq, storeChain(t, tokens(900_000+int(seq)*100, 16)))
		time.Sleep(30 * time.Millisecond)
	}
	s := waitStats(t, b, "the new ingester's messages", seqIs(seq))
	if g, _ := match(t, idx, prefix, kvstore.ExtraKeys{}); g != 45 {
		t.Fatalf("after the takeover P scores %d blocks, want 45 (the engine still holds it); stats %+v", g, s)
	}
	// The buffered history (the last 50 batches) was applied, confirmed; the older ones are unconfirmed.
	if g, _ := match(t, idx, tokens(100_000+others*100, 32), kvstore.ExtraKeys{}); g != 2 {
		t.Fatalf("a replayed batch scores %d, want 2", g)
	}
	if s.CatchUps != 1 || s.Demotions != 1 || s.Clears != 0 || !s.Resyncing {
		t.Fatalf("stats %+v", s)
	}
}

// TestIngestSlowReplayKeepsEntries (#11 item 1): a gap whose replay takes longer than the base replay
// timeout (150 batches, 3 ms each at the publisher) is still replayed, since the timeout grows with the
// backlog; an unrelated prefix stays and a child of a block from before the gap is applied. Before the fix
// the replay timed out, the endpoint was cleared (the prefix went 2 → 0) and the child was an orphan.
func TestIngestSlowReplayKeepsEntries(t *testing.T) {
	p := startPub(t, 0, 0)
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
	ing := startIngester(t, p, idx, func(c *IngesterConfig) { c.ReplayTimeout = 300 * time.Millisecond })
	p.wait(p.sub, "subscription")
	unrelated, parent := tokens(1, 32), tokens(5000, 48)
	p.pub(0, storeChain(t, unrelated))
	p.pub(1, storeChain(t, parent[:32]))
	waitStats(t, ing, "seq 1", seqIs(1))
	const lost = 150
	for i := uint64(2); i < 2+lost; i++ {
		p.lose(i, storeChain(t, tokens(200_000+int(i)*100, 16)))
	}
	p.do("replaydelay 3")
	p.pub(2+lost, storeChild(t, parent, 2))
	s := waitStats(t, ing, "the replay", seqIs(2+lost))
	if s.Replays != 1 || s.ReplayFailures != 0 || s.Demotions != 0 {
		t.Fatalf("stats %+v", s)
	}
	if g, _ := match(t, idx, unrelated, kvstore.ExtraKeys{}); g != 2 {
		t.Fatalf("unrelated prefix %d blocks, want 2", g)
	}
	if g, _ := match(t, idx, parent, kvstore.ExtraKeys{}); g != 3 {
		t.Fatalf("parent chain %d blocks, want 3 (the child of a pre-gap block applied)", g)
	}
}

// TestIngestUnseenRestart (#11 item 3): the old engine published seq 0..11; a new process on the same ports
// published seq 0..40 before the subscriber reconnected. The sequence never went backwards as far as the
// subscriber saw, but the engine's instance (its start time, through IngesterConfig.Instance) changed: the
// old chain is dropped and the new history is replayed from 0. Before the fix the old chain stayed and the
// new one was applied as a continuation with unknown parents (0 blocks).
func TestIngestUnseenRestart(t *testing.T) {
	p := startPub(t, 0, 0)
	var mu sync.Mutex
	inst := "start-1"
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
	ing := startIngester(t, p, idx, func(c *IngesterConfig) {
		c.Instance = func(context.Context) (string, error) { mu.Lock(); defer mu.Unlock(); return inst, nil }
	})
	p.wait(p.sub, "subscription")
	old := tokens(1, 10*16)
	hs, _ := engineHashes(t, old, kvstore.ExtraKeys{})
	p.pub(0, storeChain(t, old[:16]))
	for i := 1; i < 10; i++ {
		p.pub(uint64(i), storeChild(t, old, i))
	}
	p.pub(10, mustEncode(t, batch(BlockRemoved{BlockHashes: []EngineHash{hs[9] + 1}, Medium: "GPU"}), LayoutMap, HashUint))
	p.pub(11, mustEncode(t, batch(), LayoutMap, HashUint))
	waitStats(t, ing, "seq 11", seqIs(11))
	if g, _ := match(t, idx, old, kvstore.ExtraKeys{}); g != 10 {
		t.Fatalf("old chain %d blocks, want 10", g)
	}
	pub, router := p.pubPort, p.routerPort
	p.stop()
	mu.Lock()
	inst = "start-2"
	mu.Unlock()
	q := startPub(t, pub, router)
	fresh := tokens(7000, 41*16)
	q.lose(0, storeChain(t, fresh[:16]))
	for i := 1; i <= 40; i++ {
		q.lose(uint64(i), storeChild(t, fresh, i))
	}
	q.wait(q.sub, "the subscriber reconnecting")
	q.pub(41, mustEncode(t, batch(), LayoutMap, HashUint))
	s := waitStats(t, ing, "seq 41 of the new engine", seqIs(41))
	if g, _ := match(t, idx, old, kvstore.ExtraKeys{}); g != 0 {
		t.Fatalf("the old engine's chain kept: %d blocks; stats %+v", g, s)
	}
	if g, _ := match(t, idx, fresh, kvstore.ExtraKeys{}); g != 41 {
		t.Fatalf("the new engine's chain %d blocks, want 41; stats %+v", g, s)
	}
	if s.Restarts != 1 || s.Orphans != 0 || s.Resyncing {
		t.Fatalf("stats %+v", s)
	}
}

// TestIngestNoteInstanceDropsAtOnce (#11 item 3): an engine killed and restarted with an empty cache says
// nothing on its event stream until it stores something; the gateway's health/metrics probe sees its new
// start time, and NoteInstance drops the endpoint's entries at once. Before the fix the index kept them.
func TestIngestNoteInstanceDropsAtOnce(t *testing.T) {
	p := startPub(t, 0, 0)
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
	ing := startIngester(t, p, idx, nil)
	ing.NoteInstance("100.25")
	p.wait(p.sub, "subscription")
	toks := tokens(1, 150*16)
	p.pub(0, storeChain(t, toks))
	waitStats(t, ing, "seq 0", seqIs(0))
	ing.NoteInstance("100.25") // the same instance: nothing happens
	// The run goroutine takes the note from instCh and applies it before it handles a later message: once
	// the note is taken, the next batch applied means the note was.
	waitCond(t, "the run goroutine took the note", func() bool { return len(ing.instCh) == 0 })
	p.pub(1, storeChain(t, tokens(500_000, 16)))
	if s := waitStats(t, ing, "seq 1, after the note", seqIs(1)); s.Restarts != 0 {
		t.Fatalf("the same instance noted again counted as a restart: %+v", s)
	}
	if g, _ := match(t, idx, toks, kvstore.ExtraKeys{}); g != 150 {
		t.Fatalf("%d blocks, want 150", g)
	}
	ing.NoteInstance("2000.5")
	deadline := time.Now().Add(5 * time.Second)
	for {
		g, _ := match(t, idx, toks, kvstore.ExtraKeys{})
		if g == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a restarted engine still scores %d blocks", g)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if s := ing.Stats(); s.Restarts != 1 || s.HaveSeq {
		t.Fatalf("stats %+v", s)
	}
}

// TestIngestCorruptBatchReplayed (#11 item 7): a batch that arrives undecodable is fetched again through
// replay; before the fix its events were dropped.
func TestIngestCorruptBatchReplayed(t *testing.T) {
	p := startPub(t, 0, 0)
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
	ing := startIngester(t, p, idx, nil)
	p.wait(p.sub, "subscription")
	toks := tokens(1, 48)
	p.pub(0, storeChain(t, toks[:16]))
	waitStats(t, ing, "seq 0", seqIs(0))
	good := storeChild(t, toks, 1)
	p.lose(1, good) // the engine's buffer holds the good copy
	var seq8 [8]byte
	binary.BigEndian.PutUint64(seq8[:], 1)
	bad := append([]byte{}, good[:len(good)/2]...)
	p.do(fmt.Sprintf("raw %x %x %x", "kv@test", seq8[:], bad))
	s := waitStats(t, ing, "seq 1", seqIs(1))
	if g, _ := match(t, idx, toks, kvstore.ExtraKeys{}); g != 2 {
		t.Fatalf("%d blocks, want 2 (the corrupt batch recovered); stats %+v", g, s)
	}
	if s.DecodeErrors != 1 || s.CorruptReplays != 1 || s.RecoveredBatches != 1 || s.Demotions != 0 {
		t.Fatalf("stats %+v", s)
	}
	p.pub(2, storeChild(t, toks, 2))
	s = waitStats(t, ing, "seq 2", seqIs(2))
	if g, _ := match(t, idx, toks, kvstore.ExtraKeys{}); g != 3 || s.Duplicates != 0 || s.Gaps != 0 {
		t.Fatalf("%d blocks after seq 2; stats %+v", g, s)
	}
}

// TestIngestAbsurdTimestamps (#11 item 7): a batch timestamp of inf, NaN or -1e300 is counted and leaves
// the lag as it was; before the fix the lag gauge read 9.2e9 s.
func TestIngestAbsurdTimestamps(t *testing.T) {
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
	now := time.Unix(1_800_000_000, 0)
	ing, err := NewIngester(IngesterConfig{Endpoint: "e0", Model: testModel, BlockSize: 16, Hasher: kvstore.Hasher{Seed: 7},
		Index: idx, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ing.handle(ctx, 0, mustEncode(t, EventBatch{TS: float64(now.Unix()) - 0.25}, LayoutMap, HashUint))
	near := func(l time.Duration) bool { return l > 249*time.Millisecond && l < 251*time.Millisecond }
	if l := ing.Stats().Lag; !near(l) {
		t.Fatalf("lag %v, want 250ms", l)
	}
	for i, ts := range []float64{math.Inf(1), math.Inf(-1), math.NaN(), -1e300, 1e300} {
		ing.handle(ctx, uint64(i+1), mustEncode(t, EventBatch{TS: ts}, LayoutMap, HashUint))
	}
	s := ing.Stats()
	if !near(s.Lag) || s.BadTimestamps != 5 || s.Batches != 6 {
		t.Fatalf("stats %+v", s)
	}
}

// TestIngestConfigErrorClears (#11 item 7): one bad event ("engine block size 0") sets ConfigError; the
// next BlockStored that agrees with the configuration clears it. Before the fix it stuck for good.
func TestIngestConfigErrorClears(t *testing.T) {
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
	ing, err := NewIngester(IngesterConfig{Endpoint: "e0", Model: testModel, BlockSize: 16, Hasher: kvstore.Hasher{Seed: 7}, Index: idx})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	toks := tokens(1, 32)
	hs, _ := engineHashes(t, toks, kvstore.ExtraKeys{})
	ing.handle(ctx, 0, mustEncode(t, batch(BlockStored{BlockHashes: hs[:1], TokenIDs: toks[:16], BlockSize: 0, Medium: "GPU"}), LayoutMap, HashUint))
	if s := ing.Stats(); s.ConfigError == "" || s.BlockSizeErrors != 1 {
		t.Fatalf("stats %+v", s)
	}
	ing.handle(ctx, 1, storeChain(t, toks))
	if s := ing.Stats(); s.ConfigError != "" || s.BlockSizeErrors != 1 {
		t.Fatalf("config error kept after good events: %+v", s)
	}
	if g, _ := match(t, idx, toks, kvstore.ExtraKeys{}); g != 2 {
		t.Fatalf("%d blocks", g)
	}
}

// adjacentPorts returns a free TCP port p on 127.0.0.1 whose successor p+1 is free too.
func adjacentPorts(t *testing.T) int {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l2, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1))
		l.Close()
		if err == nil {
			l2.Close()
			return p
		}
	}
	t.Fatal("no two adjacent free ports")
	return 0
}

// TestIngestDataParallelRanks (#11 item 2): an engine with two data-parallel ranks, each publishing on its
// own port (vLLM: port + rank) with its own sequence, through real libzmq publishers. The Ingester keeps a
// sequence and entries per rank. The events: E(0,dp0) Stored(H), E(0,dp1) Stored(H), E(1,dp1)
// Removed(H) must leave rank 0 holding H; then interleaved per-rank chains (6 batches each) must all be
// indexed, with no restart. Before the fix ranks were one engine: rank 1's seq 0 looked like a restart, H
// was removed for both, and interleaved sequences left 1 of 12 blocks indexed.
func TestIngestDataParallelRanks(t *testing.T) {
	pub, router := adjacentPorts(t), adjacentPorts(t)
	p0, p1 := startPub(t, pub, router), startPub(t, pub+1, router+1)
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
	cfg := IngesterConfig{Endpoint: "e0", Model: testModel, EventsAddr: p0.addr(pub), ReplayAddr: p0.addr(router),
		BlockSize: 16, Hasher: kvstore.Hasher{Seed: 7}, Index: idx, BackoffMin: 20 * time.Millisecond, DataParallelSize: 2}
	ing, err := NewIngester(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ing.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ing.Close() })
	p0.wait(p0.sub, "rank 0 subscription")
	p1.wait(p1.sub, "rank 1 subscription")
	rankBatch := func(r int, evs ...Event) []byte {
		b := batch(evs...)
		b.DataParallelRank = &r
		return mustEncode(t, b, LayoutArrayLast, HashUint)
	}
	h := tokens(1, 32)
	hs, _ := engineHashes(t, h, kvstore.ExtraKeys{})
	stored := BlockStored{BlockHashes: hs, TokenIDs: h, BlockSize: 16, Medium: "GPU"}
	p0.pub(0, rankBatch(0, stored))
	p1.pub(0, rankBatch(1, stored))
	p1.pub(1, rankBatch(1, BlockRemoved{BlockHashes: hs, Medium: "GPU"}))
	rankSeq := func(r int, seq uint64) func() bool {
		return func() bool {
			rs := ing.RankStats()
			return rs[r].HaveSeq && rs[r].LastSeq == seq
		}
	}
	waitCond(t, "rank 0 seq 0 and rank 1 seq 1", func() bool { return rankSeq(0, 0)() && rankSeq(1, 1)() })
	byEp := func(toks []uint32) map[kvstore.EndpointID]int {
		ms, err := idx.Match(context.Background(), testModel, kvstore.Hasher{Seed: 7}.Keys(toks, 16, kvstore.ExtraKeys{}))
		if err != nil {
			t.Fatal(err)
		}
		out := map[kvstore.EndpointID]int{}
		for _, m := range ms {
			out[m.Endpoint] = m.GPUBlocks
		}
		return out
	}
	if got := byEp(h); got["e0/dp0"] != 2 || got["e0/dp1"] != 0 || len(got) != 1 {
		t.Fatalf("H held by %v, want rank 0 only (2 blocks)", got)
	}
	// Interleaved per-rank chains.
	a, b := tokens(1000, 6*16), tokens(5000, 6*16)
	ah, _ := engineHashes(t, a, kvstore.ExtraKeys{})
	bh, _ := engineHashes(t, b, kvstore.ExtraKeys{})
	block := func(toks []uint32, hs []EngineHash, i int) BlockStored {
		e := BlockStored{BlockHashes: hs[i : i+1], TokenIDs: toks[16*i : 16*i+16], BlockSize: 16, Medium: "GPU"}
		if i > 0 {
			e.ParentBlockHash = &hs[i-1]
		}
		return e
	}
	for i := range 6 {
		p0.pub(uint64(1+i), rankBatch(0, block(a, ah, i)))
		p1.pub(uint64(2+i), rankBatch(1, block(b, bh, i)))
	}
	waitCond(t, "both chains", func() bool { return rankSeq(0, 6)() && rankSeq(1, 7)() })
	if got := byEp(a); got["e0/dp0"] != 6 || len(got) != 1 {
		t.Fatalf("chain A on %v, want 6 blocks on rank 0", got)
	}
	if got := byEp(b); got["e0/dp1"] != 6 || len(got) != 1 {
		t.Fatalf("chain B on %v, want 6 blocks on rank 1", got)
	}
	for r, s := range ing.RankStats() {
		if s.Restarts != 0 || s.Gaps != 0 || s.Clears != 1 || s.Endpoint != RankEndpoint("e0", r) {
			t.Fatalf("rank %d stats %+v", r, s)
		}
	}
}

func waitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestIngestHashCapEvicts (#11 item 6): an engine floods 100 chains of 16 blocks (1,600 distinct engine
// hashes, no removals) past a map cap of 256, over a real libzmq publisher, into a memory and a real Redis
// index. The map stays within its cap; every evicted hash's block leaves the index with it, so the index
// holds exactly the blocks the map holds; a later BlockRemoved of an evicted hash is an unknown removal
// that touches nothing else; a later child of an evicted parent is an orphan (not indexed), while a child
// of a mapped block is indexed. Before the cap the map held all 1,600.
func TestIngestHashCapEvicts(t *testing.T) {
	for _, backend := range []string{"memory", "redis"} {
		t.Run(backend, func(t *testing.T) {
			var idx kvstore.Index = kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
			if backend == "redis" {
				rs := redistest.Start(t)
				ri, err := kvstore.NewRedisIndex(rs.Client(t), kvstore.RedisConfig{})
				if err != nil {
					t.Fatal(err)
				}
				idx = ri
			}
			testHashCap(t, idx)
		})
	}
}

func testHashCap(t *testing.T, idx kvstore.Index) {
	const limit, chains, perChain = 256, 100, 16
	p := startPub(t, 0, 0)
	ing := startIngester(t, p, idx, func(c *IngesterConfig) { c.MaxHashes, c.RemovedMemory = limit, 8 })
	p.wait(p.sub, "subscription")
	h := kvstore.Hasher{Seed: 7}
	type block struct {
		eh  EngineHash
		key kvstore.BlockKey
	}
	var blocks []block
	for c := range chains {
		toks := tokens(1+c*10_000, perChain*16)
		hs, _ := engineHashes(t, toks, kvstore.ExtraKeys{})
		for i, k := range h.Keys(toks, 16, kvstore.ExtraKeys{}) {
			blocks = append(blocks, block{hs[i], k})
		}
		p.pub(uint64(c), storeChain(t, toks))
	}
	s := waitStats(t, ing, "the flood", seqIs(chains-1))
	held := func(k kvstore.BlockKey) bool {
		ms, err := idx.Match(context.Background(), testModel, []kvstore.BlockKey{k})
		if err != nil {
			t.Fatal(err)
		}
		return len(ms) == 1 && ms[0].Endpoint == "e0"
	}
	var in, out []block
	for _, b := range blocks {
		if held(b.key) {
			in = append(in, b)
		} else {
			out = append(out, b)
		}
	}
	if s.MappedHashes > limit || s.MappedHashes < limit-perChain || s.HashEvictions != uint64(len(blocks)-s.MappedHashes) {
		t.Fatalf("mapped %d (cap %d), evictions %d of %d blocks", s.MappedHashes, limit, s.HashEvictions, len(blocks))
	}
	if len(in) != s.MappedHashes {
		t.Fatalf("the index holds %d of the blocks, the map %d", len(in), s.MappedHashes)
	}

	// A removal of an evicted hash and of a mapped one; children of an evicted and of a mapped block.
	gone, kept, parent := out[0], in[0], in[len(in)-1]
	p.pub(chains, mustEncode(t, batch(BlockRemoved{BlockHashes: []EngineHash{gone.eh, kept.eh}, Medium: "GPU"}), LayoutMap, HashUint))
	childToks := tokens(9_000_000, 16)
	orphan := BlockStored{BlockHashes: []EngineHash{1<<62 + 1}, ParentBlockHash: &gone.eh, TokenIDs: childToks, BlockSize: 16, Medium: "GPU"}
	child := BlockStored{BlockHashes: []EngineHash{1<<62 + 2}, ParentBlockHash: &parent.eh, TokenIDs: childToks, BlockSize: 16, Medium: "GPU"}
	p.pub(chains+1, mustEncode(t, batch(orphan, child), LayoutMap, HashUint))
	s2 := waitStats(t, ing, "removals and children", seqIs(chains+1))
	if s2.UnknownRemoved != s.UnknownRemoved+1 || s2.Orphans != s.Orphans+1 {
		t.Fatalf("after the removals: unknown removed %d → %d, orphans %d → %d", s.UnknownRemoved, s2.UnknownRemoved, s.Orphans, s2.Orphans)
	}
	orphanKey := h.AppendKeysAfter(nil, gone.key, childToks, 16, kvstore.ExtraKeys{})[0]
	childKey := h.AppendKeysAfter(nil, parent.key, childToks, 16, kvstore.ExtraKeys{})[0]
	if held(kept.key) || held(orphanKey) || !held(childKey) {
		t.Fatalf("removed mapped block held %v, orphan held %v, child of a mapped block held %v", held(kept.key), held(orphanKey), held(childKey))
	}
	// Stop the ingester (its goroutine owns the map) and compare map and index block by block.
	_ = ing.Close()
	blocks = append(blocks, block{1<<62 + 1, orphanKey}, block{1<<62 + 2, childKey})
	mapped := 0
	for _, b := range blocks {
		e := ing.hashes.get(b.eh)
		inMap := e != nil && e.refs[kvstore.TierGPU] > 0
		if inMap {
			mapped++
		}
		if inMap != held(b.key) {
			t.Fatalf("block %x: held in the map %v, in the index %v", b.key, inMap, held(b.key))
		}
	}
	if mapped < limit-perChain-1 {
		t.Fatalf("only %d blocks held after the flood", mapped)
	}
}
