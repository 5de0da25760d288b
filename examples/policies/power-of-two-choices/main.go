// Command power-of-two-choices is an example kvgate routing policy (Mitzenmacher's power of two
// choices, as Ray's router falls back to): two distinct healthy endpoints drawn with sdk.Rand seeded by
// Request.Seed, the less loaded first, then every other healthy endpoint by load. Load is waiting +
// gateway in-flight requests; ties go to sdk.TieKey. It ignores the cache.
package main

import (
	"github.com/kvgate/kvgate/sdk"
	"github.com/kvgate/kvgate/sdk/rank"
)

// Policy is the power-of-two-choices policy. It takes no config.
type Policy struct {
	sdk.BasePolicy
	rank rank.Ranker
}

// Choose draws two distinct healthy endpoints and ranks them first, less loaded first, then the others by
// load.
func (p *Policy) Choose(s *sdk.Snapshot, r *sdk.Ranking) error {
	p.rank.Reset()
	p.rank.AddHealthy(s, func(e *sdk.Endpoint) float64 { return float64(rank.Load(e)) })
	switch n := p.rank.Len(); {
	case n == 1:
		p.rank.Promote(0)
	case n >= 2:
		rng := sdk.NewRand(s.Request.Seed)
		a := rng.Intn(n)
		b := rng.Intn(n - 1)
		if b >= a {
			b++
		}
		p.rank.Promote(a)
		p.rank.Promote(b)
	}
	p.rank.Rank(r)
	return nil
}

func init() { sdk.Register(&Policy{}) }

func main() {}
