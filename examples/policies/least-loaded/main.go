// Command least-loaded is an example kvgate routing policy: healthy endpoints by load (waiting +
// gateway in-flight requests, the three-tier policy's load), lower first, ties by the request-seeded
// key sdk.TieKey. It ignores the cache.
package main

import (
	"cmp"
	"slices"

	"github.com/kvgate/kvgate/sdk"
)

type item struct {
	load, key uint64
	idx       uint32
}

// Policy is the least-loaded policy. It takes no config.
type Policy struct {
	sdk.BasePolicy
	items []item
}

// order ranks lower load first, then the tie key, then the index.
func order(a, b item) int {
	return cmp.Or(cmp.Compare(a.load, b.load), cmp.Compare(a.key, b.key), cmp.Compare(a.idx, b.idx))
}

// Choose ranks the healthy endpoints by load, then tie key.
func (p *Policy) Choose(s *sdk.Snapshot, r *sdk.Ranking) error {
	p.items = p.items[:0]
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if e.Healthy() {
			p.items = append(p.items, item{load: uint64(e.Waiting) + uint64(e.InFlightRequests),
				key: sdk.TieKey(s.Request.Seed, e.Index), idx: e.Index})
		}
	}
	slices.SortFunc(p.items, order)
	for _, it := range p.items {
		r.Add(it.idx)
	}
	return nil
}

func init() { sdk.Register(&Policy{}) }

func main() {}
