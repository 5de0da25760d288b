package tpu

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"
)

// memory is the in-process backend: one mutex makes every operation atomic, as one script is on Redis.
type memory struct {
	mu    sync.Mutex
	now   func() time.Time
	state map[string]*poolState
}

// NewMemory returns an allocator on process memory (one gateway). now is its clock (nil: time.Now).
func NewMemory(now func() time.Time) *Allocator {
	if now == nil {
		now = time.Now
	}
	return newAllocator(&memory{now: now, state: map[string]*poolState{}})
}

// pool returns pool's state after reaping expired leases (called with mu held).
func (m *memory) pool(name string, create bool) (*poolState, int) {
	p := m.state[name]
	if p == nil {
		if !create {
			return newPoolState(), 0
		}
		p = newPoolState()
		m.state[name] = p
	}
	now := m.now().UnixMilli()
	n := 0
	for id, l := range p.leases {
		if l.Exp <= now {
			m.free(p, l)
			delete(p.leases, id)
			n++
		}
	}
	return p, n
}

func (m *memory) free(p *poolState, l *leaseRec) {
	r := p.slices[l.Slice]
	own := p.owners[l.Slice]
	s := Shape{N: 3, D: l.S}
	for i := range s.Chips() {
		c := s.coord(i)
		k := r.shape.index([3]int{c[0] + l.Origin[0], c[1] + l.Origin[1], c[2] + l.Origin[2]})
		if own[k] == l.Token {
			own[k] = 0
		}
	}
}

func (m *memory) register(_ context.Context, pool string, r *sliceRec, h *holdRec) (bool, int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, n := m.pool(pool, true)
	if old := p.slices[r.ID]; old != nil {
		if !reflect.DeepEqual(old, r) {
			return false, n, fmt.Errorf("tpu: slice %s is registered as %s %s with hosts %v: %w", r.ID, old.Gen, old.Topo, old.Hosts, ErrSliceExists)
		}
		return false, n, nil
	}
	p.slices[r.ID] = r
	own := make([]int64, r.shape.Chips())
	p.owners[r.ID] = own
	p.bad[r.ID] = make([]bool, len(r.Hosts))
	if h == nil {
		return true, n, nil
	}
	copy(p.bad[r.ID], h.bad)
	if h.holder != "" {
		p.fence++
		l := &leaseRec{ID: leaseID(r.ID, Shape{N: r.N, D: r.D}, 0), Slice: r.ID, Kind: "slice", S: r.D, PD: r.D,
			Holder: h.holder, Token: p.fence, Exp: m.now().UnixMilli() + h.ttlMS}
		for i := range own {
			own[i] = l.Token
		}
		p.leases[l.ID] = l
	}
	return true, n, nil
}

func (m *memory) setHealth(_ context.Context, pool, slice, host string, healthy bool) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, n := m.pool(pool, false)
	r := p.slices[slice]
	if r == nil {
		return n, fmt.Errorf("tpu: slice %s: %w", slice, ErrUnknownSlice)
	}
	w := slices.Index(r.Hosts, host)
	if w < 0 {
		return n, fmt.Errorf("tpu: slice %s has no host %q: %w", slice, host, ErrInvalidArgument)
	}
	p.bad[slice][w] = !healthy
	return n, nil
}

func (m *memory) reserve(_ context.Context, pool string, q *request) (*leaseRec, *sliceRec, int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, n := m.pool(pool, false)
	pl, err := place(p, q)
	if err != nil {
		return nil, nil, n, err
	}
	r := pl.slice
	p.fence++
	l := &leaseRec{ID: leaseID(r.ID, Shape{N: r.N, D: pl.shape}, pl.index), Slice: r.ID, Kind: "subslice", S: pl.shape,
		Origin: pl.origin, PD: r.D, Index: pl.index, Holder: q.Holder, Token: p.fence, Exp: m.now().UnixMilli() + q.TTLms}
	if q.Whole {
		l.Kind = "slice"
	}
	for i := range 3 {
		if pl.shape[i]%r.HB[i] != 0 {
			l.Sub = true
		}
	}
	own := p.owners[r.ID]
	s := Shape{N: 3, D: l.S}
	for i := range s.Chips() {
		c := s.coord(i)
		own[r.shape.index([3]int{c[0] + l.Origin[0], c[1] + l.Origin[1], c[2] + l.Origin[2]})] = l.Token
	}
	p.leases[l.ID] = l
	cp := *l
	return &cp, r, n, nil
}

func (m *memory) renew(_ context.Context, pool, id string, token, ttlMS int64) (*leaseRec, *sliceRec, int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, n := m.pool(pool, false)
	l := p.leases[id]
	if l == nil {
		return nil, nil, n, fmt.Errorf("tpu: lease %s: %w", id, ErrLeaseNotFound)
	}
	if l.Token != token {
		return nil, nil, n, fmt.Errorf("tpu: lease %s: token %d is not the live token: %w", id, token, ErrStaleToken)
	}
	l.Exp = m.now().UnixMilli() + ttlMS
	cp := *l
	return &cp, p.slices[l.Slice], n, nil
}

func (m *memory) release(_ context.Context, pool, id string, token int64) (bool, int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, n := m.pool(pool, false)
	l := p.leases[id]
	if l == nil {
		return false, n, nil
	}
	if l.Token != token {
		return false, n, fmt.Errorf("tpu: lease %s: token %d is not the live token: %w", id, token, ErrStaleToken)
	}
	m.free(p, l)
	delete(p.leases, id)
	return true, n, nil
}

func (m *memory) snapshot(_ context.Context, pool string) (*poolState, int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, n := m.pool(pool, false)
	cp := newPoolState()
	for id, r := range p.slices {
		cp.slices[id] = r
		cp.owners[id] = slices.Clone(p.owners[id])
		cp.bad[id] = slices.Clone(p.bad[id])
	}
	for id, l := range p.leases {
		c := *l
		cp.leases[id] = &c
	}
	return cp, n, nil
}

func (m *memory) pools(context.Context) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.state))
	for name := range m.state {
		out = append(out, name)
	}
	return out, nil
}
