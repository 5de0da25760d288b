package main

import (
	"testing"

	"github.com/kvgate/kvgate/sdk"
	"github.com/kvgate/kvgate/sdk/sdktest"
)

func ep(gpu, cpu, running uint32, inflightTokens uint64) sdk.Endpoint {
	return sdk.Endpoint{Flags: sdk.FlagHealthy, GPUBlocks: gpu, CPUBlocks: cpu, Running: running, InFlightTokens: inflightTokens}
}

func TestDynamoCost(t *testing.T) {
	req := sdk.Request{PromptTokens: 256, PromptBlocks: 16, BlockSize: 16, Seed: 42}
	sdktest.Run(t, func() sdk.Policy { return &Policy{} }, ".", []sdktest.Case{
		// the fleet of vllm-project/router PR #238: running [100,0,0], prefix (16 GPU blocks) on idle endpoint 2.
		// Costs: 0: 16 + 100 + 16 = 132; 1: 16 + 0 + 16 = 32; 2: max(16 − 16, 0) + 0 + 0 = 0 → [2,1,0].
		{Name: "hot-endpoint-idle-owner", Snapshot: sdk.Snapshot{Request: req,
			Endpoints: []sdk.Endpoint{ep(0, 0, 100, 0), ep(0, 0, 0, 0), ep(16, 0, 0, 0)}}, Want: []uint32{2, 1, 0}},
		// Host credit 0.75: 16 CPU-only blocks → 16 − 12 = 4; 13 GPU blocks → 3 + 3 new = 6 → [0,1].
		{Name: "cpu-credit-beats-shorter-gpu", Snapshot: sdk.Snapshot{Request: req,
			Endpoints: []sdk.Endpoint{ep(0, 16, 0, 0), ep(13, 0, 0, 0)}}, Want: []uint32{0, 1}},
		// ... but not 15 GPU blocks: 1 + 1 = 2 < 4 → [1,0].
		{Name: "longer-gpu-beats-cpu", Snapshot: sdk.Snapshot{Request: req,
			Endpoints: []sdk.Endpoint{ep(0, 16, 0, 0), ep(15, 0, 0, 0)}}, Want: []uint32{1, 0}},
		// Active prefill: 640 in-flight tokens = 40 blocks on the prefix holder: 40 + 16 − 16 = 40
		// against an idle miss 16 + 16 = 32 → [1,0] (vllm-project/router#179: load must count).
		{Name: "prefill-load-counts", Snapshot: sdk.Snapshot{Request: req,
			Endpoints: []sdk.Endpoint{ep(16, 0, 0, 640), ep(0, 0, 0, 0)}}, Want: []uint32{1, 0}},
		{Name: "empty-prompt-by-decode", Snapshot: sdk.Snapshot{Request: sdk.Request{BlockSize: 16, Seed: 42},
			Endpoints: []sdk.Endpoint{ep(0, 0, 3, 0), ep(0, 0, 1, 0)}}, Want: []uint32{1, 0}},
	})
}

func TestTemperatureMustBeZero(t *testing.T) {
	if err := (&Policy{}).Init([]byte(`{"temperature": 0.5}`)); err == nil {
		t.Fatal("temperature 0.5 accepted")
	}
}
