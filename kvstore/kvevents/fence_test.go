package kvevents

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// gateIndex holds back Apply calls while closed, as if the ingester's process were paused mid-write: each
// value sent on pass lets one held-back call through, and its result comes back on results.
type gateIndex struct {
	kvstore.FencedIndex
	closed  atomic.Bool
	blocked chan struct{}
	pass    chan struct{}
	results chan error
}

func newGate(idx kvstore.FencedIndex) *gateIndex {
	return &gateIndex{FencedIndex: idx, blocked: make(chan struct{}, 16), pass: make(chan struct{}), results: make(chan error, 16)}
}

func (g *gateIndex) Apply(ctx context.Context, model string, us []kvstore.Update) error {
	if !g.closed.Load() {
		return g.FencedIndex.Apply(ctx, model, us)
	}
	g.blocked <- struct{}{}
	select {
	case <-g.pass:
	case <-ctx.Done():
		return ctx.Err()
	}
	err := g.FencedIndex.Apply(ctx, model, us)
	g.results <- err
	return err
}

// TestIngestStaleIngesterFenced (#12 item 5), on a real redis-server with real Redis leases and two
// ingesters of one endpoint: ingester A holds the lease, then is held back in the middle of writing the
// engine's BlockStored of Y (a paused process); its lease expires and B takes the endpoint over (new token,
// fence raised), and the engine then clears its cache (AllBlocksCleared, applied by B). When A's write of Y
// finally reaches Redis it must be refused (kvstore.ErrFenced) and A must stop: the index shows only B's
// writes. Without the fence, A's write lands after B's clear and the index says e0 holds Y, which the
// engine dropped (and B, which never saw Y's hash, could never remove it).
// It runs on the index's upgrade window (layout-1 scripts fenced inside, layout 2 fenced per batch) and on
// layout 2 alone.
func TestIngestStaleIngesterFenced(t *testing.T) {
	for _, layout := range []int{0, 2} {
		t.Run(fmt.Sprintf("layout%d", layout), func(t *testing.T) { staleIngesterFenced(t, layout) })
	}
}

