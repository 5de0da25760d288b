package threetier

import (
	"cmp"
	"errors"
	"math"
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

// TestSortNetworks: by the 0-1 principle a comparator network sorts every input iff it sorts every
// input of zeros and ones; all 2^8 and 2^16 of them are checked.
func TestSortNetworks(t *testing.T) {
	for m := range 1 << 8 {
		var k [8]uint64
		for i := range k {
			k[i] = uint64(m >> i & 1)
		}
		sortNet8(&k)
		if !slices.IsSorted(k[:]) {
			t.Fatalf("sortNet8(%08b) = %v", m, k)
		}
	}
	for m := range 1 << 16 {
		var k [16]uint64
		for i := range k {
			k[i] = uint64(m >> i & 1)
		}
		sortNet16(&k)
		if !slices.IsSorted(k[:]) {
			t.Fatalf("sortNet16(%016b) = %v", m, k)
		}
	}
}

// TestRankPackedKeyLimits: snapshots built to defeat the packed keys, each ranked exactly as refRank:
// loads near 2^33 (one tie-key bit left, so prefixes tie), and long prompts where different match rates
// share the top 23 bits (the rate field). The test also checks that such collisions really occur.
func TestRankPackedKeyLimits(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	collisions := 0
	for iter := range 5000 {
		n := 2 + rng.IntN(40)
		cfg := DefaultConfig()
		cfg.CPUWeight = []float64{0.8, 0.7, 0.3, 1.0 / 3, 0}[rng.IntN(5)]
		s := &sdk.Snapshot{Request: sdk.Request{PromptTokens: 1<<20 + uint32(rng.IntN(1<<20)), BlockSize: 16, Seed: rng.Uint64()}}
		big := iter%2 == 0
		for i := range n {
			e := sdk.Endpoint{Index: uint32(i), Flags: sdk.FlagHealthy,
				GPUBlocks: 1<<15 + uint32(rng.IntN(64)), CPUBlocks: uint32(rng.IntN(64)), Waiting: uint32(rng.IntN(3))}
			if big {
				e.Waiting, e.InFlightRequests = math.MaxUint32-uint32(rng.IntN(2)), math.MaxUint32
				e.GPUBlocks = 0
			}
			s.Endpoints = append(s.Endpoints, e)
		}
		rates := map[uint64]float64{}
		for _, e := range s.Endpoints {
			r := MatchRate(e.GPUBlocks, e.CPUBlocks, 16, s.Request.PromptTokens, cfg.CPUWeight)
			if old, ok := rates[math.Float64bits(r)>>fieldLow]; ok && old != r {
				collisions++
			}
			rates[math.Float64bits(r)>>fieldLow] = r
		}
		want, wantTier := refRank(cfg, s)
		got, gotTier := New(cfg).Rank(s, nil)
		if gotTier != wantTier || !slices.Equal(got, want) {
			t.Fatalf("iter %d: got %v %v, want %v %v", iter, gotTier, got, wantTier, want)
		}
	}
	if collisions < 100 {
		t.Fatalf("only %d rate-field collisions: the test does not exercise the fallback", collisions)
	}
}

// TestRankOddConfigs: thresholds outside the documented ranges (negative, NaN, infinite, fractional)
// rank exactly as refRank's float comparisons; a CPU weight outside [0,1] takes rankFull.
func TestRankOddConfigs(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	cfgs := []Config{
		{ImbalanceThreshold: -1, MatchThreshold: 0.1, CPUWeight: 0.8},
		{ImbalanceThreshold: math.NaN(), MatchThreshold: 0.1, CPUWeight: 0.8},
		{ImbalanceThreshold: math.Inf(1), MatchThreshold: 0, CPUWeight: 0.8},
		{ImbalanceThreshold: 2.5, MatchThreshold: math.NaN(), CPUWeight: 0.8},
		{ImbalanceThreshold: 0, MatchThreshold: 1, CPUWeight: 1},
		{ImbalanceThreshold: 3, MatchThreshold: 0.2, CPUWeight: 2},
	}
	for iter := range 6000 {
		cfg := cfgs[iter%len(cfgs)]
		n := 2 + rng.IntN(30)
		s := &sdk.Snapshot{Request: sdk.Request{PromptTokens: uint32(rng.IntN(200)), BlockSize: 16, Seed: rng.Uint64()}}
		for i := range n {
			// Two healthy at least: with a negative threshold every endpoint is overloaded, and
			// refRank's power of two choices needs two.
			flags := uint32(rng.IntN(8)+7) / 8 // healthy 7 in 8
			if i < 2 {
				flags = sdk.FlagHealthy
			}
			s.Endpoints = append(s.Endpoints, sdk.Endpoint{Index: uint32(i), Flags: flags,
				GPUBlocks: uint32(rng.IntN(5)), CPUBlocks: uint32(rng.IntN(5)), Waiting: uint32(rng.IntN(9)), InFlightRequests: uint32(rng.IntN(3))})
		}
		want, wantTier := refRank(cfg, s)
		got, gotTier := New(cfg).Rank(s, nil)
		if gotTier != wantTier || !slices.Equal(got, want) {
			t.Fatalf("iter %d cfg %+v: got %v %v, want %v %v", iter, cfg, got, gotTier, want, wantTier)
		}
	}
}

// TestSortMerge: 17 to 1,100 distinct random keys (sorted by 16-networks and merged) come out as
// slices.Sort orders them, including keys at the top of the packed range.
func TestSortMerge(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 3000 {
		n := 17 + iter%48
		if iter%4 == 0 {
			n = 17 + rng.IntN(1100)
		}
		posMask := uint64(1)<<posBits(n) - 1
		all := make([]uint64, keysCap(n))
		keys := all[:n]
		for i := range keys {
			keys[i] = rng.Uint64()&^posMask | uint64(i)
			if keys[i]&group != 0 { // group 1 has no rate field
				keys[i] &= group | (1<<fieldLow - 1)
			}
			if rng.IntN(8) == 0 {
				keys[i] = group | (1<<fieldLow-1)&^posMask | uint64(i) // the largest key a snapshot can give
			}
		}
		want := slices.Clone(keys)
		slices.Sort(want)
		sortMerge(keys, all)
		if !slices.Equal(keys, want) {
			t.Fatalf("n=%d: got %x, want %x", n, keys, want)
		}
	}
}

// TestRankLargeFleets: random snapshots of 1 to 1,024 endpoints rank exactly as refRank and as
// rankFull (the path every fleet over 64 endpoints took before the packed keys grew position bits),
// and the packed keys decide nearly all of them (rankFull sets r.perm; the fast path leaves it empty).
func TestRankLargeFleets(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 1024))
	iters := 3000
	if testing.Short() {
		iters = 600
	}
	fast, tiers := 0, map[Tier]int{}
	for iter := range iters {
		n := 1 + rng.IntN(1024)
		if iter%8 == 0 {
			n = []int{64, 65, 128, 129, 256, 512, 1024}[iter/8%7]
		}
		maxLoad := []int{2, 41, 1000, 1 << 20}[iter%4]
		s := randomFleet(rng, n, maxLoad, iter%3 == 0, iter%5 == 1)
		r := New(DefaultConfig())
		want, wantTier := refRank(r.Config, s)
		got, gotTier := r.Rank(s, nil)
		if gotTier != wantTier || !slices.Equal(got, want) {
			t.Fatalf("iter %d (n=%d): got %v %v, want %v %v", iter, n, gotTier, got, wantTier, want)
		}
		if len(r.perm) == 0 {
			fast++
		}
		old, oldTier := New(r.Config).rankFull(s, nil)
		if oldTier != gotTier || !slices.Equal(old, got) {
			t.Fatalf("iter %d (n=%d): rankFull %v %v, Rank %v %v", iter, n, oldTier, old, gotTier, got)
		}
		tiers[gotTier]++
	}
	if fast < iters*9/10 {
		t.Errorf("the packed keys decided only %d of %d snapshots", fast, iters)
	}
	for _, tr := range []Tier{TierAffinity, TierBalance, TierMiss} {
		if tiers[tr] < iters/20 {
			t.Errorf("only %d snapshots took %v: %v", tiers[tr], tr, tiers)
		}
	}
	t.Logf("fast path %d of %d; branches %v", fast, iters, tiers)
}

