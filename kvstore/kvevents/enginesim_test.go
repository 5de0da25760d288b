package kvevents_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/cmd/enginesim/sim"
	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/kvevents"
)

// These tests ingest the engine simulator's events (published with this package's encoder, over
// go-zeromq PUB and a replay ROUTER) and check the index against what the simulator cached.

func startSim(t *testing.T, encoding, form string, gpuBlocks, cpuBlocks int) *sim.Engine {
	t.Helper()
	cfg := sim.DefaultConfig()
	cfg.Model = "sim-model" // no tokenizer files: byte-level fallback; prompts here are token IDs
	cfg.Host = "127.0.0.1"
	cfg.TimeScale = 0
	cfg.NumGPUBlocks = gpuBlocks
	cfg.NumCPUBlocks = cpuBlocks
	cfg.CPUEventsSelfDescribing = false
	cfg.LoRAModules = []string{"lora-a"}
	cfg.EventsEncoding, cfg.EventsHashForm = encoding, form
	cfg.KVEvents = sim.KVEventsConfig{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: "tcp://*:0",
		ReplayEndpoint: "tcp://*:0", BufferSteps: 1000, HWM: 100000, MaxQueueSize: 100000}
	e, err := sim.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func simIngester(t *testing.T, e *sim.Engine, idx kvstore.Index) *kvevents.Ingester {
	t.Helper()
	ing, err := kvevents.NewIngester(kvevents.IngesterConfig{
		Endpoint: "sim0", Model: "m", EventsAddr: e.EventsAddr(), ReplayAddr: e.ReplayAddr(), BlockSize: 16,
		Hasher: kvstore.Hasher{Seed: 3}, Index: idx, BackoffMin: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := ing.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ing.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Contains(e.EventSubscriptions(), "") {
		if time.Now().After(deadline) {
			t.Fatal("subscription never reached the simulator")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return ing
}

func complete(t *testing.T, e *sim.Engine, model string, prompt []uint32) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 1})
	resp, err := http.Post("http://"+e.HTTPAddr()+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("completion: HTTP %d", resp.StatusCode)
	}
}

func prompt(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + 7*i)
	}
	return out
}

