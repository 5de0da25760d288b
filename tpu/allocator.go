package tpu

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// backend is one store's atomic operations. Each call reaps the pool's expired leases first and returns how
// many it reaped.
type backend interface {
	// register adds r unless a slice with its ID exists; with h non-nil, a new slice also gets h's unhealthy
	// hosts and whole-slice lease in the same step. created says whether r was new.
	register(ctx context.Context, pool string, r *sliceRec, h *holdRec) (created bool, reaped int, err error)
	setHealth(ctx context.Context, pool, slice, host string, healthy bool) (reaped int, err error)
	reserve(ctx context.Context, pool string, q *request) (*leaseRec, *sliceRec, int, error)
	renew(ctx context.Context, pool, id string, token, ttlMS int64) (*leaseRec, *sliceRec, int, error)
	release(ctx context.Context, pool, id string, token int64) (released bool, reaped int, err error)
	snapshot(ctx context.Context, pool string) (*poolState, int, error)
	pools(ctx context.Context) ([]string, error)
}

// Allocator is the TPU allocator on one store; safe for concurrent use, and any number of Allocators (in
// any number of processes) may share one Redis.
type Allocator struct {
	b backend
	m *Metrics
}

// Metrics returns the allocator's Prometheus metrics.
func (a *Allocator) Metrics() *Metrics { return a.m }

func checkPool(pool string) error { return checkName("pool", pool) }

// Register adds a slice to pool (idempotent for the same spec; ErrSliceExists for another spec under the
// same ID). A new slice has every chip free and every host healthy.
func (a *Allocator) Register(ctx context.Context, pool string, spec SliceSpec) error {
	if err := checkPool(pool); err != nil {
		return err
	}
	r, err := newSliceRec(spec)
	if err != nil {
		return err
	}
	_, n, err := a.b.register(ctx, pool, r, nil)
	a.m.expired(pool, n)
	return err
}

// Hold is what RegisterHeld writes with a new slice, in the same atomic step as the registration.
type Hold struct {
	// Holder, when not empty (1..256 bytes), takes one whole-slice lease on the new slice for TTL (1 ms to
	// 24 h), so none of its chips can be granted until that lease expires or is released.
	Holder string
	TTL    time.Duration
	// Unhealthy names hosts of the slice that start unhealthy.
	Unhealthy []string
}

// holdRec is a validated Hold: the lease's holder and TTL (ms; holder "" for none) and the unhealthy
// flags by worker ID.
type holdRec struct {
	holder string
	ttlMS  int64
	bad    []bool
}

// RegisterHeld registers spec in pool as Register does and, only when the slice is new, in the same
// atomic step marks h.Unhealthy and takes h's whole-slice lease: no reservation can land between the
// registration and the hold (the gateway re-registers the slices an emptied store lost this way, each held
// until the lost leases would have expired). It reports whether the slice was new; for a slice already
// registered with the same spec nothing is written and it returns (false, nil). Errors as Register's, plus
// ErrInvalidArgument for a host the spec does not name, a holder over 256 bytes or a TTL outside 1 ms..24 h.
func (a *Allocator) RegisterHeld(ctx context.Context, pool string, spec SliceSpec, h Hold) (bool, error) {
	if err := checkPool(pool); err != nil {
		return false, err
	}
	r, err := newSliceRec(spec)
	if err != nil {
		return false, err
	}
	hr := &holdRec{holder: h.Holder, bad: make([]bool, len(r.Hosts))}
	if h.Holder != "" {
		if err := checkTTL(h.TTL); err != nil {
			return false, err
		}
		if len(h.Holder) > 256 {
			return false, fmt.Errorf("tpu: holder must be 1..256 bytes: %w", ErrInvalidArgument)
		}
		hr.ttlMS = msCeil(h.TTL)
	}
	for _, host := range h.Unhealthy {
		w := slices.Index(r.Hosts, host)
		if w < 0 {
			return false, fmt.Errorf("tpu: slice %s has no host %q: %w", r.ID, host, ErrInvalidArgument)
		}
		hr.bad[w] = true
	}
	created, n, err := a.b.register(ctx, pool, r, hr)
	a.m.expired(pool, n)
	if err == nil && created && h.Holder != "" {
		a.m.granted(pool, "slice")
	}
	return created, err
}

