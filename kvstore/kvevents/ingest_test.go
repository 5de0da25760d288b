package kvevents

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/cmd/enginesim/vllmhash"
	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
	"github.com/kvgate/kvgate/kvstore/testenv"
)

// pypub drives testdata/pypub.py, a pyzmq (libzmq) publisher with vLLM's frames and replay ROUTER.
type pypub struct {
	t                   *testing.T
	cmd                 *exec.Cmd
	stdin               io.WriteCloser
	ok, sub, replays    chan string
	pubPort, routerPort int
}

func startPub(t *testing.T, pubPort, routerPort int) *pypub {
	t.Helper()
	python := testenv.PythonWith(t, "zmq", "msgpack") // Debian's python3-zmq loads only under /usr/bin/python3
	cmd := exec.Command(python, "testdata/pypub.py", fmt.Sprint(pubPort), fmt.Sprint(routerPort))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &pypub{t: t, cmd: cmd, stdin: stdin, ok: make(chan string, 100), sub: make(chan string, 100), replays: make(chan string, 100)}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			l := sc.Text()
			switch {
			case strings.HasPrefix(l, "ready"):
				ready <- l
			case l == "ok":
				p.ok <- l
			case l == "sub":
				p.sub <- l
			case strings.HasPrefix(l, "replay"):
				p.replays <- l
			}
		}
	}()
	t.Cleanup(p.stop)
	select {
	case l := <-ready:
		if _, err := fmt.Sscanf(l, "ready %d %d", &p.pubPort, &p.routerPort); err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("python publisher did not start")
	}
	return p
}

func (p *pypub) stop() {
	if p.cmd.ProcessState != nil {
		return
	}
	_, _ = io.WriteString(p.stdin, "quit\n")
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

func (p *pypub) do(line string) {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		p.t.Fatal(err)
	}
	p.wait(p.ok, "ok after "+line[:min(len(line), 20)])
}

func (p *pypub) wait(ch chan string, what string) string {
	p.t.Helper()
	select {
	case l := <-ch:
		return l
	case <-time.After(10 * time.Second):
		p.t.Fatalf("timed out waiting for %s", what)
	}
	return ""
}

func (p *pypub) pub(seq uint64, payload []byte) { p.do(fmt.Sprintf("pub %d %x", seq, payload)) }

func (p *pypub) lose(seq uint64, payload []byte) { p.do(fmt.Sprintf("lose %d %x", seq, payload)) }

func (p *pypub) addr(port int) string { return fmt.Sprintf("tcp://127.0.0.1:%d", port) }

const testModel = "m"

// newTestIngester starts an Ingester on p into a fresh memory index and waits for the subscription.
func newTestIngester(t *testing.T, p *pypub, replay bool) (*Ingester, *kvstore.MemoryIndex) {
	t.Helper()
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
	cfg := IngesterConfig{
		Endpoint: "e0", Model: testModel, EventsAddr: p.addr(p.pubPort), BlockSize: 16,
		Hasher: kvstore.Hasher{Seed: 7}, Index: idx, BackoffMin: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
	}
	if replay {
		cfg.ReplayAddr = p.addr(p.routerPort)
	}
	ing, err := NewIngester(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ing.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ing.Close() })
	p.wait(p.sub, "subscription")
	return ing, idx
}

func waitStats(t *testing.T, ing *Ingester, what string, cond func(Stats) bool) Stats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := ing.Stats()
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; stats %+v", what, s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func seqIs(n uint64) func(Stats) bool {
	return func(s Stats) bool { return s.HaveSeq && s.LastSeq == n }
}

func tokens(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

// match returns e0's (GPU, CPU) prefix match for tokens under extra.
func match(t *testing.T, idx kvstore.Index, toks []uint32, extra kvstore.ExtraKeys) (int, int) {
	t.Helper()
	ms, err := idx.Match(context.Background(), testModel, kvstore.Hasher{Seed: 7}.Keys(toks, 16, extra))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Endpoint == "e0" {
			return m.GPUBlocks, m.CPUBlocks
		}
	}
	return 0, 0
}

