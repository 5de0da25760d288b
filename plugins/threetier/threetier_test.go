package threetier

import (
	"cmp"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/sdk"
)

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig(nil)
	if err != nil || c != (Config{ImbalanceThreshold: 8, MatchThreshold: 0.10, CPUWeight: 0.8}) {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	c, err = ParseConfig([]byte(`{"imbalance_threshold": 10, "cpu_weight": 0.5}`))
	if err != nil || c != (Config{ImbalanceThreshold: 10, MatchThreshold: 0.10, CPUWeight: 0.5}) {
		t.Fatalf("%+v %v", c, err)
	}
	for _, bad := range []string{`{"match_threshold": 1.5}`, `{"cpu_weight": -0.1}`, `{"imbalance": 3}`, `{`} {
		var ce *sdk.ConfigError
		if _, err := ParseConfig([]byte(bad)); !errors.As(err, &ce) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

func TestMatchRate(t *testing.T) {
	for _, c := range []struct {
		gpu, cpu, bs, tokens uint32
		w, want              float64
	}{
		{16, 0, 16, 256, 0.8, 1},
		{2, 10, 16, 256, 0.8, 0.625}, // (2 + 8) · 16 / 256
		{1, 0, 16, 256, 0.8, 0.0625},
		{3, 0, 16, 160, 0.8, 0.3},
		{5, 5, 16, 0, 0.8, 0}, // empty prompt
	} {
		if got := MatchRate(c.gpu, c.cpu, c.bs, c.tokens, c.w); got != c.want {
			t.Errorf("%+v: %v", c, got)
		}
	}
}

// TestRankDoesNotAllocate: once the scratch has grown, ranking allocates nothing (the guest's GC).
func TestRankDoesNotAllocate(t *testing.T) {
	r := New(DefaultConfig())
	s := &sdk.Snapshot{Request: sdk.Request{PromptTokens: 256, BlockSize: 16, Seed: 1}}
	for i := range 16 {
		s.Endpoints = append(s.Endpoints, sdk.Endpoint{Index: uint32(i), Flags: sdk.FlagHealthy, GPUBlocks: uint32(i), Waiting: uint32(i % 5)})
	}
	out := make([]uint32, 0, 16)
	out, _ = r.Rank(s, out)
	if n := testing.AllocsPerRun(100, func() { out, _ = r.Rank(s, out[:0]) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

// refRank is the three-tier ranking written plainly from the package doc (one pass per rule, a
// multi-field comparator, slices.SortStableFunc): the reference Rank's packed keys and binary insertion
// sort must reproduce exactly.
func refRank(cfg Config, s *sdk.Snapshot) ([]uint32, Tier) {
	req := &s.Request
	type ep struct {
		idx        uint32
		load, key  uint64
		rate       float64
		over, drew bool
	}
	var eps []ep
	for _, e := range s.Endpoints {
		if e.Healthy() {
			eps = append(eps, ep{idx: e.Index, load: uint64(e.Waiting) + uint64(e.InFlightRequests),
				key:  sdk.TieKey(req.Seed, e.Index),
				rate: MatchRate(e.GPUBlocks, e.CPUBlocks, req.BlockSize, req.PromptTokens, cfg.CPUWeight)})
		}
	}
	if len(eps) == 0 {
		return nil, TierNone
	}
	minLoad := eps[0].load
	for _, e := range eps {
		minLoad = min(minLoad, e.load)
	}
	bestFree, bestOver := -1.0, -1.0
	for i := range eps {
		eps[i].over = float64(eps[i].load-minLoad) > cfg.ImbalanceThreshold
		if eps[i].over {
			bestOver = max(bestOver, eps[i].rate)
		} else {
			bestFree = max(bestFree, eps[i].rate)
		}
	}
	tier := TierMiss
	if bestFree >= cfg.MatchThreshold {
		tier = TierAffinity
	} else if bestOver >= cfg.MatchThreshold {
		tier = TierBalance
		rng := sdk.NewRand(req.Seed)
		a := rng.Intn(len(eps))
		b := rng.Intn(len(eps) - 1)
		if b >= a {
			b++
		}
		eps[a].drew, eps[b].drew = true, true
	}
	rest := func(a, b ep) int {
		if c := cmp.Compare(a.load, b.load); c != 0 {
			return c
		}
		if c := cmp.Compare(a.key, b.key); c != 0 {
			return c
		}
		return cmp.Compare(a.idx, b.idx)
	}
	slices.SortStableFunc(eps, func(a, b ep) int {
		switch tier {
		case TierAffinity:
			if a.over != b.over {
				if a.over {
					return 1
				}
				return -1
			}
			if !a.over && a.rate != b.rate {
				return -cmp.Compare(a.rate, b.rate)
			}
		case TierBalance:
			if a.drew != b.drew {
				if a.drew {
					return -1
				}
				return 1
			}
		}
		return rest(a, b)
	})
	out := make([]uint32, len(eps))
	for i, e := range eps {
		out[i] = e.idx
	}
	return out, tier
}

// TestRankMatchesReference: 20,000 random snapshots (1–100 endpoints, so both sorts run; small value
// ranges so loads, rates and overload ties are frequent; some unhealthy; every third snapshot
// matches only on busy endpoints, for the balance branch) rank exactly as refRank.
func TestRankMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	r := New(DefaultConfig())
	tiers := map[Tier]int{}
	for iter := range 20000 {
		n := 1 + rng.IntN(24)
		if iter%10 == 0 {
			n = 1 + rng.IntN(100)
		}
		s := &sdk.Snapshot{Request: sdk.Request{PromptTokens: uint32(rng.IntN(300)), BlockSize: 16, Seed: rng.Uint64()}}
		for i := range n {
			e := sdk.Endpoint{Index: uint32(i), GPUBlocks: uint32(rng.IntN(4)), CPUBlocks: uint32(rng.IntN(3)),
				Waiting: uint32(rng.IntN(12)), InFlightRequests: uint32(rng.IntN(4))}
			if rng.IntN(10) != 0 {
				e.Flags = sdk.FlagHealthy
			}
			if rng.IntN(4) == 0 || (iter%3 == 0 && e.Waiting < 10) { // every third: only busy ones match
				e.GPUBlocks, e.CPUBlocks = 0, 0
			}
			s.Endpoints = append(s.Endpoints, e)
		}
		want, wantTier := refRank(r.Config, s)
		got, gotTier := r.Rank(s, nil)
		if gotTier != wantTier || !slices.Equal(got, want) {
			t.Fatalf("iter %d: got %v %v, want %v %v", iter, gotTier, got, wantTier, want)
		}
		tiers[gotTier]++
	}
	for _, tr := range []Tier{TierAffinity, TierBalance, TierMiss} {
		if tiers[tr] < 500 {
			t.Errorf("only %d snapshots took %v: %v", tiers[tr], tr, tiers)
		}
	}
}