// TestSortMergeEdgeKeys: the two-ended merge at every padded length from 32 to 2,048 keys, with the
// extreme keys a snapshot can give: 0 (the miss branch's load 0, tie bits 0, position 0, which the
// merges' low sentinels equal), the largest (group | 2^40−1 above the position) and long runs already
// in order or reversed, each sorted as slices.Sort sorts it.
func TestSortMergeEdgeKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(20, 48))
	for n := 17; n <= maxFast; n += 1 + n/16 {
		for variant := range 4 {
			posMask := uint64(1)<<posBits(n) - 1
			all := make([]uint64, keysCap(n))
			keys := all[:n]
			for i := range keys {
				switch variant {
				case 0: // small loads: many keys with the same high part, key 0 among them
					keys[i] = uint64(rng.IntN(3))<<posBits(n) | uint64(i)
				case 1: // ascending
					keys[i] = uint64(i)
				case 2: // descending, the largest keys a snapshot can give
					keys[i] = group | (1<<fieldLow-1)&^posMask | uint64(n-1-i)
				default: // zero and the largest mixed
					keys[i] = uint64(i)
					if rng.IntN(2) == 0 {
						keys[i] |= group | (1<<fieldLow-1)&^posMask
					}
				}
			}
			for j := range keys {
				if keys[j]&posMask == 0 {
					keys[j] = 0 // position 0's key is 0
				}
			}
			want := slices.Clone(keys)
			slices.Sort(want)
			sortMerge(keys, all)
			if !slices.Equal(keys, want) {
				t.Fatalf("n=%d variant %d: got %x, want %x", n, variant, keys, want)
			}
		}
	}
}

