// Package rank is the ranking most example policies build: one cost per endpoint, lower first, ties by
// the request-seeded sdk.TieKey, then by index (Ranker), and the three-tier policy's load (Load). It is a
// package of its own so that modules that do not use it (the built-in three-tier) are not changed by it.
package rank

import (
	"cmp"
	"slices"

	"github.com/kvgate/kvgate/sdk"
)

// Load is the load the built-in three-tier policy ranks by: the engine's waiting requests plus the
// gateway's in-flight requests to the endpoint.
func Load(e *sdk.Endpoint) uint64 { return uint64(e.Waiting) + uint64(e.InFlightRequests) }

// Ranker builds a ranking from one cost per endpoint, the shape most policies share: lower cost first,
// equal costs by the request-seeded sdk.TieKey (so ties spread over endpoints but repeat for a request), then
// by index. Endpoints can be promoted into a first group ranked before all others (power of two choices,
// a selected endpoint). Keep a Ranker in the policy and Reset it per call: it reuses its buffer.
type Ranker struct {
	items []rankItem
}

type rankItem struct {
	group uint8 // 0 promoted, 1 the rest
	cost  float64
	tie   uint64
	idx   uint32
}

// Reset empties the ranker for a new request.
func (k *Ranker) Reset() { k.items = k.items[:0] }

// Add adds endpoint idx with cost (lower ranks first; a score ranked highest first is added as -score).
// seed is the request's Seed, which keys the tie-break.
func (k *Ranker) Add(seed uint64, idx uint32, cost float64) {
	k.items = append(k.items, rankItem{group: 1, cost: cost, tie: sdk.TieKey(seed, idx), idx: idx})
}

// AddHealthy adds every healthy endpoint of s with the cost fn gives it.
func (k *Ranker) AddHealthy(s *sdk.Snapshot, fn func(e *sdk.Endpoint) float64) {
	for i := range s.Endpoints {
		if e := &s.Endpoints[i]; e.Healthy() {
			k.Add(s.Request.Seed, e.Index, fn(e))
		}
	}
}

// Len is the number of endpoints added.
func (k *Ranker) Len() int { return len(k.items) }

// Promote moves the i-th added endpoint (0 ≤ i < Len) into the first group: promoted endpoints rank
// before all others, in cost order among themselves.
func (k *Ranker) Promote(i int) { k.items[i].group = 0 }

// Rank sorts the added endpoints (group, cost, tie key, index) and appends their indices to r.
func (k *Ranker) Rank(r *sdk.Ranking) {
	slices.SortFunc(k.items, func(a, b rankItem) int {
		return cmp.Or(cmp.Compare(a.group, b.group), cmp.Compare(a.cost, b.cost), cmp.Compare(a.tie, b.tie),
			cmp.Compare(a.idx, b.idx))
	})
	for _, it := range k.items {
		r.Add(it.idx)
	}
}
