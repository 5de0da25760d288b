// Package threetier is kvgate's default routing policy (DESIGN.md, "The default policy: three-tier"),
// written once against the SDK types: the host calls it natively as the fallback ranking and the embedded
// Wasm module (plugins/builtin/threetier) registers the same code with sdk.Register, so both rank every
// snapshot identically.
//
// Per request, with load = waiting requests + gateway in-flight requests, over the healthy endpoints:
//   - overloaded: load − lowest load > ImbalanceThreshold (a per-endpoint gate);
//   - affinity: among non-overloaded endpoints, match rate = (GPU blocks + CPUWeight × CPU-only blocks) ×
//     block size / prompt tokens; if the best ≥ MatchThreshold, the non-overloaded endpoints by match rate
//     (higher first), then by lower load, then the overloaded ones by load;
//   - balance: if only overloaded endpoints reach MatchThreshold, power of two choices: two distinct
//     endpoints drawn with sdk.Rand seeded by Request.Seed, the less loaded first, then the rest by load;
//   - miss: every endpoint by load.
//
// Remaining ties go to lower load, then to sdk.TieKey(seed, index) (lower first). Unhealthy endpoints are
// left out of the ranking; with none healthy the ranking is empty. Rank does not allocate once its scratch
// has grown to the fleet size. A Ranker is not safe for concurrent use.
package threetier

import (
	"math"
	"slices"

	"github.com/kvgate/kvgate/sdk"
)

// Config holds the three-tier parameters; the JSON keys are imbalance_threshold, match_threshold and
// cpu_weight.
type Config struct {
	ImbalanceThreshold float64 // requests; an endpoint is overloaded when load − min load exceeds it
	MatchThreshold     float64 // match rate in [0,1] the best non-overloaded endpoint needs for affinity
	CPUWeight          float64 // credit of one CPU-only matched block relative to a GPU block, [0,1]
}

// DefaultConfig returns the documented defaults: imbalance threshold 8, match threshold 0.10, CPU
// weight 0.8.
func DefaultConfig() Config {
	return Config{ImbalanceThreshold: 8, MatchThreshold: 0.10, CPUWeight: 0.8}
}

// ParseConfig decodes a JSON config over DefaultConfig (empty input gives the defaults). Unknown keys,
// duplicates and out-of-range values are *sdk.ConfigError.
func ParseConfig(data []byte) (Config, error) {
	c := DefaultConfig()
	err := sdk.DecodeConfig(data,
		sdk.Field{Name: "imbalance_threshold", Dst: &c.ImbalanceThreshold, Min: 0, Max: 1e9},
		sdk.Field{Name: "match_threshold", Dst: &c.MatchThreshold, Min: 0, Max: 1},
		sdk.Field{Name: "cpu_weight", Dst: &c.CPUWeight, Min: 0, Max: 1},
	)
	return c, err
}

// Tier says which branch of the algorithm ranked a request.
type Tier uint8

// Branches of the algorithm.
const (
	TierNone     Tier = iota // no healthy endpoint
	TierAffinity             // best non-overloaded match rate ≥ MatchThreshold
	TierBalance              // only overloaded endpoints match: power of two choices
	TierMiss                 // nothing matches: least load
)

// String returns the branch name.
func (t Tier) String() string {
	return [...]string{"none", "affinity", "balance", "miss"}[t]
}

type item struct {
	// hi is the first sort key: group (0 first) in bit 63 and, in the affinity branch for group 0, the
	// match rate's float64 bits subtracted from the largest positive bits (higher rate first; a
	// non-negative float64 orders like its bits). It is 0 in the miss branch.
	hi   uint64
	rate float64 // match rate (never NaN, never negative)
	load uint64  // lower first
	key  uint64  // seeded tie-break, lower first
	idx  uint32
}

// maxRateBits is the bit pattern every non-negative finite match rate's bits are at most.
const maxRateBits = 1<<63 - 1

// before reports whether a ranks before b: hi, then lower load, then lower tie key, then lower index.
func before(a, b *item) bool {
	// Every comparison is computed first and then combined, so the compiler can fold the || and &&
	// into boolean arithmetic: in Go's wasm code each taken branch is a br_table dispatch.
	hlt, heq := a.hi < b.hi, a.hi == b.hi
	llt, leq := a.load < b.load, a.load == b.load
	klt, keq := a.key < b.key, a.key == b.key
	ilt := a.idx < b.idx
	return hlt || heq && (llt || leq && (klt || keq && ilt))
}

