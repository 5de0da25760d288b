package main

import (
	"testing"

	"github.com/kvgate/kvgate/sdk"
	"github.com/kvgate/kvgate/sdk/sdktest"
)

func ep(waiting uint32) sdk.Endpoint { return sdk.Endpoint{Flags: sdk.FlagHealthy, Waiting: waiting} }

func TestPowerOfTwoChoices(t *testing.T) {
	hot := []sdk.Endpoint{ep(100), ep(0), ep(0)}
	req := func(seed uint64) sdk.Request { return sdk.Request{PromptTokens: 256, BlockSize: 16, Seed: seed} }
	// the fleet of vllm-project/router PR #238, loads [100, 0, 0]. Draws over 3 positions from an independent Python
	// SplitMix64: seed 7 → (1, 0), seed 9 → (2, 1), seed 6 → (2, 0). The hot endpoint 0 is never first
	// when it is drawn, and last otherwise. Seed 9 draws two idle endpoints: its tie keys put 2 before 1.
	sdktest.Run(t, func() sdk.Policy { return &Policy{} }, ".", []sdktest.Case{
		{Name: "seed7-draws-1-and-0", Snapshot: sdk.Snapshot{Request: req(7), Endpoints: hot}, Want: []uint32{1, 0, 2}},
		{Name: "seed9-draws-2-and-1", Snapshot: sdk.Snapshot{Request: req(9), Endpoints: hot}, Want: []uint32{2, 1, 0}},
		{Name: "seed6-draws-2-and-0", Snapshot: sdk.Snapshot{Request: req(6), Endpoints: hot}, Want: []uint32{2, 0, 1}},
		{Name: "one-endpoint", Snapshot: sdk.Snapshot{Request: req(1), Endpoints: []sdk.Endpoint{ep(3)}}, Want: []uint32{0}},
		{Name: "none-healthy", Snapshot: sdk.Snapshot{Request: req(1), Endpoints: []sdk.Endpoint{{}}}, Want: []uint32{}},
	})
}