// eventually polls the (GPU, CPU) match of toks until it equals want.
func eventually(t *testing.T, idx kvstore.Index, ing *kvevents.Ingester, what string, toks []uint32, extra kvstore.ExtraKeys, wantGPU, wantCPU int) {
	t.Helper()
	keys := kvstore.Hasher{Seed: 3}.Keys(toks, 16, extra)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ms, err := idx.Match(context.Background(), "m", keys)
		if err != nil {
			t.Fatal(err)
		}
		g, c := 0, 0
		for _, m := range ms {
			if m.Endpoint == "sim0" {
				g, c = m.GPUBlocks, m.CPUBlocks
			}
		}
		if g == wantGPU && c == wantCPU {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: match %d GPU %d CPU, want %d, %d; stats %+v", what, g, c, wantGPU, wantCPU, ing.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestEngineSim(t *testing.T) {
	for _, v := range []struct{ encoding, form string }{{"array", "int"}, {"map", "bytes"}} {
		t.Run(v.encoding+"/"+v.form, func(t *testing.T) {
			e := startSim(t, v.encoding, v.form, 1000, 0)
			idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
			ing := simIngester(t, e, idx)
			a := prompt(1, 64)
			complete(t, e, "sim-model", a) // 64 prompt + 1 output token: 4 full blocks
			eventually(t, idx, ing, "prompt A", a, kvstore.ExtraKeys{}, 4, 0)
			complete(t, e, "lora-a", a)
			eventually(t, idx, ing, "prompt A under LoRA", a, kvstore.ExtraKeys{LoRA: "lora-a"}, 4, 0)
			// A lost batch is replayed from the simulator's ROUTER.
			if err := e.SetFaults(sim.Faults{DropEventBatches: 1}); err != nil {
				t.Fatal(err)
			}
			b := prompt(5000, 48)
			complete(t, e, "sim-model", b)
			complete(t, e, "sim-model", prompt(9000, 32))
			eventually(t, idx, ing, "prompt B after a dropped batch", b, kvstore.ExtraKeys{}, 3, 0)
			if s := ing.Stats(); s.Gaps != 1 || s.Replays != 1 || s.Resyncing || s.DecodeErrors != 0 || s.Orphans != 0 {
				t.Fatalf("stats %+v", s)
			}
			// Restart: sequence back to 0, cache emptied, no AllBlocksCleared.
			if err := e.SetFaults(sim.Faults{RestartEventSeq: true}); err != nil {
				t.Fatal(err)
			}
			c := prompt(20000, 32)
			complete(t, e, "sim-model", c)
			eventually(t, idx, ing, "prompt C after restart", c, kvstore.ExtraKeys{}, 2, 0)
			eventually(t, idx, ing, "prompt A after restart", a, kvstore.ExtraKeys{}, 0, 0)
			if s := ing.Stats(); s.Restarts != 1 {
				t.Fatalf("stats %+v", s)
			}
			if err := e.ResetPrefixCache(); err != nil {
				t.Fatal(err)
			}
			eventually(t, idx, ing, "prompt C after reset", c, kvstore.ExtraKeys{}, 0, 0)
		})
	}
}

// TestEngineSimOffload fills a small GPU cache so blocks are offloaded to the CPU tier with vLLM's token-less
// placeholder events, which the ingester resolves through its engine-hash map.
func TestEngineSimOffload(t *testing.T) {
	e := startSim(t, "array", "int", 8, 64)
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
	ing := simIngester(t, e, idx)
	a := prompt(1, 64)
	complete(t, e, "sim-model", a)
	eventually(t, idx, ing, "prompt A", a, kvstore.ExtraKeys{}, 4, 0)
	for i := range 3 {
		complete(t, e, "sim-model", prompt(1000*(i+1), 64))
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := ing.Stats()
		ms, _ := idx.Match(context.Background(), "m", kvstore.Hasher{Seed: 3}.Keys(a, 16, kvstore.ExtraKeys{}))
		if len(ms) == 1 && ms[0].CPUBlocks > 0 && ms[0].GPUBlocks+ms[0].CPUBlocks == 4 && s.Unresolved == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("prompt A never moved to CPU: %+v; stats %+v", ms, fmt.Sprintf("%+v", s))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// matchBy returns each endpoint's GPU blocks for toks.
func matchBy(t *testing.T, idx kvstore.Index, toks []uint32) map[kvstore.EndpointID]int {
	t.Helper()
	ms, err := idx.Match(context.Background(), "m", kvstore.Hasher{Seed: 3}.Keys(toks, 16, kvstore.ExtraKeys{}))
	if err != nil {
		t.Fatal(err)
	}
	out := map[kvstore.EndpointID]int{}
	for _, m := range ms {
		out[m.Endpoint] = m.GPUBlocks
	}
	return out
}

// TestEngineSimDataParallelRanks (#11 item 2): a simulator with --data-parallel-size 2 publishes each rank's
// events on its own ports (events and replay port + rank) with its own sequence and data_parallel_rank; an
// Ingester with DataParallelSize 2 indexes each rank's blocks under "sim0/dp<r>". Requests pinned with
// X-data-parallel-rank interleave the two ranks' batches; a rank's dropped batch is replayed from that
// rank's ROUTER; a request without the header goes to the less loaded rank.
func TestEngineSimDataParallelRanks(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.Model, cfg.Host, cfg.TimeScale, cfg.NumGPUBlocks, cfg.DataParallelSize = "sim-model", "127.0.0.1", 0, 1000, 2
	cfg.KVEvents = sim.KVEventsConfig{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: "tcp://*:0",
		ReplayEndpoint: "tcp://*:0", BufferSteps: 1000, HWM: 100000, MaxQueueSize: 100000}
	e, err := sim.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	evs, reps := e.RankAddrs()
	if len(evs) != 2 || evs[0] != e.EventsAddr() || reps[0] != e.ReplayAddr() {
		t.Fatalf("rank addresses %v %v (engine %s %s)", evs, reps, e.EventsAddr(), e.ReplayAddr())
	}
	idx := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
	ing, err := kvevents.NewIngester(kvevents.IngesterConfig{Endpoint: "sim0", Model: "m", EventsAddr: e.EventsAddr(),
		ReplayAddr: e.ReplayAddr(), BlockSize: 16, Hasher: kvstore.Hasher{Seed: 3}, Index: idx,
		BackoffMin: 20 * time.Millisecond, DataParallelSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := ing.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ing.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Contains(e.EventSubscriptions(), "") {
		if time.Now().After(deadline) {
			t.Fatal("subscriptions never reached both ranks")
		}
		time.Sleep(5 * time.Millisecond)
	}
	completeRank := func(rank string, p []uint32) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": "sim-model", "prompt": p, "max_tokens": 1})
		req, _ := http.NewRequest(http.MethodPost, "http://"+e.HTTPAddr()+"/v1/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if rank != "" {
			req.Header.Set(sim.DataParallelRankHeader, rank)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("completion on rank %q: HTTP %d", rank, resp.StatusCode)
		}
	}
	// Interleaved: rank 0 gets A_i, rank 1 gets B_i.
	var as, bs [][]uint32
	for i := range 4 {
		as, bs = append(as, prompt(1000*(i+1), 48)), append(bs, prompt(100000+1000*i, 48))
		completeRank("0", as[i])
		completeRank("1", bs[i])
	}
	waitCond := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s; rank stats %+v", what, ing.RankStats())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	for i := range 4 {
		waitCond(fmt.Sprintf("A%d on rank 0 and B%d on rank 1", i, i), func() bool {
			a, b := matchBy(t, idx, as[i]), matchBy(t, idx, bs[i])
			return a["sim0/dp0"] == 3 && len(a) == 1 && b["sim0/dp1"] == 3 && len(b) == 1
		})
	}
	rs := e.RankStats()
	if rs[0].GPUCachedBlocks != 12 || rs[1].GPUCachedBlocks != 12 {
		t.Fatalf("engine rank caches %+v, want 12 blocks each (4 prompts x 3 blocks)", rs)
	}
	// A dropped batch on one rank: replay from that rank's ROUTER closes the gap.
	if err := e.SetFaults(sim.Faults{DropEventBatches: 1}); err != nil {
		t.Fatal(err)
	}
	c, d := prompt(500000, 32), prompt(600000, 32)
	completeRank("1", c)
	completeRank("1", d)
	waitCond("C and D on rank 1 after a dropped batch", func() bool {
		return matchBy(t, idx, c)["sim0/dp1"] == 2 && matchBy(t, idx, d)["sim0/dp1"] == 2
	})
	for r, s := range ing.RankStats() {
		wantGaps := uint64(0)
		if r == 1 {
			wantGaps = 1
		}
		if s.Gaps != wantGaps || s.Replays != wantGaps || s.Restarts != 0 || s.DecodeErrors != 0 || s.Orphans != 0 {
			t.Fatalf("rank %d stats %+v", r, s)
		}
	}
	// No header: the balancer picks the rank holding fewer requests (both idle: rank 0).
	f := prompt(700000, 32)
	completeRank("", f)
	waitCond("F on rank 0", func() bool { m := matchBy(t, idx, f); return m["sim0/dp0"] == 2 && len(m) == 1 })
	// A header that names no rank is a 400.
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "prompt": f, "max_tokens": 1})
	req, _ := http.NewRequest(http.MethodPost, "http://"+e.HTTPAddr()+"/v1/completions", bytes.NewReader(body))
	req.Header.Set(sim.DataParallelRankHeader, "2")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("rank 2 of 2: HTTP %d, want 400", resp.StatusCode)
	}
}
