package tpu

import (
	"cmp"
	"fmt"
	"slices"
)

// poolState is one pool's state: the memory backend's truth, and what Redis's view script returns.
type poolState struct {
	slices map[string]*sliceRec
	owners map[string][]int64 // per chip (X-minor): the owning lease's token, 0 = free
	bad    map[string][]bool  // per worker ID: unhealthy
	leases map[string]*leaseRec
	fence  int64
}

func newPoolState() *poolState {
	return &poolState{slices: map[string]*sliceRec{}, owners: map[string][]int64{}, bad: map[string][]bool{}, leases: map[string]*leaseRec{}}
}

func (p *poolState) ids() []string {
	ids := make([]string, 0, len(p.slices))
	for id := range p.slices {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// unavailable marks, per chip, a chip that is leased or on an unhealthy host.
func (p *poolState) unavailable(r *sliceRec) []bool {
	n := r.shape.Chips()
	u := make([]bool, n)
	own, bad := p.owners[r.ID], p.bad[r.ID]
	for i := range n {
		u[i] = own[i] != 0 || bad[r.worker(r.shape.coord(i))]
	}
	return u
}

// boxSums is a summed-volume table of unavailable chips, so any block's count costs 8 lookups.
type boxSums struct {
	d [3]int
	p []int
}

func newBoxSums(d [3]int, u []bool) *boxSums {
	b := &boxSums{d: d, p: make([]int, (d[0]+1)*(d[1]+1)*(d[2]+1))}
	at := func(x, y, z int) int { return x + y*(d[0]+1) + z*(d[0]+1)*(d[1]+1) }
	for z := 1; z <= d[2]; z++ {
		for y := 1; y <= d[1]; y++ {
			for x := 1; x <= d[0]; x++ {
				v := 0
				if u[(x-1)+(y-1)*d[0]+(z-1)*d[0]*d[1]] {
					v = 1
				}
				b.p[at(x, y, z)] = v + b.p[at(x-1, y, z)] + b.p[at(x, y-1, z)] + b.p[at(x, y, z-1)] -
					b.p[at(x-1, y-1, z)] - b.p[at(x-1, y, z-1)] - b.p[at(x, y-1, z-1)] + b.p[at(x-1, y-1, z-1)]
			}
		}
	}
	return b
}

// count returns the unavailable chips in the block at origin o of extents s.
func (b *boxSums) count(o, s [3]int) int {
	d := b.d
	at := func(x, y, z int) int { return b.p[x+y*(d[0]+1)+z*(d[0]+1)*(d[1]+1)] }
	x0, y0, z0 := o[0], o[1], o[2]
	x1, y1, z1 := o[0]+s[0], o[1]+s[1], o[2]+s[2]
	return at(x1, y1, z1) - at(x0, y1, z1) - at(x1, y0, z1) - at(x1, y1, z0) +
		at(x0, y0, z1) + at(x0, y1, z0) + at(x1, y0, z0) - at(x0, y0, z0)
}

// geometry checks a sub-slice shape against one slice (rules in README.md, in this order).
func geometry(r *sliceRec, q *request) error {
	s := Shape{N: q.N, D: q.S}
	if q.N != r.N {
		return fmt.Errorf("tpu: %s is %dD, slice %s is %dD: %w", s, q.N, r.ID, r.N, ErrInvalidShape)
	}
	if !slices.Contains(r.VS, q.S) {
		return fmt.Errorf("tpu: %s is not a %s shape: %w", s, r.Gen, ErrInvalidShape)
	}
	if q.S == r.D {
		return fmt.Errorf("tpu: %s is all of slice %s: %w", s, r.ID, ErrUseWholeSlice)
	}
	for i := range 3 {
		if q.S[i] > r.D[i] {
			return fmt.Errorf("tpu: %s exceeds slice %s (%s): %w", s, r.ID, r.Topo, ErrShapeExceedsParent)
		}
	}
	for i := range 3 {
		if r.D[i]%q.S[i] != 0 {
			return fmt.Errorf("tpu: %s does not tile slice %s (%s): %w", s, r.ID, r.Topo, ErrInvalidShape)
		}
	}
	if !(q.SubHost && r.Single) {
		for i := range 3 {
			if q.S[i]%r.HB[i] != 0 {
				return fmt.Errorf("tpu: %s is below slice %s's host block %dx%dx%d: %w", s, r.ID, r.HB[0], r.HB[1], r.HB[2], ErrBelowHostGranularity)
			}
		}
	}
	return nil
}

// levels are the larger valid shapes that enclose s inside slice r (s divides them, they divide r, neither
// s nor r), smallest first, ties in extent order: best-fit's buddy levels.
func levels(r *sliceRec, s [3]int) [][3]int {
	var out [][3]int
	for _, t := range r.VS {
		if t == s || t == r.D {
			continue
		}
		ok := true
		for i := range 3 {
			if t[i]%s[i] != 0 || r.D[i]%t[i] != 0 {
				ok = false
			}
		}
		if ok {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b [3]int) int {
		if c := cmp.Compare(a[0]*a[1]*a[2], b[0]*b[1]*b[2]); c != 0 {
			return c
		}
		return slices.Compare(a[:], b[:])
	})
	return out
}

func tileOrigin(g, s [3]int, idx int) [3]int {
	gs := Shape{N: 3, D: g}
	c := gs.coord(idx)
	return [3]int{c[0] * s[0], c[1] * s[1], c[2] * s[2]}
}

// placement is where a request lands.
type placement struct {
	slice  *sliceRec
	origin [3]int
	index  int
	shape  [3]int
}

// place decides a request against the state without writing (the Lua scripts implement the same rules).
func place(p *poolState, q *request) (placement, error) {
	if q.Slice != "" && p.slices[q.Slice] == nil {
		return placement{}, fmt.Errorf("tpu: slice %s: %w", q.Slice, ErrUnknownSlice)
	}
	ids := p.ids()
	if q.Whole {
		for _, id := range ids {
			r := p.slices[id]
			if q.Slice != "" && id != q.Slice {
				continue
			}
			if !q.Any && (q.N != r.N || q.S != r.D) {
				if q.Slice != "" {
					return placement{}, fmt.Errorf("tpu: slice %s is %s, not %s: %w", id, r.Topo, q.shapeStr, ErrInvalidShape)
				}
				continue
			}
			if newBoxSums(r.D, p.unavailable(r)).count([3]int{}, r.D) == 0 {
				return placement{slice: r, shape: r.D}, nil
			}
		}
		return placement{}, fmt.Errorf("tpu: no idle healthy slice of topology %s: %w", q.shapeStr, ErrNoCapacity)
	}
	var firstErr error
	eligible := false
	var best placement
	var bestScore []int
	bestUsed, bestFree := false, 0
	for _, id := range ids {
		r := p.slices[id]
		if q.Slice != "" && id != q.Slice {
			continue
		}
		if err := geometry(r, q); err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		var g [3]int
		for i := range 3 {
			g[i] = r.D[i] / q.S[i]
		}
		count := g[0] * g[1] * g[2]
		lo, hi := 0, count-1
		if q.HasOff {
			var t [3]int
			bad := error(nil)
			for i := range 3 {
				if q.Off[i]%q.S[i] != 0 {
					bad = fmt.Errorf("tpu: offset %v is not a multiple of %s: %w", q.Off[:q.N], q.shapeStr, ErrMisaligned)
					break
				}
				if q.Off[i]+q.S[i] > r.D[i] {
					bad = fmt.Errorf("tpu: offset %v is outside slice %s: %w", q.Off[:q.N], id, ErrInvalidIndex)
					break
				}
				t[i] = q.Off[i] / q.S[i]
			}
			if bad != nil {
				if firstErr == nil {
					firstErr = bad
				}
				continue
			}
			lo = t[0] + t[1]*g[0] + t[2]*g[0]*g[1]
			hi = lo
		} else if q.Index >= 0 {
			if q.Index >= count {
				if firstErr == nil {
					firstErr = fmt.Errorf("tpu: index %d: slice %s has %d %s tiles: %w", q.Index, id, count, q.shapeStr, ErrInvalidIndex)
				}
				continue
			}
			lo, hi = q.Index, q.Index
		}
		eligible = true
		u := p.unavailable(r)
		bs := newBoxSums(r.D, u)
		busy := bs.count([3]int{}, r.D)
		free := len(u) - busy
		var lv [][3]int
		if !q.First {
			lv = levels(r, q.S)
		}
		found := -1
		var score []int
		for c := lo; c <= hi; c++ {
			o := tileOrigin(g, q.S, c)
			if bs.count(o, q.S) != 0 {
				continue
			}
			if q.First {
				return placement{slice: r, origin: o, index: c, shape: q.S}, nil
			}
			sc := make([]int, len(lv))
			for k, t := range lv {
				var e [3]int
				for i := range 3 {
					e[i] = o[i] / t[i] * t[i]
				}
				sc[k] = bs.count(e, t)
			}
			if found < 0 || slices.Compare(sc, score) > 0 {
				found, score = c, sc
			}
		}
		if found < 0 {
			continue
		}
		used := busy > 0
		if best.slice == nil || (used && !bestUsed) || (used == bestUsed && free < bestFree) {
			best = placement{slice: r, origin: tileOrigin(g, q.S, found), index: found, shape: q.S}
			bestScore, bestUsed, bestFree = score, used, free
		}
	}
	_ = bestScore
	if best.slice != nil {
		return best, nil
	}
	if !eligible && firstErr != nil {
		return placement{}, firstErr
	}
	return placement{}, fmt.Errorf("tpu: no free %s tile: %w", q.shapeStr, ErrNoCapacity)
}
