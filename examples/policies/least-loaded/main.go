// Command least-loaded is an example kvgate routing policy: healthy endpoints by load (waiting +
// gateway in-flight requests, the three-tier policy's load), lower first, ties by the request-seeded
// key sdk.TieKey. It ignores the cache.
package main

import (
	"github.com/kvgate/kvgate/sdk"
	"github.com/kvgate/kvgate/sdk/rank"
)

// Policy is the least-loaded policy. It takes no config.
type Policy struct {
	sdk.BasePolicy
	rank rank.Ranker
}

// Choose ranks the healthy endpoints by load (sdk.Load), then tie key.
func (p *Policy) Choose(s *sdk.Snapshot, r *sdk.Ranking) error {
	p.rank.Reset()
	p.rank.AddHealthy(s, func(e *sdk.Endpoint) float64 { return float64(rank.Load(e)) })
	p.rank.Rank(r)
	return nil
}

func init() { sdk.Register(&Policy{}) }

func main() {}