func mustEncode(t *testing.T, b EventBatch, l Layout, f HashForm) []byte {
	t.Helper()
	p, err := Encode(b, l, f)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// engine hashes the way vLLM does (sha256_cbor, PYTHONHASHSEED=0), with raw digests for the bytes form.
func engineHashes(t *testing.T, toks []uint32, extra kvstore.ExtraKeys) ([]EngineHash, [][]byte) {
	t.Helper()
	ds, err := vllmhash.New("0").Blocks(toks, 16, extra)
	if err != nil {
		t.Fatal(err)
	}
	hs := make([]EngineHash, len(ds))
	raw := make([][]byte, len(ds))
	for i, d := range ds {
		hs[i] = EngineHash(d.EventHash())
		raw[i] = slices.Clone(d[:])
	}
	return hs, raw
}

func batch(evs ...Event) EventBatch {
	return EventBatch{TS: float64(time.Now().UnixNano()) / 1e9, Events: evs}
}

// TestIngestGoldenPayloads replays every reference payload through libzmq into the memory index.
func TestIngestGoldenPayloads(t *testing.T) {
	p := startPub(t, 0, 0)
	ing, idx := newTestIngester(t, p, false)
	payloads := loadPayloads(t)
	names := make([]string, 0, len(payloads))
	for n := range payloads {
		names = append(names, n)
	}
	sort.Strings(names)
	for i, n := range names {
		p.pub(uint64(i), payloads[n])
	}
	s := waitStats(t, ing, "all golden batches", seqIs(uint64(len(names)-1)))
	// 10 vLLM payloads of 3 events + the SGLang one of 4; each stores 2 blocks on GPU (block size 16).
	// The vLLM BlockRemoved events name medium CPU where nothing was stored (9 unknown), except v0.9's
	// (no medium = GPU); every batch ends with AllBlocksCleared (plus the clear on the first message).
	want := Stats{Batches: 11, Events: 34, Blocks: 22, UnknownRemoved: 9, Clears: 12}
	got := Stats{Batches: s.Batches, Events: s.Events, Blocks: s.Blocks, UnknownRemoved: s.UnknownRemoved, Clears: s.Clears}
	if got != want || s.DecodeErrors != 0 || s.Gaps != 0 || s.MappedHashes != 0 {
		t.Fatalf("stats %+v", s)
	}
	if g, c := match(t, idx, tokens(1, 32), kvstore.ExtraKeys{}); g+c != 0 {
		t.Fatalf("entries survived AllBlocksCleared: %d GPU %d CPU", g, c)
	}
	if s.Lag < time.Hour { // golden ts is 2023-11-14
		t.Fatalf("lag %v", s.Lag)
	}
}

// TestIngestDualKeys checks keying, tiers, placeholders, reference counts and the block-size check.
func TestIngestDualKeys(t *testing.T) {
	p := startPub(t, 0, 0)
	ing, idx := newTestIngester(t, p, false)
	toks := tokens(1000, 48)
	hs, raw := engineHashes(t, toks, kvstore.ExtraKeys{})
	seq := uint64(0)
	send := func(l Layout, f HashForm, evs ...Event) {
		p.pub(seq, mustEncode(t, batch(evs...), l, f))
		waitStats(t, ing, fmt.Sprint("seq ", seq), seqIs(seq))
		seq++
	}
	check := func(step string, toks []uint32, extra kvstore.ExtraKeys, wantGPU, wantCPU int) {
		t.Helper()
		if g, c := match(t, idx, toks, extra); g != wantGPU || c != wantCPU {
			t.Fatalf("%s: match %d GPU %d CPU, want %d, %d", step, g, c, wantGPU, wantCPU)
		}
	}
	send(LayoutV011, HashBytes, BlockStored{BlockHashes: hs[:2], RawBlockHashes: raw[:2], TokenIDs: toks[:32], BlockSize: 16, Medium: "GPU"})
	send(LayoutMap, HashUint, BlockStored{BlockHashes: hs[2:], ParentBlockHash: &hs[1], TokenIDs: toks[32:], BlockSize: 16, Medium: "GPU"})
	check("stored", toks, kvstore.ExtraKeys{}, 3, 0)
	// vLLM CPU-offload placeholders: no tokens, block size 0.
	send(LayoutArrayLast, HashUint, BlockStored{BlockHashes: hs, Medium: "CPU"})
	check("offloaded", toks, kvstore.ExtraKeys{}, 3, 0)
	send(LayoutMap, HashUint, BlockRemoved{BlockHashes: hs[1:], Medium: "GPU"})
	check("evicted from GPU", toks, kvstore.ExtraKeys{}, 1, 2)
	send(LayoutLoRAName, HashUint, BlockStored{BlockHashes: hs[1:2], ParentBlockHash: &hs[0], TokenIDs: toks[16:32], BlockSize: 16, Medium: "GPU"})
	check("reloaded", toks, kvstore.ExtraKeys{}, 2, 1)
	send(LayoutSGLang, HashInt64, BlockRemoved{BlockHashes: hs, Medium: "CPU_PINNED"})
	check("dropped from CPU", toks, kvstore.ExtraKeys{}, 2, 0)
	if s := ing.Stats(); s.MappedHashes != 3 || s.Blocks != 7 || s.UnknownRemoved != 0 {
		t.Fatalf("stats %+v", s) // h2 is held nowhere but stays resolvable (RemovedMemory)
	}
	// Evicted from GPU and offloaded in the same step: vLLM sends the removal first, the connector's
	// placeholder after it; the placeholder still resolves.
	send(LayoutArrayLast, HashUint, BlockRemoved{BlockHashes: hs[:2], Medium: "GPU"}, BlockStored{BlockHashes: hs[:2], Medium: "CPU"})
	check("offloaded after eviction", toks, kvstore.ExtraKeys{}, 0, 2)
	// LoRA by name, and by lora_id through the config map (none configured here: keyed without LoRA).
	lh, _ := engineHashes(t, toks[:16], kvstore.ExtraKeys{LoRA: "my-lora"})
	send(LayoutMap, HashUint, BlockStored{BlockHashes: lh, TokenIDs: toks[:16], BlockSize: 16, Medium: "GPU", LoRAName: "my-lora"})
	check("lora", toks[:16], kvstore.ExtraKeys{LoRA: "my-lora"}, 1, 0)
	// cache_salt carried in vLLM extra_keys (LoRA first, salt last) keys block 0 with the salt.
	sh, _ := engineHashes(t, toks[:32], kvstore.ExtraKeys{LoRA: "my-lora", CacheSalt: "s1"})
	send(LayoutArrayLast, HashUint, BlockStored{BlockHashes: sh, TokenIDs: toks[:32], BlockSize: 16, Medium: "GPU", LoRAName: "my-lora",
		ExtraKeys: []ExtraKey{{"my-lora", "s1"}, {"my-lora"}}})
	check("salted", toks[:32], kvstore.ExtraKeys{LoRA: "my-lora", CacheSalt: "s1"}, 2, 0)
	check("salted, asked without salt", toks[:32], kvstore.ExtraKeys{LoRA: "my-lora"}, 1, 0)
	// Wrong block size: a configuration error, reported, not applied.
	bh, _ := engineHashes(t, tokens(5000, 32), kvstore.ExtraKeys{})
	send(LayoutMap, HashUint, BlockStored{BlockHashes: bh[:1], TokenIDs: tokens(5000, 32), BlockSize: 32, Medium: "GPU"})
	s := ing.Stats()
	if s.BlockSizeErrors != 1 || !strings.Contains(s.ConfigError, "block size 32") {
		t.Fatalf("block size error not reported: %+v", s)
	}
	// Orphan: parent never announced.
	send(LayoutMap, HashUint, BlockStored{BlockHashes: bh[:1], ParentBlockHash: &bh[1], TokenIDs: tokens(5000, 16), BlockSize: 16, Medium: "GPU"})
	if s := ing.Stats(); s.Orphans != 1 {
		t.Fatalf("orphan not counted: %+v", s)
	}
}

func storeRoot(t *testing.T, toks []uint32) (EngineHash, []byte) {
	hs, _ := engineHashes(t, toks, kvstore.ExtraKeys{})
	return hs[0], mustEncode(t, batch(BlockStored{BlockHashes: hs[:1], TokenIDs: toks[:16], BlockSize: 16, Medium: "GPU"}), LayoutMap, HashUint)
}

func storeChild(t *testing.T, toks []uint32, i int) []byte {
	hs, _ := engineHashes(t, toks, kvstore.ExtraKeys{})
	return mustEncode(t, batch(BlockStored{BlockHashes: hs[i : i+1], ParentBlockHash: &hs[i-1], TokenIDs: toks[16*i : 16*i+16], BlockSize: 16, Medium: "GPU"}), LayoutMap, HashUint)
}

func TestIngestGapWithoutReplay(t *testing.T) {
	p := startPub(t, 0, 0)
	ing, idx := newTestIngester(t, p, false)
	toks := tokens(1, 64)
	_, b0 := storeRoot(t, toks)
	p.pub(0, b0)
	waitStats(t, ing, "seq 0", seqIs(0))
	p.lose(1, storeChild(t, toks, 1))
	p.pub(2, storeChild(t, toks, 2))
	s := waitStats(t, ing, "seq 2", seqIs(2))
	if s.Gaps != 1 || s.Clears != 1 || s.Demotions != 1 || !s.Resyncing || s.Orphans != 1 || s.Replays != 0 {
		t.Fatalf("stats %+v", s)
	}
	// Block 0 is kept, unconfirmed (it ages out unless confirmed); its lost child is an orphan's parent.
	if g, _ := match(t, idx, toks, kvstore.ExtraKeys{}); g != 1 {
		t.Fatalf("after the gap %d blocks, want block 0 kept unconfirmed", g)
	}
	p.pub(3, mustEncode(t, batch(AllBlocksCleared{}), LayoutV011, HashUint))
	if s := waitStats(t, ing, "seq 3", seqIs(3)); s.Resyncing {
		t.Fatalf("still resyncing after AllBlocksCleared: %+v", s)
	}
	if g, _ := match(t, idx, toks, kvstore.ExtraKeys{}); g != 0 {
		t.Fatalf("unconfirmed entries survived AllBlocksCleared: %d", g)
	}
}

func TestIngestGapWithReplay(t *testing.T) {
	p := startPub(t, 0, 0)
	ing, idx := newTestIngester(t, p, true)
	toks := tokens(1, 96)
	_, b0 := storeRoot(t, toks)
	p.pub(0, b0)
	waitStats(t, ing, "seq 0", seqIs(0))
	p.lose(1, storeChild(t, toks, 1))
	p.pub(2, storeChild(t, toks, 2))
	s := waitStats(t, ing, "seq 2 and the replay", func(s Stats) bool { return seqIs(2)(s) && s.Replays == 1 })
	if l := p.wait(p.replays, "replay request"); l != "replay 1" {
		t.Fatalf("replay request %q, want from seq 1", l)
	}
	if s.Gaps != 1 || s.Replays != 1 || s.Clears != 1 || s.Resyncing || s.Orphans != 0 {
		t.Fatalf("stats %+v", s)
	}
	if g, _ := match(t, idx, toks, kvstore.ExtraKeys{}); g != 3 {
		t.Fatalf("after replay %d GPU blocks, want 3", g)
	}
	p.pub(3, storeChild(t, toks, 3))
	waitStats(t, ing, "seq 3", seqIs(3))
	if g, _ := match(t, idx, toks, kvstore.ExtraKeys{}); g != 4 {
		t.Fatalf("after seq 3 %d GPU blocks, want 4", g)
	}
	// The replay buffer no longer reaches back: the entries from before the gap become unconfirmed.
	p.lose(4, storeChild(t, toks, 4))
	p.do("clearbuf")
	p.pub(5, storeChild(t, toks, 5))
	s = waitStats(t, ing, "seq 5", seqIs(5))
	if s.Gaps != 2 || s.ReplayFailures != 1 || s.Clears != 1 || s.Demotions != 1 || !s.Resyncing || s.Orphans != 1 {
		t.Fatalf("stats %+v", s)
	}
	if g, _ := match(t, idx, toks, kvstore.ExtraKeys{}); g != 4 {
		t.Fatalf("after an unrepaired gap %d blocks, want the 4 from before it kept unconfirmed", g)
	}
}

func TestIngestRestartAtZero(t *testing.T) {
	p := startPub(t, 0, 0)
	ing, idx := newTestIngester(t, p, true)
	toks := tokens(1, 32)
	_, b0 := storeRoot(t, toks)
	p.pub(0, b0)
	p.pub(1, storeChild(t, toks, 1))
	waitStats(t, ing, "seq 1", seqIs(1))
	other := tokens(500, 16)
	_, o0 := storeRoot(t, other)
	p.pub(0, o0) // the engine restarted
	s := waitStats(t, ing, "restart", func(s Stats) bool { return s.Restarts == 1 && s.Batches == 3 })
	if s.Clears != 2 || s.LastSeq != 0 || s.Gaps != 0 {
		t.Fatalf("stats %+v", s)
	}
	if g, _ := match(t, idx, toks, kvstore.ExtraKeys{}); g != 0 {
		t.Fatalf("pre-restart entries survived: %d", g)
	}
	if g, _ := match(t, idx, other, kvstore.ExtraKeys{}); g != 1 {
		t.Fatalf("post-restart entry missing: %d", g)
	}
}

func TestIngestBadInput(t *testing.T) {
	p := startPub(t, 0, 0)
	ing, idx := newTestIngester(t, p, false)
	p.pub(0, []byte{0xc1})                                                            // reserved msgpack code
	p.pub(1, mustHex("93cb41d954fc4020"))                                             // truncated
	p.pub(2, mustHex("920191"+"95ab426c6f636b53746f726564"+"90c090a131"))             // string block size
	p.pub(3, mustHex("920192"+"92a3466f6f01"+"91b0416c6c426c6f636b73436c6561726564")) // unknown tag + clear
	p.pub(4, mustHex("92cb41d954fc40200000ddffffffff"))                               // 4 G events declared
	p.do("raw 6b76 0001")                                                             // 2 frames, short seq
	toks := tokens(1, 16)
	_, b := storeRoot(t, toks)
	p.pub(5, b)
	s := waitStats(t, ing, "seq 5", seqIs(5))
	if s.DecodeErrors != 4 || s.SkippedEvents != 1 || s.BadFrames != 1 || s.Batches != 2 || s.Gaps != 0 {
		t.Fatalf("stats %+v", s)
	}
	if g, _ := match(t, idx, toks, kvstore.ExtraKeys{}); g != 1 {
		t.Fatalf("valid batch after bad ones not applied: %d", g)
	}
}

// TestIngestReconnect restarts the publisher on the same port: the Ingester reconnects and, as the new
// engine's sequence starts again, treats it as a restart.
func TestIngestReconnect(t *testing.T) {
	p := startPub(t, 0, 0)
	ing, idx := newTestIngester(t, p, false)
	toks := tokens(1, 32)
	_, b0 := storeRoot(t, toks)
	p.pub(0, b0)
	p.pub(1, storeChild(t, toks, 1))
	waitStats(t, ing, "seq 1", seqIs(1))
	p.stop()
	waitStats(t, ing, "disconnect", func(s Stats) bool { return !s.Connected })
	p2 := startPub(t, p.pubPort, 0)
	p2.wait(p2.sub, "resubscription")
	other := tokens(900, 16)
	_, o0 := storeRoot(t, other)
	p2.pub(0, o0)
	s := waitStats(t, ing, "restart after reconnect", func(s Stats) bool { return s.Restarts == 1 && s.Batches == 3 })
	if s.Reconnects < 1 || !s.Connected {
		t.Fatalf("stats %+v", s)
	}
	if g, _ := match(t, idx, other, kvstore.ExtraKeys{}); g != 1 {
		t.Fatalf("post-reconnect entry missing")
	}
	if g, _ := match(t, idx, toks, kvstore.ExtraKeys{}); g != 0 {
		t.Fatalf("pre-restart entries survived: %d", g)
	}
}

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

func TestIngesterConfig(t *testing.T) {
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
	for _, c := range []IngesterConfig{
		{Model: "m", BlockSize: 16, Index: idx},
		{Endpoint: "e", BlockSize: 16, Index: idx},
		{Endpoint: "e", Model: "m", Index: idx},
		{Endpoint: "e", Model: "m", BlockSize: 16},
	} {
		if _, err := NewIngester(c); err == nil {
			t.Errorf("accepted %+v", c)
		}
	}
	ing, err := NewIngester(IngesterConfig{Endpoint: "e", Model: "m", BlockSize: 16, Index: idx})
	if err != nil {
		t.Fatal(err)
	}
	if err := ing.Start(context.Background()); err == nil {
		t.Fatal("started without an events address")
	}
}

// TestRemovedMemory drives handle directly: a hash held nowhere stays resolvable for RemovedMemory burials.
func TestRemovedMemory(t *testing.T) {
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
	ing, err := NewIngester(IngesterConfig{Endpoint: "e0", Model: testModel, BlockSize: 16, Hasher: kvstore.Hasher{Seed: 7}, Index: idx, RemovedMemory: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var evs []Event
	var hs []EngineHash
	for i := range 3 {
		h := EngineHash(100 + i)
		hs = append(hs, h)
		evs = append(evs, BlockStored{BlockHashes: []EngineHash{h}, TokenIDs: tokens(16*i, 16), BlockSize: 16, Medium: "GPU"})
	}
	evs = append(evs, BlockRemoved{BlockHashes: hs, Medium: "GPU"})
	ing.handle(ctx, 0, mustEncode(t, batch(evs...), LayoutMap, HashUint))
	ing.handle(ctx, 1, mustEncode(t, batch(BlockStored{BlockHashes: hs, Medium: "CPU"}), LayoutMap, HashUint))
	s := ing.Stats()
	if s.Unresolved != 1 || s.Blocks != 5 || s.MappedHashes != 2 {
		t.Fatalf("stats %+v", s)
	}
	// Each block was stored as a chain root of its own tokens; the first buried (100) was forgotten.
	for i, want := range []int{0, 1, 1} {
		if g, c := match(t, idx, tokens(16*i, 16), kvstore.ExtraKeys{}); g != 0 || c != want {
			t.Fatalf("block %d: %d GPU %d CPU, want 0, %d", i, g, c, want)
		}
	}
}

// TestIngestCatchUp connects to a publisher that has already sent seq 0..2: with a replay address the
// buffered history is applied first; without one, the child events that follow are orphans.
func TestIngestCatchUp(t *testing.T) {
	for _, replay := range []bool{true, false} {
		t.Run(fmt.Sprint("replay=", replay), func(t *testing.T) {
			p := startPub(t, 0, 0)
			toks := tokens(1, 64)
			_, b0 := storeRoot(t, toks)
			p.lose(0, b0) // published before anyone subscribed
			p.lose(1, storeChild(t, toks, 1))
			p.lose(2, storeChild(t, toks, 2))
			ing, idx := newTestIngester(t, p, replay)
			p.pub(3, storeChild(t, toks, 3))
			s := waitStats(t, ing, "seq 3", seqIs(3))
			g, _ := match(t, idx, toks, kvstore.ExtraKeys{})
			if replay && (g != 4 || s.CatchUps != 1 || s.Batches != 4 || s.Orphans != 0) {
				t.Fatalf("with replay: %d blocks; stats %+v", g, s)
			}
			if !replay && (g != 0 || s.CatchUps != 0 || s.Batches != 1 || s.Orphans != 1) {
				t.Fatalf("without replay: %d blocks; stats %+v", g, s)
			}
		})
	}
}

// TestIngestStartsDemoted: confirmed entries another ingester left for the endpoint (a takeover) are kept
// on a first message that is not seq 0, unconfirmed: they age out after UnconfirmedTTL unless confirmed,
// since their engine hashes cannot be resolved; at seq 0 (a new engine) they are dropped at once.
func TestIngestStartsDemoted(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	for _, first := range []uint64{41, 0} {
		idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{Now: clock})
		stale := kvstore.Hasher{Seed: 7}.Keys(tokens(1, 32), 16, kvstore.ExtraKeys{})
		if err := idx.Add(context.Background(), testModel, "e0", kvstore.TierGPU, stale); err != nil {
			t.Fatal(err)
		}
		ing, err := NewIngester(IngesterConfig{Endpoint: "e0", Model: testModel, BlockSize: 16, Hasher: kvstore.Hasher{Seed: 7},
			Index: idx, Now: clock, UnconfirmedTTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		_, b := storeRoot(t, tokens(100, 16))
		ing.handle(context.Background(), first, b)
		want := 2
		if first == 0 {
			want = 0
		}
		if g, _ := match(t, idx, tokens(1, 32), kvstore.ExtraKeys{}); g != want {
			t.Fatalf("first seq %d: stale entries %d, want %d", first, g, want)
		}
		if s := ing.Stats(); s.Resyncing != (first != 0) {
			t.Fatalf("first seq %d: stats %+v", first, s)
		}
		mu.Lock()
		now = now.Add(time.Minute + time.Second)
		mu.Unlock()
		if g, _ := match(t, idx, tokens(1, 32), kvstore.ExtraKeys{}); g != 0 {
			t.Fatalf("first seq %d: unconfirmed entries did not age out: %d", first, g)
		}
		if g, _ := match(t, idx, tokens(100, 16), kvstore.ExtraKeys{}); g != 1 {
			t.Fatalf("first seq %d: first batch not applied: %d", first, g)
		}
		if s := ing.Stats(); s.Resyncing {
			t.Fatalf("still resyncing after the TTL: %+v", s)
		}
	}
}

// TestIngestKeepsSpeculative: a new Ingester's first message from a new engine (seq 0) clears what an earlier ingester confirmed for
// the endpoint, but not the speculative entries the gateway recorded for requests it just routed there (on
// both backends, over a real libzmq publisher).
func TestIngestKeepsSpeculative(t *testing.T) {
	for _, backend := range []string{"memory", "redis", "redis-layout2"} {
		t.Run(backend, func(t *testing.T) {
			var idx kvstore.Index = kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
			if backend != "memory" {
				layout := 0
				if backend == "redis-layout2" {
					layout = 2
				}
				ri, err := kvstore.NewRedisIndex(redistest.Start(t).Client(t), kvstore.RedisConfig{IndexLayout: layout})
				if err != nil {
					t.Fatal(err)
				}
				idx = ri
			}
			ctx := context.Background()
			h := kvstore.Hasher{Seed: 7}
			routed, stale := tokens(2000, 64), tokens(1, 32)
			if err := idx.Add(ctx, testModel, "e0", kvstore.TierGPU, h.Keys(stale, 16, kvstore.ExtraKeys{})); err != nil {
				t.Fatal(err)
			}
			// A router's speculative hold (ClearConfirmed keeps those that end within ClearKeepsHoldsWithin).
			if err := idx.Record(ctx, testModel, "e0", h.Keys(routed, 16, kvstore.ExtraKeys{}), kvstore.ClearKeepsHoldsWithin/2); err != nil {
				t.Fatal(err)
			}
			p := startPub(t, 0, 0)
			ing, err := NewIngester(IngesterConfig{Endpoint: "e0", Model: testModel, EventsAddr: p.addr(p.pubPort), BlockSize: 16,
				Hasher: h, Index: idx, BackoffMin: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if err := ing.Start(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = ing.Close() })
			p.wait(p.sub, "subscription")
			first := tokens(500, 32)
			_, b := storeRoot(t, first)
			p.pub(0, b) // a new engine: what an earlier ingester confirmed is gone
			if s := waitStats(t, ing, "first message", seqIs(0)); s.Clears != 1 || s.IndexErrors != 0 {
				t.Fatalf("stats %+v", s)
			}
			if g, c := match(t, idx, routed, kvstore.ExtraKeys{}); g != 4 || c != 0 {
				t.Fatalf("speculative entries after the first message: %d GPU %d CPU, want 4, 0", g, c)
			}
			if g, _ := match(t, idx, stale, kvstore.ExtraKeys{}); g != 0 {
				t.Fatalf("an earlier ingester's confirmed entries kept: %d", g)
			}
			if g, _ := match(t, idx, first, kvstore.ExtraKeys{}); g != 1 {
				t.Fatalf("first batch not applied: %d", g)
			}
			// AllBlocksCleared also drops only what the engine reported.
			p.pub(1, mustEncode(t, batch(AllBlocksCleared{}), LayoutMap, HashUint))
			waitStats(t, ing, "seq 1", seqIs(1))
			if g, _ := match(t, idx, first, kvstore.ExtraKeys{}); g != 0 {
				t.Fatalf("entries survived AllBlocksCleared: %d", g)
			}
			if g, _ := match(t, idx, routed, kvstore.ExtraKeys{}); g != 4 {
				t.Fatalf("speculative entries after AllBlocksCleared: %d, want 4", g)
			}
		})
	}
}

// TestIngestKVCacheGroups: a hybrid model announces the same tokens once per KV-cache group with different
// hashes; only the configured group is indexed, so one group's eviction does not remove the other's blocks.
func TestIngestKVCacheGroups(t *testing.T) {
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
	ing, err := NewIngester(IngesterConfig{Endpoint: "e0", Model: testModel, BlockSize: 16, Hasher: kvstore.Hasher{Seed: 7}, Index: idx})
	if err != nil {
		t.Fatal(err)
	}
	toks := tokens(1, 32)
	g0 := BlockStored{BlockHashes: []EngineHash{1, 2}, TokenIDs: toks, BlockSize: 16, Medium: "GPU", GroupIdx: ptr(0)}
	g1 := BlockStored{BlockHashes: []EngineHash{11, 12}, TokenIDs: toks, BlockSize: 16, Medium: "GPU", GroupIdx: ptr(1)}
	evict := BlockRemoved{BlockHashes: []EngineHash{11}, Medium: "GPU", GroupIdx: ptr(1)} // sliding window drops block 0
	ing.handle(context.Background(), 0, mustEncode(t, batch(g0, g1, evict), LayoutArrayLast, HashUint))
	if g, _ := match(t, idx, toks, kvstore.ExtraKeys{}); g != 2 {
		t.Fatalf("group 0 blocks: %d, want 2", g)
	}
	if s := ing.Stats(); s.OtherGroupEvents != 2 || s.Blocks != 2 {
		t.Fatalf("stats %+v", s)
	}
}

// TestIngestReplayUnreachable: a configured replay socket that does not answer fails over to demoting.
func TestIngestReplayUnreachable(t *testing.T) {
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
	ing, err := NewIngester(IngesterConfig{Endpoint: "e0", Model: testModel, BlockSize: 16, Hasher: kvstore.Hasher{Seed: 7},
		Index: idx, ReplayAddr: "tcp://127.0.0.1:1", ReplayTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	toks := tokens(1, 48)
	_, b0 := storeRoot(t, toks)
	ctx := context.Background()
	ing.handle(ctx, 0, b0)
	ing.handle(ctx, 2, storeChild(t, toks, 2))
	s := ing.Stats()
	if s.Gaps != 1 || s.ReplayFailures != 1 || !s.Resyncing || s.LastSeq != 2 || s.Orphans != 1 || s.Demotions != 1 {
		t.Fatalf("stats %+v", s)
	}
	if g, _ := match(t, idx, toks, kvstore.ExtraKeys{}); g != 1 {
		t.Fatalf("after an unrepaired gap %d blocks, want block 0 kept unconfirmed", g)
	}
}

// slowIndex is a memory index whose Batcher.Apply takes delay and is counted, so messages queue up behind it.
type slowIndex struct {
	*kvstore.MemoryIndex
	delay time.Duration
	mu    sync.Mutex
	calls int
}

func (s *slowIndex) Apply(ctx context.Context, model string, us []kvstore.Update) error {
	time.Sleep(s.delay)
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	return s.MemoryIndex.Apply(ctx, model, us)
}

// TestIngestBacklogCommitsTogether: messages that arrive while the index is busy are applied together in
// fewer index calls, in order, and Stats.LastSeq is published only once they are in the index.
func TestIngestBacklogCommitsTogether(t *testing.T) {
	p := startPub(t, 0, 0)
	idx := &slowIndex{MemoryIndex: kvstore.NewMemoryIndex(kvstore.MemoryConfig{}), delay: 30 * time.Millisecond}
	ing, err := NewIngester(IngesterConfig{Endpoint: "e0", Model: testModel, EventsAddr: p.addr(p.pubPort), BlockSize: 16,
		Hasher: kvstore.Hasher{Seed: 7}, Index: idx, BackoffMin: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := ing.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ing.Close() })
	p.wait(p.sub, "subscription")
	const n = 24
	toks := tokens(1, 16*n)
	hs, _ := engineHashes(t, toks, kvstore.ExtraKeys{})
	for i := range n { // a chain: block i is stored as the child of block i-1; block 5 is evicted again
		ev := BlockStored{BlockHashes: hs[i : i+1], TokenIDs: toks[16*i : 16*i+16], BlockSize: 16, Medium: "GPU"}
		if i > 0 {
			ev.ParentBlockHash = &hs[i-1]
		}
		evs := []Event{ev}
		if i == 10 {
			evs = append(evs, BlockRemoved{BlockHashes: hs[5:6], Medium: "GPU"})
		}
		p.pub(uint64(i), mustEncode(t, batch(evs...), LayoutMap, HashUint))
	}
	var g int
	for {
		s := waitStats(t, ing, "some batches", func(s Stats) bool { return s.HaveSeq })
		// Whatever Stats says is applied is in the index.
		g, _ = match(t, idx, toks, kvstore.ExtraKeys{})
		if want := min(int(s.LastSeq)+1, 5); g < want {
			t.Fatalf("LastSeq %d published but only %d blocks matched", s.LastSeq, g)
		}
		if s.LastSeq == n-1 {
			if s.Batches != n || s.Blocks != n || s.Orphans != 0 {
				t.Fatalf("stats %+v", s)
			}
			break
		}
	}
	if g != 5 {
		t.Fatalf("match %d blocks, want 5 (block 5 evicted)", g)
	}
	if got, err := idx.Match(context.Background(), testModel, kvstore.Hasher{Seed: 7}.Keys(toks, 16, kvstore.ExtraKeys{})[6:]); err != nil || len(got) != 1 || got[0].GPUBlocks != n-6 {
		t.Fatalf("blocks after the evicted one: %+v %v", got, err)
	}
	idx.mu.Lock()
	calls := idx.calls
	idx.mu.Unlock()
	if calls >= n {
		t.Fatalf("%d index calls for %d queued messages: nothing committed together", calls, n)
	}
	t.Logf("%d messages, %d index calls", n, calls)
}
