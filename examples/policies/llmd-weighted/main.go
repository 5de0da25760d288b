// Command llmd-weighted is an example kvgate routing policy reproducing llm-d's default scoring profile
// (llm-d-router defaults.go): a weighted sum of three scorers and a max-score picker.
//
//   - prefix = (gpu_weight·GPU blocks + cpu_weight·CPU-only blocks) / prompt blocks (matched blocks from
//     block 0, each weighted by its best tier: GPU 1.0, CPU 0.8), 0 for a prompt without full blocks;
//   - queue = min-max normalised waiting requests: (max − waiting) / (max − min), 1.0 for all when equal;
//   - kv = 1 − KV-cache utilization;
//   - score = prefix_weight·prefix + queue_weight·queue + kv_weight·kv (3, 2, 2).
//
// Ranking: healthy endpoints by score, higher first; llm-d's picker shuffles before sorting, so ties
// are random: here they go to sdk.TieKey (seeded by the request).
package main

import (
	"github.com/kvgate/kvgate/sdk"
	"github.com/kvgate/kvgate/sdk/rank"
)

// Config holds the scorer weights (JSON keys in parentheses).
type Config struct {
	PrefixWeight float64 // prefix_weight, default 3
	QueueWeight  float64 // queue_weight, default 2
	KVWeight     float64 // kv_weight, default 2
	GPUWeight    float64 // gpu_weight: credit of a GPU block, default 1.0
	CPUWeight    float64 // cpu_weight: credit of a CPU-only block, default 0.8
}

// Policy is the llm-d weighted-scorers policy.
type Policy struct {
	cfg  Config
	rank rank.Ranker
}

// Init reads the weights over their defaults.
func (p *Policy) Init(config []byte) error {
	p.cfg = Config{PrefixWeight: 3, QueueWeight: 2, KVWeight: 2, GPUWeight: 1, CPUWeight: 0.8}
	return sdk.DecodeConfig(config,
		sdk.Field{Name: "prefix_weight", Dst: &p.cfg.PrefixWeight, Min: 0, Max: 1000},
		sdk.Field{Name: "queue_weight", Dst: &p.cfg.QueueWeight, Min: 0, Max: 1000},
		sdk.Field{Name: "kv_weight", Dst: &p.cfg.KVWeight, Min: 0, Max: 1000},
		sdk.Field{Name: "gpu_weight", Dst: &p.cfg.GPUWeight, Min: 0, Max: 1},
		sdk.Field{Name: "cpu_weight", Dst: &p.cfg.CPUWeight, Min: 0, Max: 1},
	)
}

// Choose scores and ranks the healthy endpoints.
func (p *Policy) Choose(s *sdk.Snapshot, r *sdk.Ranking) error {
	c := &p.cfg
	req := &s.Request
	minQ, maxQ, first := uint32(0), uint32(0), true
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if !e.Healthy() {
			continue
		}
		if first || e.Waiting < minQ {
			minQ = e.Waiting
		}
		if first || e.Waiting > maxQ {
			maxQ = e.Waiting
		}
		first = false
	}
	p.rank.Reset()
	p.rank.AddHealthy(s, func(e *sdk.Endpoint) float64 {
		var prefix float64
		if req.PromptBlocks > 0 {
			credit := float64(c.GPUWeight*float64(e.GPUBlocks)) + float64(c.CPUWeight*float64(e.CPUBlocks))
			prefix = min(credit/float64(req.PromptBlocks), 1)
		}
		queue := 1.0
		if maxQ > minQ {
			queue = float64(maxQ-e.Waiting) / float64(maxQ-minQ)
		}
		kv := 1 - float64(e.KVCacheUtilization)
		score := float64(c.PrefixWeight*prefix) + float64(c.QueueWeight*queue) + float64(c.KVWeight*kv)
		return -score // the higher score first
	})
	p.rank.Rank(r)
	return nil
}

func init() { sdk.Register(&Policy{}) }

func main() {}
