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
