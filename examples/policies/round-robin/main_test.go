package main

import (
	"testing"

	"github.com/kvgate/kvgate/sdk"
	"github.com/kvgate/kvgate/sdk/sdktest"
)

func ep(waiting uint32) sdk.Endpoint { return sdk.Endpoint{Flags: sdk.FlagHealthy, Waiting: waiting} }

func TestRoundRobin(t *testing.T) {
	fleet := []sdk.Endpoint{ep(0), ep(0), ep(0)}
	cases := []sdktest.Case{
		{Name: "seq4-starts-at-1", Snapshot: sdk.Snapshot{Request: sdk.Request{Seq: 4}, Endpoints: fleet}, Want: []uint32{1, 2, 0}},
		{Name: "skips-unhealthy", Snapshot: sdk.Snapshot{Request: sdk.Request{Seq: 1},
			Endpoints: []sdk.Endpoint{ep(0), {}, ep(0)}}, Want: []uint32{2, 0}},
		{Name: "none-healthy", Snapshot: sdk.Snapshot{Endpoints: []sdk.Endpoint{{}}}, Want: []uint32{}},
	}
	// vllm-project/router#179 ( one of 8 engines took every concurrent identical
	// prompt): 8 identical prompts with sequence numbers 0..7 put each endpoint first exactly once.
	eight := make([]sdk.Endpoint, 8)
	for i := range eight {
		eight[i] = ep(0)
	}
	for seq := uint64(0); seq < 8; seq++ {
		want := make([]uint32, 8)
		for k := range want {
			want[k] = uint32((seq + uint64(k)) % 8)
		}
		cases = append(cases, sdktest.Case{Name: "identical-burst-seq" + string(rune('0'+seq)),
			Snapshot: sdk.Snapshot{Request: sdk.Request{Seq: seq, PromptTokens: 64, BlockSize: 16}, Endpoints: eight}, Want: want})
	}
	sdktest.Run(t, func() sdk.Policy { return &Policy{} }, ".", cases)
}
