// Command power-of-two-choices is an example kvgate routing policy (Mitzenmacher's power of two
// choices, as Ray's router falls back to): two distinct healthy endpoints drawn with sdk.Rand seeded by
// Request.Seed, the less loaded first, then every other healthy endpoint by load. Load is waiting +
// gateway in-flight requests; ties go to sdk.TieKey. It ignores the cache.
package main

import (
	"cmp"
	"slices"

	"github.com/kvgate/kvgate/sdk"
)

type item struct {
	group     uint8
	load, key uint64
	idx       uint32
}

// Policy is the power-of-two-choices policy. It takes no config.
type Policy struct {
	sdk.BasePolicy
	items []item
}

// order ranks by group, then lower load, then the tie key, then the index.
func order(a, b item) int {
	return cmp.Or(cmp.Compare(a.group, b.group), cmp.Compare(a.load, b.load), cmp.Compare(a.key, b.key),
		cmp.Compare(a.idx, b.idx))
}

// Choose draws two distinct healthy endpoints and ranks them first, less loaded first.
func (p *Policy) Choose(s *sdk.Snapshot, r *sdk.Ranking) error {
	p.items = p.items[:0]
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if e.Healthy() {
			p.items = append(p.items, item{group: 1, load: uint64(e.Waiting) + uint64(e.InFlightRequests),
				key: sdk.TieKey(s.Request.Seed, e.Index), idx: e.Index})
		}
	}
	switch n := len(p.items); {
	case n == 1:
		p.items[0].group = 0
	case n >= 2:
		rng := sdk.NewRand(s.Request.Seed)
		a := rng.Intn(n)
		b := rng.Intn(n - 1)
		if b >= a {
			b++
		}
		p.items[a].group, p.items[b].group = 0, 0
	}
	slices.SortFunc(p.items, order)
	for _, it := range p.items {
		r.Add(it.idx)
	}
	return nil
}

func init() { sdk.Register(&Policy{}) }

func main() {}
