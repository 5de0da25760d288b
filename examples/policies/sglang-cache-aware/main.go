// Command sglang-cache-aware is an example kvgate routing policy reproducing SGLang's cache_aware router
// as SMG (the successor of sgl-model-gateway) runs it, with SMG's per-request load gate:
//
//   - match rate = (GPU + CPU-only matched blocks) × block size / prompt tokens (SGLang's router tree
//     has no tiers);
//   - if the best rate > cache_threshold (strict, default 0.3) the best-matching endpoint is selected
//     (ties: lower load, then sdk.TieKey); otherwise the endpoint with the smallest cache, for which
//     ABI v1's closest field is the lowest KV-cache utilization (ties: lower load, then key);
//   - per-request gate: with load = gateway in-flight requests (SMG counts router in-flight requests)
//     and mean = the healthy endpoints' mean load, the selection spills to the least-loaded endpoint when
//     its load > mean × balance_rel (1.5) and > mean + balance_abs (64);
//   - ranking: the selected endpoint, then the others by match rate (higher first), then load, then key.
//
// It keeps SGLang's known weakness on purpose (a miss goes to the smallest cache even when it is busy,
// sglang PR #14305) so the benchmark can compare it with kvgate's three-tier default.
package main

import (
	"cmp"
	"slices"

	"github.com/kvgate/kvgate/sdk"
)

// Config is the policy's JSON config.
type Config struct {
	CacheThreshold float64 // cache_threshold: match rate needed for affinity (strictly greater)
	BalanceAbs     float64 // balance_abs: requests above the mean before spilling
	BalanceRel     float64 // balance_rel: multiple of the mean before spilling
}

type item struct {
	group uint8
	rate  float64
	load  uint64
	key   uint64
	util  float32
	idx   uint32
}

// Policy is the SGLang/SMG cache-aware policy.
type Policy struct {
	cfg   Config
	items []item
}

// Init reads cache_threshold, balance_abs and balance_rel (defaults 0.3, 64, 1.5).
func (p *Policy) Init(config []byte) error {
	p.cfg = Config{CacheThreshold: 0.3, BalanceAbs: 64, BalanceRel: 1.5}
	return sdk.DecodeConfig(config,
		sdk.Field{Name: "cache_threshold", Dst: &p.cfg.CacheThreshold, Min: 0, Max: 1},
		sdk.Field{Name: "balance_abs", Dst: &p.cfg.BalanceAbs, Min: 0, Max: 1e9},
		sdk.Field{Name: "balance_rel", Dst: &p.cfg.BalanceRel, Min: 1, Max: 1e9},
	)
}

// cmpRest ranks by group, then the higher match rate, then as cmpLoad.
func cmpRest(a, b item) int {
	return cmp.Or(cmp.Compare(a.group, b.group), cmp.Compare(b.rate, a.rate), cmpLoad(a, b))
}

// cmpLoad ranks lower load first, then the tie key, then the index.
func cmpLoad(a, b item) int {
	return cmp.Or(cmp.Compare(a.load, b.load), cmp.Compare(a.key, b.key), cmp.Compare(a.idx, b.idx))
}

// better reports whether a is a better affinity pick than b (rate, then load, then key).
func better(a, b *item) bool {
	if a.rate != b.rate {
		return a.rate > b.rate
	}
	return cmpLoad(*a, *b) < 0
}

// smaller reports whether a is a better miss pick than b (lower utilization, then load, then key).
func smaller(a, b *item) bool {
	if a.util != b.util {
		return a.util < b.util
	}
	return cmpLoad(*a, *b) < 0
}

// Choose implements the selection, the per-request gate and the ranking described in the package doc.
func (p *Policy) Choose(s *sdk.Snapshot, r *sdk.Ranking) error {
	req := &s.Request
	p.items = p.items[:0]
	var total uint64
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if !e.Healthy() {
			continue
		}
		var rate float64
		if req.PromptTokens > 0 {
			rate = float64(float64(uint64(e.GPUBlocks)+uint64(e.CPUBlocks))*float64(req.BlockSize)) / float64(req.PromptTokens)
		}
		load := uint64(e.InFlightRequests)
		total += load
		p.items = append(p.items, item{group: 1, rate: rate, load: load, key: sdk.TieKey(req.Seed, e.Index),
			util: e.KVCacheUtilization, idx: e.Index})
	}
	n := len(p.items)
	if n == 0 {
		return nil
	}
	best, least, small := 0, 0, 0
	for i := 1; i < n; i++ {
		if better(&p.items[i], &p.items[best]) {
			best = i
		}
		if cmpLoad(p.items[i], p.items[least]) < 0 {
			least = i
		}
		if smaller(&p.items[i], &p.items[small]) {
			small = i
		}
	}
	sel := small
	if p.items[best].rate > p.cfg.CacheThreshold {
		sel = best
	}
	mean := float64(total) / float64(n)
	if l := float64(p.items[sel].load); l > mean*p.cfg.BalanceRel && l > mean+p.cfg.BalanceAbs {
		sel = least
	}
	p.items[sel].group = 0
	slices.SortFunc(p.items, cmpRest)
	for _, it := range p.items {
		r.Add(it.idx)
	}
	return nil
}

func init() { sdk.Register(&Policy{}) }

func main() {}
