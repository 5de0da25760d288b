package plugins

import "github.com/kvgate/kvgate/plugins/internal/threetier"

// ThreeTierConfig is the native three-tier ranking's parameters, the built-in policy's JSON config
// (imbalance_threshold in requests, match_threshold and cpu_weight in [0,1]).
type ThreeTierConfig = threetier.Config

// DefaultThreeTierConfig returns the documented defaults: imbalance threshold 8, match threshold 0.10,
// CPU weight 0.8.
func DefaultThreeTierConfig() ThreeTierConfig { return threetier.DefaultConfig() }

// RankThreeTier ranks s's endpoints with the native three-tier algorithm under cfg (the code the built-in
// module compiles, and what Rank falls back to), appending Endpoint.Index values, best first, to out
// (which may be nil) and returning it. Unhealthy endpoints are left out; a snapshot without a healthy endpoint gives
// an empty ranking.
func RankThreeTier(cfg ThreeTierConfig, s *Snapshot, out []uint32) []uint32 {
	out, _ = threetier.New(cfg).Rank(s, out)
	return out
}

// ThreeTierMatchRate is the share of a prompt of promptTokens tokens an endpoint holds, as the three-tier
// ranking weighs it: (gpu + cpuWeight·cpu) × blockSize / promptTokens for gpu and cpu matched blocks, 0
// for an empty prompt.
func ThreeTierMatchRate(gpu, cpu, blockSize, promptTokens uint32, cpuWeight float64) float64 {
	return threetier.MatchRate(gpu, cpu, blockSize, promptTokens, cpuWeight)
}