func staleIngesterFenced(t *testing.T, layout int) {
	rs := redistest.Start(t)
	c := rs.Client(t)
	idx, err := kvstore.NewRedisIndex(c, kvstore.RedisConfig{IndexLayout: layout})
	if err != nil {
		t.Fatal(err)
	}
	leases, err := kvstore.NewRedisBlobs(c, kvstore.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const lease = "ingest:m/e0"
	take := func(holder string) kvstore.FencedIndex {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			tok, ok, err := leases.AcquireLease(ctx, lease, holder, 300*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				f := kvstore.Fence{Scope: "e0", Token: tok}
				if err := idx.RaiseFence(ctx, testModel, f); err != nil {
					t.Fatal(err)
				}
				return idx.Fenced(f)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never got the lease", holder)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	p := startPub(t, 0, 0)
	gate := newGate(take("A"))
	a := startIngester(t, p, gate, func(c *IngesterConfig) { c.ReplayAddr = "" })
	p.wait(p.sub, "subscription")
	x, y, z := tokens(1, 32), tokens(10_000, 32), tokens(20_000, 16)
	p.pub(0, storeChain(t, x))
	waitStats(t, a, "A's first batch", seqIs(0))
	if g, _ := match(t, idx, x, kvstore.ExtraKeys{}); g != 2 {
		t.Fatalf("X scores %d, want 2", g)
	}

	gate.closed.Store(true)
	p.pub(1, storeChain(t, y))
	select {
	case <-gate.blocked:
	case <-time.After(5 * time.Second):
		t.Fatal("A never tried to write Y")
	}

	// A's lease expires while it is held back; B takes over.
	b := startIngester(t, p, take("B"), func(c *IngesterConfig) { c.ReplayAddr = "" })
	seq := uint64(1)
	deadline := time.Now().Add(10 * time.Second)
	for !b.Stats().HaveSeq { // ZMQ's slow joiner: publish until B has a message
		if time.Now().After(deadline) {
			t.Fatal("B never applied a message")
		}
		seq++
		p.pub(seq, storeChain(t, tokens(500_000+int(seq)*100, 16)))
		time.Sleep(30 * time.Millisecond)
	}
	seq++
	p.pub(seq, mustEncode(t, batch(AllBlocksCleared{}), LayoutMap, HashUint))
	waitStats(t, b, "B's clear", seqIs(seq))
	if g, _ := match(t, idx, x, kvstore.ExtraKeys{}); g != 0 {
		t.Fatalf("after the engine's clear X scores %d, want 0", g)
	}

	// A wakes up and its write of Y reaches Redis.
	gate.pass <- struct{}{}
	if err := <-gate.results; !errors.Is(err, kvstore.ErrFenced) {
		t.Fatalf("A's stale write: %v, want kvstore.ErrFenced", err)
	}
	if g, _ := match(t, idx, y, kvstore.ExtraKeys{}); g != 0 {
		t.Fatalf("Y scores %d after A's stale write, want 0 (the engine cleared it)", g)
	}
	sa := waitStats(t, a, "A fenced off", func(s Stats) bool { return s.Fenced && !s.Connected })
	gate.closed.Store(false)

	seq++
	p.pub(seq, storeChain(t, z))
	sb := waitStats(t, b, "B's next batch", seqIs(seq))
	if g, _ := match(t, idx, z, kvstore.ExtraKeys{}); g != 1 {
		t.Fatalf("Z (B's write) scores %d, want 1", g)
	}
	if g, _ := match(t, idx, y, kvstore.ExtraKeys{}); g != 0 {
		t.Fatalf("Y scores %d, want 0", g)
	}
	// The event: A's run goroutine has returned (a fenced ingester stops), so it can apply nothing more.
	select {
	case <-a.done:
	case <-time.After(5 * time.Second):
		t.Fatalf("A still runs 5 s after it was fenced off: %+v", a.Stats())
	}
	if s := a.Stats(); s.LastSeq != 1 || s.Batches != sa.Batches || s.Blocks != 2 || !s.Fenced {
		t.Fatalf("A went on after it was fenced off: %+v", s)
	}
	if sb.Fenced || sb.IndexErrors != 0 {
		t.Fatalf("B: %+v", sb)
	}
}

// faultIndex is a memory index whose next fail Apply calls fail with an injected error.
type faultIndex struct {
	*kvstore.MemoryIndex
	fail  atomic.Int32
	calls atomic.Int32
}

var errInjected = errors.New("injected index fault")

func (f *faultIndex) Apply(ctx context.Context, model string, us []kvstore.Update) error {
	f.calls.Add(1)
	if f.fail.Add(-1) >= 0 {
		return errInjected
	}
	return f.MemoryIndex.Apply(ctx, model, us)
}

// syncBuffer is a log sink safe for the ingester's goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestIngestFailedWriteResyncs (#12 item 5): a batch whose index write fails (a fault injected into the
// memory index: the batch's Apply and the first resync attempts fail) makes the endpoint resync: logged
// once with the cause, then retried with backoff: the failed updates are sent again, in order, so the
// index holds what the engine holds (Y, and X without the block the failed batch removed). Before the
// change the failure was only counted: Y never reached the index.
func TestIngestFailedWriteResyncs(t *testing.T) {
	p := startPub(t, 0, 0)
	idx := &faultIndex{MemoryIndex: kvstore.NewMemoryIndex(kvstore.MemoryConfig{})}
	logs := &syncBuffer{}
	const ttl = 400 * time.Millisecond
	ing := startIngester(t, p, idx, func(c *IngesterConfig) {
		c.ReplayAddr = ""
		c.UnconfirmedTTL = ttl
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	p.wait(p.sub, "subscription")
	x, y := tokens(1, 48), tokens(10_000, 32)
	hx, _ := engineHashes(t, x, kvstore.ExtraKeys{})
	p.pub(0, storeChain(t, x))
	waitStats(t, ing, "the first batch", seqIs(0))

	idx.fail.Store(3) // the batch and two resync attempts
	hy, _ := engineHashes(t, y, kvstore.ExtraKeys{})
	p.pub(1, mustEncode(t, batch(BlockStored{BlockHashes: hy, TokenIDs: y, BlockSize: 16, Medium: "GPU"},
		BlockRemoved{BlockHashes: hx[2:], Medium: "GPU"}), LayoutMap, HashUint))
	s := waitStats(t, ing, "the resync", func(s Stats) bool { return s.Resyncs == 1 && !s.ResyncPending })
	if s.IndexErrors != 3 || s.LastSeq != 1 {
		t.Fatalf("stats %+v", s)
	}
	if g, _ := match(t, idx, y, kvstore.ExtraKeys{}); g != 2 {
		t.Fatalf("after the resync Y scores %d, want 2", g)
	}
	if g, _ := match(t, idx, x, kvstore.ExtraKeys{}); g != 2 {
		t.Fatalf("after the resync X scores %d, want 2 (the engine removed block 2)", g)
	}
	if n := strings.Count(logs.String(), "index write failed"); n != 1 || !strings.Contains(logs.String(), errInjected.Error()) {
		t.Fatalf("%d failure reports (want 1, with the cause); log:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "resynced") {
		t.Fatalf("no resync report; log:\n%s", logs.String())
	}
	time.Sleep(ttl + 150*time.Millisecond)
	// Converged to what the engine holds, confirmed (nothing was demoted): X's first two blocks, all of Y.
	if g, _ := match(t, idx, x, kvstore.ExtraKeys{}); g != 2 {
		t.Fatalf("after the TTL X scores %d, want 2 (the engine removed block 2)", g)
	}
	if g, _ := match(t, idx, y, kvstore.ExtraKeys{}); g != 2 {
		t.Fatalf("after the TTL Y scores %d, want 2", g)
	}
	// Later batches apply as usual.
	p.pub(2, storeChain(t, tokens(30_000, 16)))
	waitStats(t, ing, "a later batch", seqIs(2))
	if g, _ := match(t, idx, tokens(30_000, 16), kvstore.ExtraKeys{}); g != 1 {
		t.Fatalf("a later batch scores %d, want 1", g)
	}
}

// TestIngestRedisDownResyncs (#12 item 5): a real redis-server killed while a batch is written, then
// started again empty (no persistence): the write fails, and once Redis answers the endpoint resyncs on its
// own (no further event needed) and the index holds the failed batch. Before the change the failure was only counted and the index stayed empty for
// the endpoint until the engine announced the blocks again.
func TestIngestRedisDownResyncs(t *testing.T) {
	rs := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: rs.Addr, ReadTimeout: 150 * time.Millisecond, WriteTimeout: 150 * time.Millisecond,
		DialTimeout: 150 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	ri, err := kvstore.NewRedisIndex(c, kvstore.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	f := kvstore.Fence{Scope: "e0", Token: 1}
	if err := ri.RaiseFence(context.Background(), testModel, f); err != nil {
		t.Fatal(err)
	}
	p := startPub(t, 0, 0)
	ing := startIngester(t, p, ri.Fenced(f), func(c *IngesterConfig) { c.ReplayAddr = "" })
	p.wait(p.sub, "subscription")
	x, y := tokens(1, 32), tokens(10_000, 48)
	p.pub(0, storeChain(t, x))
	waitStats(t, ing, "the first batch", seqIs(0))
	rs.Stop()
	p.pub(1, storeChain(t, y))
	waitStats(t, ing, "the failed write", func(s Stats) bool { return s.ResyncPending && s.IndexErrors > 0 })
	rs.Restart() // empty
	s := waitStats(t, ing, "the resync", func(s Stats) bool { return s.Resyncs == 1 && !s.ResyncPending })
	if g, _ := match(t, ri, y, kvstore.ExtraKeys{}); g != 3 {
		t.Fatalf("after the resync Y scores %d, want 3; stats %+v", g, s)
	}
	// X was written before the outage and went with the empty restart: the resync sends what failed
	// (re-seeding an empty store is not ingestion's job; the engine's later events rebuild it).
	if s.Fenced {
		t.Fatalf("stats %+v", s)
	}
}
