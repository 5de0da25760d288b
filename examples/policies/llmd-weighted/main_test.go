package main

import (
	"testing"

	"github.com/kvgate/kvgate/sdk"
	"github.com/kvgate/kvgate/sdk/sdktest"
)

func ep(gpu, cpu, waiting uint32, util float32) sdk.Endpoint {
	return sdk.Endpoint{Flags: sdk.FlagHealthy, GPUBlocks: gpu, CPUBlocks: cpu, Waiting: waiting, KVCacheUtilization: util}
}

func TestLLMDWeighted(t *testing.T) {
	req := sdk.Request{PromptTokens: 256, PromptBlocks: 16, BlockSize: 16, Seed: 42}
	sdktest.Run(t, func() sdk.Policy { return &Policy{} }, ".", []sdktest.Case{
		// the fleet of vllm-project/router PR #238: waiting [100,0,0], prefix on idle endpoint 2, utilization 0.5.
		// Scores: 0: 3·0 + 2·0 + 2·0.5 = 1; 1: 0 + 2·1 + 1 = 3; 2: 3·1 + 2 + 1 = 6 → [2,1,0].
		{Name: "hot-endpoint-idle-owner", Snapshot: sdk.Snapshot{Request: req,
			Endpoints: []sdk.Endpoint{ep(0, 0, 100, 0.5), ep(0, 0, 0, 0.5), ep(16, 0, 0, 0.5)}}, Want: []uint32{2, 1, 0}},
		// inference-sim#1007 (a recurring ask): equal queues min-max to 1.0 for everyone,
		// so the cold start is decided by KV: 0: 2 + 2·0.8 = 3.6; 1: 2 + 2·0.4 = 2.8 → [0,1].
		{Name: "cold-start-equal-queues", Snapshot: sdk.Snapshot{Request: req,
			Endpoints: []sdk.Endpoint{ep(0, 0, 5, 0.2), ep(0, 0, 5, 0.6)}}, Want: []uint32{0, 1}},
		// Tiers: 16 CPU-only blocks score 0.8·16/16 = 0.8 (×3 = 2.4) against 12 GPU blocks 0.75 (2.25).
		{Name: "cpu-tier-0.8", Snapshot: sdk.Snapshot{Request: req,
			Endpoints: []sdk.Endpoint{ep(12, 0, 0, 0.5), ep(0, 16, 0, 0.5)}}, Want: []uint32{1, 0}},
		// A full prefix (3) loses to an idle, empty endpoint when it is the busiest and fullest:
		// 0: 3 + 0 + 2·0.1 = 3.2; 1: 0 + 2 + 2·0.9 = 3.8 → [1,0].
		{Name: "load-outweighs-prefix", Snapshot: sdk.Snapshot{Request: req,
			Endpoints: []sdk.Endpoint{ep(16, 0, 10, 0.9), ep(0, 0, 0, 0.1)}}, Want: []uint32{1, 0}},
		{Name: "prefix-only-config", Config: `{"queue_weight": 0, "kv_weight": 0}`, Snapshot: sdk.Snapshot{Request: req,
			Endpoints: []sdk.Endpoint{ep(16, 0, 10, 0.9), ep(0, 0, 0, 0.1)}}, Want: []uint32{0, 1}},
	})
}
