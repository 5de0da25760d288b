// Command dynamo-cost is an example kvgate routing policy reproducing NVIDIA Dynamo's KV router cost
// function (Dynamo's router documentation) with temperature 0 (argmin):
//
//	cost = prefill_load_scale · max(active_prefill + prompt_blocks − overlap_credit, 0) + active_decode + new_blocks
//
// with overlap_credit = gpu_credit·GPU blocks + cpu_credit·CPU-only blocks (Dynamo: device 1.0, host
// 0.75) and new_blocks = prompt blocks − matched blocks. ABI v1 has no per-endpoint prefill/decode block
// counts, so the closest fields stand in: active_prefill = gateway in-flight tokens / block size (work
// reserved by gateways and not finished), active_decode = running requests. Ranking: healthy endpoints
// by cost, lower first, ties by sdk.TieKey. Softmax sampling (temperature > 0) is not implemented; the
// config accepts only 0.
package main

import (
	"github.com/kvgate/kvgate/sdk"
	"github.com/kvgate/kvgate/sdk/rank"
)

// Config holds the cost parameters (JSON keys in parentheses).
type Config struct {
	GPUCredit        float64 // gpu_credit, default 1.0
	CPUCredit        float64 // cpu_credit, default 0.75
	PrefillLoadScale float64 // prefill_load_scale, default 1.0
	Temperature      float64 // temperature, must be 0
}

// Policy is the Dynamo cost-function policy.
type Policy struct {
	cfg  Config
	rank rank.Ranker
}

// Init reads the config over the defaults.
func (p *Policy) Init(config []byte) error {
	p.cfg = Config{GPUCredit: 1, CPUCredit: 0.75, PrefillLoadScale: 1}
	return sdk.DecodeConfig(config,
		sdk.Field{Name: "gpu_credit", Dst: &p.cfg.GPUCredit, Min: 0, Max: 1},
		sdk.Field{Name: "cpu_credit", Dst: &p.cfg.CPUCredit, Min: 0, Max: 1},
		sdk.Field{Name: "prefill_load_scale", Dst: &p.cfg.PrefillLoadScale, Min: 0, Max: 1000},
		sdk.Field{Name: "temperature", Dst: &p.cfg.Temperature, Min: 0, Max: 0},
	)
}

// Choose ranks the healthy endpoints by cost.
func (p *Policy) Choose(s *sdk.Snapshot, r *sdk.Ranking) error {
	c := &p.cfg
	req := &s.Request
	blocks := float64(req.PromptBlocks)
	p.rank.Reset()
	p.rank.AddHealthy(s, func(e *sdk.Endpoint) float64 {
		var prefill float64
		if req.BlockSize > 0 {
			prefill = float64(e.InFlightTokens / uint64(req.BlockSize))
		}
		credit := float64(c.GPUCredit*float64(e.GPUBlocks)) + float64(c.CPUCredit*float64(e.CPUBlocks))
		matched := min(float64(uint64(e.GPUBlocks)+uint64(e.CPUBlocks)), blocks)
		return float64(c.PrefillLoadScale*max(prefill+blocks-credit, 0)) + float64(e.Running) + (blocks - matched)
	})
	p.rank.Rank(r)
	return nil
}

func init() { sdk.Register(&Policy{}) }

func main() {}
