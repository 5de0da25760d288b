package plugins

import (
	"context"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/plugins/threetier"
	"github.com/kvgate/kvgate/sdk"
)

// Other routers' reported failure modes (upstream issues named per case) as hand-worked three-tier rankings with the default
// config (imbalance 8, match 0.10, CPU weight 0.8). Prompts are 256 tokens = 16 blocks of 16, so a
// match of m GPU blocks has rate m/16. Where the seeded generator decides, the expected values were
// computed with an independent Python SplitMix64 (seed 42: P2C over 4 draws positions (2,0); seed 3
// draws (0,3); tie keys for seed 42 order the endpoints 3,2,0,1).
type rankCase struct {
	name string
	req  sdk.Request
	eps  []sdk.Endpoint
	want []int
	tier threetier.Tier
}

func hep(gpu, cpu, waiting, inflight uint32) sdk.Endpoint {
	return sdk.Endpoint{Flags: sdk.FlagHealthy, GPUBlocks: gpu, CPUBlocks: cpu, Waiting: waiting, InFlightRequests: inflight}
}

func req256(seed uint64) sdk.Request {
	return sdk.Request{Seq: 1, PromptTokens: 256, PromptBlocks: 16, BlockSize: 16, Seed: seed}
}

var failureCases = []rankCase{
	{
		// vllm-project/router PR #238: loads [100,0,0], prefix on idle endpoint 2. Only endpoint 0 is
		// overloaded (100−0 > 8); affinity holds for the others: 2 (rate 1), 1 (rate 0), then 0.
		name: "fleet-imbalance-keeps-affinity", req: req256(42),
		eps:  []sdk.Endpoint{hep(0, 0, 100, 0), hep(0, 0, 0, 0), hep(16, 0, 0, 0)},
		want: []int{2, 1, 0}, tier: threetier.TierAffinity,
	},
	{
		// sglang PR #14305: a miss must not go to the busy endpoint holding the smaller tree. Endpoint 0
		// matches 1 block (rate 0.0625 < 0.10) with load 50; endpoint 1 is idle: least load → [1,0].
		name: "miss-avoids-busy-small-tree", req: req256(42),
		eps:  []sdk.Endpoint{hep(1, 0, 40, 10), hep(0, 0, 0, 0)},
		want: []int{1, 0}, tier: threetier.TierMiss,
	},
	{
		// Prefix only on overloaded endpoint 0 (load 40): balance. Seed 42 draws positions 2 and 0: the
		// less loaded (2, load 0) first, then 0, then the rest by load: 1 (2), 3 (5).
		name: "prefix-on-overloaded-p2c-seed42", req: req256(42),
		eps:  []sdk.Endpoint{hep(16, 0, 40, 0), hep(0, 0, 2, 0), hep(0, 0, 0, 0), hep(0, 0, 5, 0)},
		want: []int{2, 0, 1, 3}, tier: threetier.TierBalance,
	},
	{
		// Same fleet, seed 3 draws positions 0 and 3: 3 (load 5) before 0 (load 40), then 2 (0), 1 (2).
		name: "prefix-on-overloaded-p2c-seed3", req: req256(3),
		eps:  []sdk.Endpoint{hep(16, 0, 40, 0), hep(0, 0, 2, 0), hep(0, 0, 0, 0), hep(0, 0, 5, 0)},
		want: []int{3, 0, 2, 1}, tier: threetier.TierBalance,
	},
	{
		// Equal loads, nothing matches: ties go to the seeded keys (seed 42 orders 3,2,0,1), not to
		// position 0, so a burst of distinct misses spreads.
		name: "miss-ties-seeded", req: req256(42),
		eps:  []sdk.Endpoint{hep(0, 0, 1, 0), hep(0, 0, 1, 0), hep(0, 0, 1, 0), hep(0, 0, 1, 0)},
		want: []int{3, 2, 0, 1}, tier: threetier.TierMiss,
	},
	{
		// Affinity order: rate first, then lower load: 0 and 2 both rate 0.5 (2 has load 1 < 3), then 1.
		name: "affinity-rate-then-load", req: req256(42),
		eps:  []sdk.Endpoint{hep(8, 0, 3, 0), hep(2, 0, 0, 0), hep(8, 0, 0, 1)},
		want: []int{2, 0, 1}, tier: threetier.TierAffinity,
	},
	{
		// CPU tier: endpoint 0 has 2 GPU + 10 CPU-only blocks: (2 + 0.8·10)·16/256 = 0.625 beats 0.5.
		name: "cpu-tier-weighted", req: req256(42),
		eps:  []sdk.Endpoint{hep(2, 10, 1, 0), hep(8, 0, 1, 0)},
		want: []int{0, 1}, tier: threetier.TierAffinity,
	},
	{
		// Empty prompt (ray#64573's ZeroDivisionError): match rates are 0 → least load: 1, 2, 0.
		name: "empty-prompt", req: sdk.Request{BlockSize: 16, Seed: 42},
		eps:  []sdk.Endpoint{hep(4, 0, 3, 0), hep(0, 0, 1, 0), hep(0, 0, 2, 0)},
		want: []int{1, 2, 0}, tier: threetier.TierMiss,
	},
	{
		name: "one-candidate", req: req256(42),
		eps:  []sdk.Endpoint{hep(0, 0, 30, 5)},
		want: []int{0}, tier: threetier.TierMiss,
	},
	{
		name: "no-healthy-candidate", req: req256(42),
		eps:  []sdk.Endpoint{{GPUBlocks: 16}, {Waiting: 1}},
		want: []int{}, tier: threetier.TierNone,
	},
	{
		// Unhealthy endpoint 1 (idle, full match) is left out; the overload gate ignores it too.
		name: "unhealthy-left-out", req: req256(42),
		eps:  []sdk.Endpoint{hep(0, 0, 5, 0), {GPUBlocks: 16}, hep(0, 0, 1, 0)},
		want: []int{2, 0}, tier: threetier.TierMiss,
	},
}

