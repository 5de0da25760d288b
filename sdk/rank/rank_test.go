package rank

import (
	"slices"
	"testing"

	"github.com/kvgate/kvgate/sdk"
)

// TestRanker: lower cost first, equal costs by sdk.TieKey then index, promoted endpoints before the rest,
// unhealthy endpoints left out by AddHealthy, and Load as waiting + in-flight requests.
func TestRanker(t *testing.T) {
	s := &sdk.Snapshot{Request: sdk.Request{Seed: 42}, Endpoints: []sdk.Endpoint{
		{Index: 0, Flags: sdk.FlagHealthy, Waiting: 3},
		{Index: 1, Flags: sdk.FlagHealthy, Waiting: 1, InFlightRequests: 1},
		{Index: 2, Waiting: 0},
		{Index: 3, Flags: sdk.FlagHealthy, InFlightRequests: 2},
		{Index: 4, Flags: sdk.FlagHealthy},
	}}
	var k Ranker
	k.AddHealthy(s, func(e *sdk.Endpoint) float64 { return float64(Load(e)) })
	if k.Len() != 4 {
		t.Fatalf("Len %d, want the 4 healthy endpoints", k.Len())
	}
	var r sdk.Ranking
	k.Rank(&r)
	// loads: 0→3, 1→2, 3→2, 4→0; 1 and 3 tie and go by sdk.TieKey(42, ·).
	mid := []uint32{1, 3}
	if sdk.TieKey(42, 3) < sdk.TieKey(42, 1) {
		mid = []uint32{3, 1}
	}
	if want := append(append([]uint32{4}, mid...), 0); !slices.Equal(r.Indices(), want) {
		t.Fatalf("ranking %v, want %v", r.Indices(), want)
	}
	k.Reset()
	r.Reset()
	for _, i := range []uint32{0, 1, 2} {
		k.Add(7, i, 5) // all equal: ties only
	}
	k.Promote(2)
	k.Rank(&r)
	if r.Indices()[0] != 2 || r.Len() != 3 {
		t.Fatalf("promoted endpoint not first: %v", r.Indices())
	}
}
