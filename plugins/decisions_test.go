package plugins

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/plugins/internal/threetier"
	"github.com/kvgate/kvgate/sdk"
)

// decisionFile is one routing-decision golden, a JSON file in testdata/decisions: a snapshot (the request
// and each endpoint, in index order) and the expected ranking and three-tier branch under the default
// config (imbalance 8, match 0.10, CPU weight 0.8). Why says where the case comes from and how its answer
// was worked out by hand (seeded draws from an independent Python SplitMix64); cases are data, the driver
// is TestRoutingDecisions.
type decisionFile struct {
	Why       string             `json:"why"`
	Request   decisionRequest    `json:"request"`
	Endpoints []decisionEndpoint `json:"endpoints"`
	Want      decisionWant       `json:"want"`
}

type decisionRequest struct {
	Seq          uint64 `json:"seq"`
	PromptTokens uint32 `json:"prompt_tokens"`
	PromptBlocks uint32 `json:"prompt_blocks"`
	BlockSize    uint32 `json:"block_size"`
	Seed         uint64 `json:"seed"`
}

type decisionEndpoint struct {
	Healthy          bool   `json:"healthy"`
	GPUBlocks        uint32 `json:"gpu_blocks"`
	CPUBlocks        uint32 `json:"cpu_blocks"`
	Waiting          uint32 `json:"waiting"`
	InFlightRequests uint32 `json:"inflight_requests"`
}

type decisionWant struct {
	Ranking []int  `json:"ranking"`
	Tier    string `json:"tier"` // none, affinity, balance or miss (threetier.Tier.String)
}

func (d decisionFile) snapshot() *sdk.Snapshot {
	s := &sdk.Snapshot{Request: sdk.Request{Seq: d.Request.Seq, PromptTokens: d.Request.PromptTokens,
		PromptBlocks: d.Request.PromptBlocks, BlockSize: d.Request.BlockSize, Seed: d.Request.Seed}}
	for i, e := range d.Endpoints {
		ep := sdk.Endpoint{Index: uint32(i), GPUBlocks: e.GPUBlocks, CPUBlocks: e.CPUBlocks, Waiting: e.Waiting,
			InFlightRequests: e.InFlightRequests}
		if e.Healthy {
			ep.Flags = sdk.FlagHealthy
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	return s
}

// TestRoutingDecisions runs every testdata/decisions/*.json case through the native three-tier ranking
// and the built-in Wasm module: both must give the file's ranking, the native one the file's branch.
// Add a case by adding a file.
func TestRoutingDecisions(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "decisions", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no decision files: %v", err)
	}
	h := newTestHost(t, Options{})
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".json"), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var d decisionFile
			dec := json.NewDecoder(strings.NewReader(string(raw)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&d); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			want := d.Want.Ranking
			if want == nil {
				want = []int{}
			}
			got, tier := nativeRank(threetier.DefaultConfig(), d.snapshot())
			if !slices.Equal(got, want) || tier.String() != d.Want.Tier {
				t.Errorf("native: got %v (%s), want %v (%s)", got, tier, want, d.Want.Tier)
			}
			wgot, info := h.Rank(context.Background(), "m", d.snapshot())
			if info.Fallback || !slices.Equal(wgot, want) {
				t.Errorf("wasm: got %v %+v, want %v", wgot, info, want)
			}
		})
	}
}
