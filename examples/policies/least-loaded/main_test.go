package main

import (
	"testing"

	"github.com/kvgate/kvgate/sdk"
	"github.com/kvgate/kvgate/sdk/sdktest"
)

func ep(gpu, waiting, inflight uint32) sdk.Endpoint {
	return sdk.Endpoint{Flags: sdk.FlagHealthy, GPUBlocks: gpu, Waiting: waiting, InFlightRequests: inflight}
}

func TestLeastLoaded(t *testing.T) {
	req := sdk.Request{PromptTokens: 256, PromptBlocks: 16, BlockSize: 16, Seed: 42}
	sdktest.Run(t, func() sdk.Policy { return &Policy{} }, ".", []sdktest.Case{
		// sglang PR #14305 (the "death spiral"): A holds the small tree with 50 in
		// flight, B the big tree with none. By load: B (0) before A (50).
		{Name: "miss-avoids-busy", Snapshot: sdk.Snapshot{Request: req, Endpoints: []sdk.Endpoint{ep(1, 0, 50), ep(0, 0, 0)}},
			Want: []uint32{1, 0}},
		{Name: "waiting-plus-inflight", Snapshot: sdk.Snapshot{Request: req,
			Endpoints: []sdk.Endpoint{ep(0, 3, 3), ep(0, 1, 4), ep(0, 0, 2)}}, Want: []uint32{2, 1, 0}},
		// Equal loads: seed 42's tie keys order positions 2, 0, 1 (independent Python SplitMix64).
		{Name: "ties-seeded", Snapshot: sdk.Snapshot{Request: req, Endpoints: []sdk.Endpoint{ep(0, 1, 0), ep(0, 0, 1), ep(0, 1, 0)}},
			Want: []uint32{2, 0, 1}},
		{Name: "unhealthy-skipped", Snapshot: sdk.Snapshot{Request: req, Endpoints: []sdk.Endpoint{{}, ep(0, 9, 0)}},
			Want: []uint32{1}},
	})
}
