package main

import (
	"testing"

	"github.com/kvgate/kvgate/sdk"
	"github.com/kvgate/kvgate/sdk/sdktest"
)

func ep(gpu, inflight uint32, util float32) sdk.Endpoint {
	return sdk.Endpoint{Flags: sdk.FlagHealthy, GPUBlocks: gpu, InFlightRequests: inflight, KVCacheUtilization: util}
}

func TestSGLangCacheAware(t *testing.T) {
	req := sdk.Request{PromptTokens: 256, PromptBlocks: 16, BlockSize: 16, Seed: 42}
	sdktest.Run(t, func() sdk.Policy { return &Policy{} }, ".", []sdktest.Case{
		// vllm-project/router PR #238: loads [100,0,0], prefix on idle endpoint 2.
		// SMG's per-request gate: selected 2 has load 0 ≤ mean 33.3 + 64, so it stays first (the
		// classic fleet-wide gate, max−min = 100 > 64 and 100 > 1.5·0, would send it to min load).
		// Then by rate (1: 0, 0: 0), by load: 1 (0), 0 (100).
		{Name: "per-request-gate-keeps-affinity", Snapshot: sdk.Snapshot{Request: req,
			Endpoints: []sdk.Endpoint{ep(0, 100, 0.5), ep(0, 0, 0.5), ep(16, 0, 0.5)}}, Want: []uint32{2, 1, 0}},
		// sglang PR #14305 (reproduced on purpose): a miss (rate 1/16 ≤ 0.3) goes to
		// the smallest cache, endpoint 0 (utilization 0.1), although it has 50 in flight: mean 25,
		// 50 > 37.5 but not > 89, so the gate does not spill.
		{Name: "miss-smallest-cache-death-spiral", Snapshot: sdk.Snapshot{Request: req,
			Endpoints: []sdk.Endpoint{ep(1, 50, 0.1), ep(0, 0, 0.9)}}, Want: []uint32{0, 1}},
		// The gate spills: endpoint 0 holds the prefix with 200 in flight; loads [200,0,0,0], mean 50:
		// 200 > 75 and > 114 → least loaded (1, 2, 3 tie at 0; seed 42 keys order 3, 2, 0, 1 → 3).
		// Rest: 0 (rate 1), then 2, 1 by key.
		{Name: "per-request-gate-spills", Snapshot: sdk.Snapshot{Request: req,
			Endpoints: []sdk.Endpoint{ep(16, 200, 0.5), ep(0, 0, 0.5), ep(0, 0, 0.5), ep(0, 0, 0.5)}}, Want: []uint32{3, 0, 2, 1}},
		// Strict threshold: rate exactly 0.3 is not affinity. 256·0.3 is not a block multiple, so use
		// a 160-token prompt (10 blocks) with 3 matched: 3·16/160 = 0.3 → miss → lowest utilization (1).
		{Name: "threshold-is-strict", Snapshot: sdk.Snapshot{Request: sdk.Request{PromptTokens: 160, PromptBlocks: 10, BlockSize: 16, Seed: 42},
			Endpoints: []sdk.Endpoint{ep(3, 0, 0.5), ep(0, 0, 0.2)}}, Want: []uint32{1, 0}},
		{Name: "config-lower-threshold", Config: `{"cache_threshold": 0.2}`, Snapshot: sdk.Snapshot{Request: sdk.Request{PromptTokens: 160, PromptBlocks: 10, BlockSize: 16, Seed: 42},
			Endpoints: []sdk.Endpoint{ep(3, 0, 0.5), ep(0, 0, 0.2)}}, Want: []uint32{0, 1}},
	})
}

func TestConfigRejected(t *testing.T) {
	p := &Policy{}
	if err := p.Init([]byte(`{"cache_treshold": 0.2}`)); err == nil {
		t.Fatal("unknown key accepted")
	}
	if err := p.Init([]byte(`{"balance_rel": 0.5}`)); err == nil {
		t.Fatal("balance_rel below 1 accepted")
	}
}