// TestRankFleetsTo2048: random snapshots of 1 to 2,049 endpoints (the fast path's whole range and the
// first size past it) rank exactly as refRank, in all three branches, with the default and two other
// configs.
func TestRankFleetsTo2048(t *testing.T) {
	rng := rand.New(rand.NewPCG(2048, 16))
	iters := 600
	if testing.Short() {
		iters = 150
	}
	sizes := []int{1, 2, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1023, 1024, 1025, 1364, 2047, 2048, 2049}
	cfgs := []Config{DefaultConfig(), {ImbalanceThreshold: 2, MatchThreshold: 0.3, CPUWeight: 0.5},
		{ImbalanceThreshold: 30, MatchThreshold: 0.05, CPUWeight: 1}}
	tiers := map[Tier]int{}
	for iter := range iters {
		n := 1 + rng.IntN(2049)
		if iter%3 == 0 {
			n = sizes[iter/3%len(sizes)]
		}
		maxLoad := []int{3, 61, 5000}[iter%3]
		s := randomFleet(rng, n, maxLoad, iter%4 == 1, iter%5 == 2)
		r := New(cfgs[iter%len(cfgs)])
		want, wantTier := refRank(r.Config, s)
		got, gotTier := r.Rank(s, nil)
		if gotTier != wantTier || !slices.Equal(got, want) {
			t.Fatalf("iter %d (n=%d, cfg %+v): got %v %v, want %v %v", iter, n, r.Config, gotTier, got, wantTier, want)
		}
		tiers[gotTier]++
	}
	for _, tr := range []Tier{TierAffinity, TierBalance, TierMiss} {
		if tiers[tr] < iters/20 {
			t.Errorf("only %d snapshots took %v: %v", tiers[tr], tr, tiers)
		}
	}
}

// randomFleet is a snapshot of n endpoints with random loads below maxLoad, health and GPU/CPU matches for a
// random prompt. balance clears the matches of endpoints under half of maxLoad (the balance tier's case),
// miss clears every match (a prompt no endpoint holds).
func randomFleet(rng *rand.Rand, n, maxLoad int, balance, miss bool) *sdk.Snapshot {
	s := &sdk.Snapshot{Request: sdk.Request{PromptTokens: uint32(rng.IntN(4097)), BlockSize: 16, Seed: rng.Uint64()}}
	blocks := int(s.Request.PromptTokens / 16)
	for i := range n {
		e := sdk.Endpoint{Index: uint32(i), Waiting: uint32(rng.IntN(maxLoad)), InFlightRequests: uint32(rng.IntN(21))}
		if rng.IntN(8) != 0 {
			e.Flags = sdk.FlagHealthy
		}
		if blocks > 0 && rng.IntN(3) == 0 {
			m := rng.IntN(blocks + 1)
			e.GPUBlocks = uint32(rng.IntN(m + 1))
			e.CPUBlocks = uint32(m) - e.GPUBlocks
		}
		if balance && e.Waiting < uint32(maxLoad)/2 || miss {
			e.GPUBlocks, e.CPUBlocks = 0, 0
		}
		s.Endpoints = append(s.Endpoints, e)
	}
	return s
}

