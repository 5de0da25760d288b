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
	group uint8   // 0 ranks before 1 (affinity: overloaded; balance: not drawn)
	rate  float64 // match rate, higher first (affinity only, group 0 only)
	load  uint64  // lower first
	key   uint64  // seeded tie-break, lower first
	idx   uint32
}

// before reports whether a ranks before b in the given branch. One comparison serves every branch so
// Rank needs no fix-up passes (each guest loop iteration costs ~25 ns with interruption on).
func before(a, b *item, tier Tier) bool {
	if tier != TierMiss && a.group != b.group {
		return a.group < b.group
	}
	if tier == TierAffinity && a.group == 0 && a.rate != b.rate {
		return a.rate > b.rate
	}
	if a.load != b.load {
		return a.load < b.load
	}
	if a.key != b.key {
		return a.key < b.key
	}
	return a.idx < b.idx
}

// sortItems sorts by before: insertion sort for small fleets (direct calls; Go's wasm code makes the
// indirect comparator calls of slices.SortFunc costly), pdqsort above.
func sortItems(items []item, tier Tier) {
	if len(items) > 64 {
		slices.SortFunc(items, func(a, b item) int {
			if before(&a, &b, tier) {
				return -1
			}
			if before(&b, &a, tier) {
				return 1
			}
			return 0
		})
		return
	}
	for i := 1; i < len(items); i++ {
		x := items[i]
		j := i
		for j > 0 && before(&x, &items[j-1], tier) {
			items[j] = items[j-1]
			j--
		}
		items[j] = x
	}
}

// Ranker ranks snapshots with one Config, reusing its scratch.
type Ranker struct {
	Config Config // thresholds and weights every Rank call uses
	items  []item
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
		items = append(items, item{
			rate: MatchRate(e.GPUBlocks, e.CPUBlocks, req.BlockSize, req.PromptTokens, cfg.CPUWeight),
			load: load,
			key:  sdk.TieKey(req.Seed, e.Index),
			idx:  e.Index,
		})
	}
	r.items = items
	if len(items) == 0 {
		return out, TierNone
	}
	bestFree, bestOver := -1.0, -1.0
	for i := range items {
		it := &items[i]
		if float64(it.load-minLoad) > cfg.ImbalanceThreshold {
			it.group = 1
			bestOver = max(bestOver, it.rate)
		} else {
			bestFree = max(bestFree, it.rate)
		}
	}
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
			items[i].group = 1
		}
		items[a].group, items[b].group = 0, 0
	default:
		tier = TierMiss
	}
	sortItems(items, tier)
	for i := range items {
		out = append(out, items[i].idx)
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
