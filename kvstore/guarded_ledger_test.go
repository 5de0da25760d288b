package kvstore

import (
	"testing"
)

func TestCapOf(t *testing.T) {
	for _, c := range []struct {
		name                  string
		limit                 int64
		share                 float64
		own0, others0, expect int64
	}{
		{name: "idle fleet: the share", limit: 6, share: 0.34, expect: 2},
		{name: "share rounds down", limit: 2, share: 0.34, expect: 0},
		{name: "unlimited", limit: 0, share: 0.34, own0: 5, expect: -1},
		{name: "full fleet, own above share: the share", limit: 6, share: 0.34, own0: 4, others0: 2, expect: 2},
		{name: "full fleet, own below share: only own", limit: 6, share: 0.34, own0: 1, others0: 5, expect: 1},
		{name: "full fleet, own none: nothing", limit: 6, share: 0.34, others0: 6, expect: 0},
		{name: "two free: share of them rounds to 0", limit: 6, share: 0.34, own0: 0, others0: 4, expect: 0},
		{name: "three free: one of them", limit: 6, share: 0.34, own0: 1, others0: 2, expect: 2},
		{name: "large limit", limit: 100, share: 0.34, own0: 10, others0: 50, expect: 23},
		{name: "counters over the limit", limit: 6, share: 0.5, own0: 2, others0: 9, expect: 2},
	} {
		if got := capOf(c.limit, c.share, c.own0, c.others0); got != c.expect {
			t.Errorf("%s: capOf(%d, %v, %d, %d) = %d, want %d", c.name, c.limit, c.share, c.own0, c.others0, got, c.expect)
		}
	}
}

// The store-down rule keeps any fleet of gateways within the limit, whatever each held when the store went
// down: every gateway ends up holding at most max(what it held, its cap), and those add up to at most the
// limit (with N × share ≤ 1, or the share rounding down enough). Exhaustive over the holdings of 3 and 4
// gateways.
func TestCapSumWithinLimit(t *testing.T) {
	for _, tc := range []struct {
		n     int
		share float64
	}{{3, 0.34}, {3, 1.0 / 3}, {4, 0.25}, {2, 0.5}} {
		for limit := int64(1); limit <= 14; limit++ {
			h := make([]int64, tc.n)
			var walk func(i int, left int64)
			walk = func(i int, left int64) {
				if i == tc.n {
					var fleet, sum int64
					for _, v := range h {
						fleet += v
					}
					for _, v := range h {
						sum += max(v, capOf(limit, tc.share, v, fleet-v))
					}
					if sum > limit {
						t.Fatalf("n %d share %v limit %d holdings %v: the fleet may run %d", tc.n, tc.share, limit, h, sum)
					}
					return
				}
				for v := int64(0); v <= left; v++ {
					h[i] = v
					walk(i+1, left-v)
				}
			}
			walk(0, limit)
		}
	}
}