// SetHealth marks a host of a slice healthy or not. Tiles containing an unhealthy host are not granted;
// live leases on it are left alone (their holders decide). ErrUnknownSlice, or ErrInvalidArgument for an
// unknown host.
func (a *Allocator) SetHealth(ctx context.Context, pool, slice, host string, healthy bool) error {
	if err := checkPool(pool); err != nil {
		return err
	}
	n, err := a.b.setHealth(ctx, pool, slice, host, healthy)
	a.m.expired(pool, n)
	return err
}

// Reserve grants a lease: a whole idle slice (req.Whole) or a sub-slice tile, chosen by req.Strategy.
// Refusals wrap one of the typed errors (ErrNoCapacity, ErrInvalidShape, ...).
func (a *Allocator) Reserve(ctx context.Context, pool string, req Request) (Lease, error) {
	if err := checkPool(pool); err != nil {
		return Lease{}, err
	}
	q, err := newRequest(req)
	if err != nil {
		a.m.refused(pool, err)
		return Lease{}, err
	}
	l, r, n, err := a.b.reserve(ctx, pool, q)
	a.m.expired(pool, n)
	if err != nil {
		a.m.refused(pool, err)
		return Lease{}, err
	}
	a.m.granted(pool, l.Kind)
	return buildLease(pool, l, r), nil
}

// Renew extends a live lease to now+ttl on the store's clock. ErrLeaseNotFound when it expired or was
// released; ErrStaleToken when the tile is now another holder's lease.
func (a *Allocator) Renew(ctx context.Context, pool, leaseID string, token int64, ttl time.Duration) (Lease, error) {
	if err := checkPool(pool); err != nil {
		return Lease{}, err
	}
	if err := checkTTL(ttl); err != nil {
		return Lease{}, err
	}
	l, r, n, err := a.b.renew(ctx, pool, leaseID, token, msCeil(ttl))
	a.m.expired(pool, n)
	if err != nil {
		return Lease{}, err
	}
	return buildLease(pool, l, r), nil
}

// Release frees a lease's chips. Idempotent: a lease already gone returns (false, nil); a live lease with
// another token returns ErrStaleToken.
func (a *Allocator) Release(ctx context.Context, pool, leaseID string, token int64) (bool, error) {
	if err := checkPool(pool); err != nil {
		return false, err
	}
	ok, n, err := a.b.release(ctx, pool, leaseID, token)
	a.m.expired(pool, n)
	return ok, err
}

// Pools lists the pools that have had a slice registered, sorted.
func (a *Allocator) Pools(ctx context.Context) ([]string, error) {
	p, err := a.b.pools(ctx)
	slices.Sort(p)
	return p, err
}

// HostInfo is one host of a slice.
type HostInfo struct {
	Name     string `json:"name"`
	WorkerID int    `json:"worker_id"`
	Healthy  bool   `json:"healthy"`
}

// SliceInfo describes a slice's state.
type SliceInfo struct {
	ID             string     `json:"id"`
	Generation     string     `json:"generation"`
	Topology       string     `json:"topology"`
	PodType        string     `json:"pod_type"`
	GKEAccelerator string     `json:"gke_accelerator"`
	Hosts          []HostInfo `json:"hosts"`
	DevicesPerChip int        `json:"devices_per_chip"`
	ChipCount      int        `json:"chip_count"`
	LeasedChips    int        `json:"leased_chips"`
	UnhealthyChips int        `json:"unhealthy_chips"` // on unhealthy hosts, leased or not
	FreeChips      int        `json:"free_chips"`      // neither leased nor unhealthy
	Leases         []Lease    `json:"leases"`
	// FreeBlocks counts, per shape (every valid shape of the generation that tiles the slice at host
	// granularity, the slice's own topology included), the free aligned tiles.
	FreeBlocks map[string]int `json:"free_blocks"`
	// Owners is, per chip in X-minor order, the lease ID holding it or "" (Inspect only).
	Owners []string `json:"owners,omitempty"`
}