// TestRankPrefixes: with Request.RankLimit = l, Rank returns exactly the first l entries of refRank's
// ranking (all of it when l ≥ the healthy count), in all three branches, for l from 1 to 20 and fleets
// of 1 to 1,364 endpoints: random ones, ones where many endpoints share one match rate (the prefix's
// boundary inside a run of equal rate fields) and ones with distinct rates inside one rate field (GPU
// against CPU blocks at a CPU weight just below 1), which the selection must not decide by load, and ones
// with two loads only (the boundary inside a class of keys equal but for their tie keys).
func TestRankPrefixes(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 16))
	iters := 4000
	if testing.Short() {
		iters = 800
	}
	cfgs := []Config{DefaultConfig(), {ImbalanceThreshold: 2, MatchThreshold: 0.3, CPUWeight: 0.5},
		{ImbalanceThreshold: 30, MatchThreshold: 0.05, CPUWeight: 0.9999}}
	tiers, selected, limited := map[Tier]int{}, 0, 0
	for iter := range iters {
		n := 1 + rng.IntN(300)
		if iter%4 == 0 {
			n = []int{16, 31, 32, 33, 64, 65, 256, 1024, sdk.MaxEndpoints}[iter/4%9]
		}
		maxLoad := []int{3, 61, 5000, 1 << 20}[iter%4]
		var s *sdk.Snapshot
		switch iter % 7 {
		case 0, 1, 2:
			s = randomFleet(rng, n, maxLoad, iter%4 == 1, iter%5 == 2)
		case 3, 4: // a shared prefix: most matching endpoints hold the same blocks
			s = randomFleet(rng, n, maxLoad, false, false)
			s.Request.PromptTokens = 4096
			for i := range s.Endpoints {
				if e := &s.Endpoints[i]; rng.IntN(4) != 0 {
					e.GPUBlocks, e.CPUBlocks = 100, uint32(rng.IntN(2))
				}
			}
		case 6: // two loads only: the prefix's boundary inside a class of equal keys decided by tie keys
			s = randomFleet(rng, n, maxLoad, iter%2 == 0, false)
			for i := range s.Endpoints {
				e := &s.Endpoints[i]
				e.Waiting, e.InFlightRequests = 5+uint32(rng.IntN(2)), 0
				if rng.IntN(2) == 0 {
					e.GPUBlocks, e.CPUBlocks = 0, 0
				}
			}
		default: // rates 200 and 199.9999 blocks (cfg 2), in one rate field
			s = randomFleet(rng, n, maxLoad, false, false)
			s.Request.PromptTokens = 4096
			for i := range s.Endpoints {
				e := &s.Endpoints[i]
				e.GPUBlocks, e.CPUBlocks = 200, 0
				if rng.IntN(2) == 0 {
					e.GPUBlocks, e.CPUBlocks = 199, 1
				}
			}
		}
		r := New(cfgs[iter%len(cfgs)])
		want, wantTier := refRank(r.Config, s)
		for _, l := range []int{1, 2, 3, 8, 9, 15, 16, 20} {
			s.Request.RankLimit = uint32(l)
			r.perm = r.perm[:0]
			got, gotTier := r.Rank(s, []uint32{7})
			w := want[:min(l, len(want))]
			if gotTier != wantTier || got[0] != 7 || !slices.Equal(got[1:], w) {
				t.Fatalf("iter %d (n=%d, l=%d, cfg %+v): got %v %v, want %v %v", iter, n, l, r.Config, gotTier, got[1:], wantTier, w)
			}
			if l < len(want) {
				limited++
				if len(r.perm) == 0 {
					selected++
				}
			}
		}
		s.Request.RankLimit = 0
		if got, _ := r.Rank(s, nil); !slices.Equal(got, want) {
			t.Fatalf("iter %d (n=%d): RankLimit 0 gave %v, want %v", iter, n, got, want)
		}
		tiers[wantTier]++
	}
	for _, tr := range []Tier{TierAffinity, TierBalance, TierMiss} {
		if tiers[tr] < iters/20 {
			t.Errorf("only %d snapshots took %v: %v", tiers[tr], tr, tiers)
		}
	}
	t.Logf("limited rankings %d, decided by the packed keys' selection or sort %d; branches %v", limited, selected, tiers)
}