// sortPerm orders perm (positions in items) by before. Small fleets use a binary insertion sort: Go's
// wasm code pays for every loop iteration and comparison (the comparison loop was a third of a 16-endpoint
// call), and binary search needs ~45 comparisons at 16 endpoints where linear insertion needs ~80; the
// moves are a memmove of 4-byte positions. pdqsort above 64.
func sortPerm(perm []uint32, items []item) {
	if len(perm) > 64 {
		slices.SortFunc(perm, func(a, b uint32) int {
			if before(&items[a], &items[b]) {
				return -1
			}
			if before(&items[b], &items[a]) {
				return 1
			}
			return 0
		})
		return
	}
	for i := 1; i < len(perm); i++ {
		x := perm[i]
		xp := &items[x]
		lo, hi := 0, i
		for lo < hi {
			m := int(uint(lo+hi) >> 1)
			if before(xp, &items[perm[m]]) {
				hi = m
			} else {
				lo = m + 1
			}
		}
		if lo < i {
			copy(perm[lo+1:i+1], perm[lo:i])
			perm[lo] = x
		}
	}
}

// Ranker ranks snapshots with one Config, reusing its scratch.
type Ranker struct {
	Config Config // thresholds and weights every Rank call uses
	items  []item
	perm   []uint32 // positions in items, sorted by Rank
}

// New returns a Ranker for cfg.
func New(cfg Config) *Ranker { return &Ranker{Config: cfg} }

// MatchRate returns (gpu + cpuWeight·cpu) × blockSize / promptTokens, or 0 for an empty prompt. Each
// product is rounded explicitly so no platform fuses it into an FMA (native and Wasm must agree bit for
// bit).
func MatchRate(gpu, cpu, blockSize, promptTokens uint32, cpuWeight float64) float64 {
	if promptTokens == 0 {
		return 0
	}
	credit := float64(gpu) + float64(cpuWeight*float64(cpu))
	return float64(credit*float64(blockSize)) / float64(promptTokens)
}

// Rank appends the ranking of s (Endpoint.Index values, best first) to out and returns it with the
// branch taken.
func (r *Ranker) Rank(s *sdk.Snapshot, out []uint32) ([]uint32, Tier) {
	cfg := &r.Config
	req := &s.Request
	items := r.items[:0]
	var minLoad uint64
	first := true
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if !e.Healthy() {
			continue
		}
		load := uint64(e.Waiting) + uint64(e.InFlightRequests)
		if first || load < minLoad {
			minLoad, first = load, false
		}
		// Fields are stored one by one: a 40-byte composite literal would be built aside and then
		// copied with memory.copy in Wasm.
		if len(items) == cap(items) {
			items = append(items, item{})
		} else {
			items = items[:len(items)+1]
		}
		it := &items[len(items)-1]
		it.rate = MatchRate(e.GPUBlocks, e.CPUBlocks, req.BlockSize, req.PromptTokens, cfg.CPUWeight)
		it.load = load
		it.key = sdk.TieKey(req.Seed, e.Index)
		it.idx = e.Index
	}
	r.items = items
	if len(items) == 0 {
		return out, TierNone
	}
	// One pass marks overload, fills perm and sets hi as the affinity branch (the common one) wants it;
	// the other branches rewrite hi. Every guest loop iteration counts.
	bestFree, bestOver := -1.0, -1.0
	perm := r.perm[:0]
	for i := range items {
		it := &items[i]
		if float64(it.load-minLoad) > cfg.ImbalanceThreshold {
			it.hi = 1 << 63
			bestOver = max(bestOver, it.rate)
		} else {
			it.hi = maxRateBits - math.Float64bits(it.rate)
			bestFree = max(bestFree, it.rate)
		}
		perm = append(perm, uint32(i))
	}
	r.perm = perm
	var tier Tier
	switch {
	case bestFree >= cfg.MatchThreshold:
		tier = TierAffinity
	case bestOver >= cfg.MatchThreshold:
		tier = TierBalance
		rng := sdk.NewRand(req.Seed)
		a := rng.Intn(len(items))
		b := rng.Intn(len(items) - 1)
		if b >= a {
			b++
		}
		for i := range items {
			items[i].hi = 1 << 63
		}
		items[a].hi, items[b].hi = 0, 0
	default:
		tier = TierMiss
		for i := range items {
			items[i].hi = 0
		}
	}
	sortPerm(perm, items)
	for _, p := range perm {
		out = append(out, items[p].idx)
	}
	return out, tier
}

// Policy is the sdk.Policy form of the three-tier ranker (what the embedded Wasm module registers).
type Policy struct {
	r Ranker
}

// Init parses the config (see ParseConfig).
func (p *Policy) Init(config []byte) error {
	c, err := ParseConfig(config)
	if err != nil {
		return err
	}
	p.r.Config = c
	return nil
}

// Choose ranks s into r.
func (p *Policy) Choose(s *sdk.Snapshot, r *sdk.Ranking) error {
	out, _ := p.r.Rank(s, r.AppendTo())
	r.Set(out)
	return nil
}