func nativeRank(cfg threetier.Config, s *sdk.Snapshot) ([]int, threetier.Tier) {
	r := threetier.New(cfg)
	idx, tier := r.Rank(s, nil)
	out := make([]int, len(idx))
	for i, v := range idx {
		out[i] = int(v)
	}
	return out, tier
}

func snapshotOf(c rankCase) *sdk.Snapshot {
	s := &sdk.Snapshot{Request: c.req, Endpoints: slices.Clone(c.eps)}
	for i := range s.Endpoints {
		s.Endpoints[i].Index = uint32(i)
	}
	return s
}

func TestFailureModesNativeAndWasm(t *testing.T) {
	h := newTestHost(t, Options{})
	for _, c := range failureCases {
		t.Run(c.name, func(t *testing.T) {
			got, tier := nativeRank(threetier.DefaultConfig(), snapshotOf(c))
			if !slices.Equal(got, c.want) || tier != c.tier {
				t.Errorf("native: got %v (%s), want %v (%s)", got, tier, c.want, c.tier)
			}
			wgot, info := h.Rank(context.Background(), "m", snapshotOf(c))
			if info.Fallback || !slices.Equal(wgot, c.want) {
				t.Errorf("wasm: got %v %+v, want %v", wgot, info, c.want)
			}
		})
	}
}

// TestBurstSpillsToExactlyOneMore simulates the index's speculative entries: each routed request adds
// one in-flight request and a full speculative match (all 16 blocks on GPU) to the endpoint it chose.
// 16 identical new prompts on 4 idle endpoints: the first is a miss, the next 8 follow the speculative
// match until the chosen endpoint's load 9 exceeds min load 0 by more than 8; request 10 spills (balance:
// power of two choices, never the hot endpoint first), and the last 7 follow that second endpoint
// (load ≤ 7, not overloaded). Hand-worked: 9 on one endpoint, 7 on exactly one other.
func TestBurstSpillsToExactlyOneMore(t *testing.T) {
	h := newTestHost(t, Options{})
	for _, mode := range []string{"native", "wasm"} {
		t.Run(mode, func(t *testing.T) {
			eps := []sdk.Endpoint{hep(0, 0, 0, 0), hep(0, 0, 0, 0), hep(0, 0, 0, 0), hep(0, 0, 0, 0)}
			var chosen []int
			for i := 0; i < 16; i++ {
				s := snapshotOf(rankCase{req: req256(uint64(1000 + i)), eps: eps})
				var got []int
				if mode == "native" {
					got, _ = nativeRank(threetier.DefaultConfig(), s)
				} else {
					var info RankInfo
					got, info = h.Rank(context.Background(), "m", s)
					if info.Fallback {
						t.Fatalf("fallback: %+v", info)
					}
				}
				c := got[0]
				chosen = append(chosen, c)
				eps[c].InFlightRequests++
				eps[c].GPUBlocks = 16
			}
			first, second := chosen[0], chosen[9]
			for i, c := range chosen {
				want := first
				if i >= 9 {
					want = second
				}
				if c != want || first == second {
					t.Fatalf("request %d went to %d; sequence %v (want 9×%d then 7×one other)", i, c, chosen, first)
				}
			}
		})
	}
}

func newTestHost(t testing.TB, opts Options) *Host {
	t.Helper()
	if opts.CacheDir == "" {
		opts.CacheDir = testCacheDir
	}
	h, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	return h
}