// PoolInfo lists a pool's slices, by ID.
type PoolInfo struct {
	Pool   string      `json:"pool"`
	Slices []SliceInfo `json:"slices"`
}

func sliceInfo(pool string, p *poolState, r *sliceRec, owners bool) SliceInfo {
	g := r.gen
	si := SliceInfo{ID: r.ID, Generation: r.Gen, Topology: r.Topo, PodType: g.PodType(r.shape.Chips()),
		GKEAccelerator: g.GKEAccelerator, DevicesPerChip: r.Devices, ChipCount: r.shape.Chips(), Leases: []Lease{}, FreeBlocks: map[string]int{}}
	bad := p.bad[r.ID]
	for w, h := range r.Hosts {
		si.Hosts = append(si.Hosts, HostInfo{Name: h, WorkerID: w, Healthy: !bad[w]})
	}
	byToken := map[int64]string{}
	var ids []string
	for id, l := range p.leases {
		if l.Slice == r.ID {
			byToken[l.Token] = id
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		si.Leases = append(si.Leases, buildLease(pool, p.leases[id], r))
	}
	own := p.owners[r.ID]
	for i, t := range own {
		if t != 0 {
			si.LeasedChips++
		}
		if bad[r.worker(r.shape.coord(i))] {
			si.UnhealthyChips++
		}
	}
	u := p.unavailable(r)
	bs := newBoxSums(r.D, u)
	si.FreeChips = len(u) - bs.count([3]int{}, r.D)
	for _, v := range r.VS {
		ok := true
		for i := range 3 {
			if r.D[i]%v[i] != 0 || v[i]%r.HB[i] != 0 {
				ok = false
			}
		}
		if !ok {
			continue
		}
		g := [3]int{r.D[0] / v[0], r.D[1] / v[1], r.D[2] / v[2]}
		n := 0
		for c := range g[0] * g[1] * g[2] {
			if bs.count(tileOrigin(g, v, c), v) == 0 {
				n++
			}
		}
		si.FreeBlocks[Shape{N: r.N, D: v}.String()] = n
	}
	if owners {
		si.Owners = make([]string, len(own))
		for i, t := range own {
			if t != 0 {
				si.Owners[i] = byToken[t]
				if si.Owners[i] == "" {
					si.Owners[i] = "token:" + strconv.FormatInt(t, 10)
				}
			}
		}
	}
	return si
}

// List describes every slice of pool (an unknown pool lists no slices).
func (a *Allocator) List(ctx context.Context, pool string) (PoolInfo, error) {
	if err := checkPool(pool); err != nil {
		return PoolInfo{}, err
	}
	p, n, err := a.b.snapshot(ctx, pool)
	a.m.expired(pool, n)
	if err != nil {
		return PoolInfo{}, err
	}
	out := PoolInfo{Pool: pool, Slices: []SliceInfo{}}
	for _, id := range p.ids() {
		out.Slices = append(out.Slices, sliceInfo(pool, p, p.slices[id], false))
	}
	return out, nil
}

// Inspect describes one slice with its per-chip owners (ErrUnknownSlice).
func (a *Allocator) Inspect(ctx context.Context, pool, slice string) (SliceInfo, error) {
	if err := checkPool(pool); err != nil {
		return SliceInfo{}, err
	}
	p, n, err := a.b.snapshot(ctx, pool)
	a.m.expired(pool, n)
	if err != nil {
		return SliceInfo{}, err
	}
	r := p.slices[slice]
	if r == nil {
		return SliceInfo{}, fmt.Errorf("tpu: slice %s: %w", slice, ErrUnknownSlice)
	}
	return sliceInfo(pool, p, r, true), nil
}

func newAllocator(b backend) *Allocator {
	a := &Allocator{b: b, m: NewMetrics()}
	a.m.a = a
	return a
}
