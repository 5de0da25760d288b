package kvstore

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// FaultyStore is an in-memory store (MemoryIndex and MemoryReservations) with injectable store faults, for
// tests of what happens when a shared store fails: Fail makes every call return ErrUnavailable wrapping a
// cause, Hang makes calls wait until their context ends (a paused server), RestartEmpty replaces the data
// with an empty store under a new epoch (a Redis restarted without persistence), Heal ends a fault. It
// implements Remote (Ping, Epoch) and, like RedisEpoch, can refuse calls made in another epoch than the
// expected one (FaultyClient.Expect: a standalone Redis's connection check, per client as each gateway has
// its own connections), so Guarded treats it as a remote store. Safe for concurrent use.
type FaultyStore struct {
	now func() time.Time

	mu    sync.Mutex
	cause error         // non-nil: calls fail
	hang  chan struct{} // non-nil: calls wait on it (closed by Heal)
	gen   int
	idx   *MemoryIndex
	res   *MemoryReservations
}

// FaultyClient is one gateway's handle on a FaultyStore: its calls see the store's faults, and its own
// epoch check (Expect). It implements Remote.
type FaultyClient struct {
	f      *FaultyStore
	mu     sync.Mutex
	expect func() (string, bool)
}

var (
	_ Remote       = (*FaultyStore)(nil)
	_ Remote       = (*FaultyClient)(nil)
	_ Reservations = faultyReservations{}
	_ Index        = faultyIndex{}
	_ Fencer       = faultyIndex{}
	_ Demoter      = faultyIndex{}
)

// NewFaultyStore returns a healthy faulty store on clock now (nil: time.Now).
func NewFaultyStore(now func() time.Time) *FaultyStore {
	f := &FaultyStore{now: now, gen: 1}
	f.idx, f.res = NewMemoryIndex(MemoryConfig{Now: now}), NewMemoryReservations(now)
	return f
}

// Fail makes every call fail with ErrUnavailable wrapping cause (a refused connection, say) until Heal.
func (f *FaultyStore) Fail(cause error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cause = cause
}

// Hang makes every call wait until its context ends (then ErrUnavailable wrapping the context's error) or
// until Heal, like a paused redis-server.
func (f *FaultyStore) Hang() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hang == nil {
		f.hang = make(chan struct{})
	}
}

// Heal ends Fail and Hang.
func (f *FaultyStore) Heal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cause = nil
	if f.hang != nil {
		close(f.hang)
		f.hang = nil
	}
}

// RestartEmpty drops every entry and lease and starts a new epoch (lease IDs start over, as on a restarted
// Redis). It does not heal a fault.
func (f *FaultyStore) RestartEmpty() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen++
	f.idx, f.res = NewMemoryIndex(MemoryConfig{Now: f.now}), NewMemoryReservations(f.now)
}

// Client returns a new client of the store (one gateway's connections).
func (f *FaultyStore) Client() *FaultyClient { return &FaultyClient{f: f} }

// Expect sets the client's epoch check (see RedisEpoch.Expect): while it enforces an epoch other than the
// store's current one, the client's calls fail with ErrUnavailable wrapping ErrEpochChanged.
func (c *FaultyClient) Expect(e func() (string, bool)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expect = e
}

func (c *FaultyClient) expectation() func() (string, bool) {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.expect
}

// Ping implements Remote.
func (c *FaultyClient) Ping(ctx context.Context) error { return c.f.Ping(ctx) }

// Epoch implements Remote.
func (c *FaultyClient) Epoch(ctx context.Context) (string, error) { return c.f.Epoch(ctx) }

// Reservations returns the store's reservations through this client.
func (c *FaultyClient) Reservations() Reservations { return faultyReservations{c.f, c} }

// Index returns the store's index through this client.
func (c *FaultyClient) Index() Index { return faultyIndex{c.f, c} }

func (f *FaultyStore) epochLocked() string { return fmt.Sprintf("mem-%d", f.gen) }

// enter returns the current backends, or the fault every call sees now.
// cl's epoch check applies when cl is not nil.
func (f *FaultyStore) enter(ctx context.Context, cl *FaultyClient) (*MemoryIndex, *MemoryReservations, error) {
	expect := cl.expectation()
	f.mu.Lock()
	cause, hang, idx, res, epoch := f.cause, f.hang, f.idx, f.res, f.epochLocked()
	f.mu.Unlock()
	if hang != nil {
		select {
		case <-ctx.Done():
			return nil, nil, Unavailable(fmt.Errorf("kvstore: faulty store hangs: %w", ctx.Err()))
		case <-hang:
			return f.enter(ctx, cl)
		}
	}
	if cause != nil {
		return nil, nil, Unavailable(fmt.Errorf("kvstore: faulty store: %w", cause))
	}
	if expect != nil {
		if want, on := expect(); on && want != epoch {
			return nil, nil, Unavailable(fmt.Errorf("%w: marker %q, expected %q", ErrEpochChanged, epoch, want))
		}
	}
	return idx, res, nil
}

// Ping implements Remote.
func (f *FaultyStore) Ping(ctx context.Context) error {
	_, _, err := f.enter(ctx, nil)
	return err
}

// Epoch implements Remote: "mem-<n>", n counting restarts.
func (f *FaultyStore) Epoch(ctx context.Context) (string, error) {
	if _, _, err := f.enter(ctx, nil); err != nil {
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.epochLocked(), nil
}

// Reservations returns the store's reservations (no epoch check).
func (f *FaultyStore) Reservations() Reservations { return faultyReservations{f, nil} }

// Index returns the store's index (no epoch check).
func (f *FaultyStore) Index() Index { return faultyIndex{f, nil} }

type faultyReservations struct {
	f  *FaultyStore
	cl *FaultyClient
}

func (r faultyReservations) Reserve(ctx context.Context, ranked []Candidate, cost Cost, ttl time.Duration) (Lease, error) {
	_, res, err := r.f.enter(ctx, r.cl)
	if err != nil {
		return Lease{}, err
	}
	return res.Reserve(ctx, ranked, cost, ttl)
}

func (r faultyReservations) Renew(ctx context.Context, l Lease, ttl time.Duration) (Lease, error) {
	_, res, err := r.f.enter(ctx, r.cl)
	if err != nil {
		return Lease{}, err
	}
	return res.Renew(ctx, l, ttl)
}

func (r faultyReservations) Release(ctx context.Context, l Lease) error {
	_, res, err := r.f.enter(ctx, r.cl)
	if err != nil {
		return err
	}
	return res.Release(ctx, l)
}

func (r faultyReservations) InFlight(ctx context.Context, eps []EndpointID) (map[EndpointID]Cost, error) {
	_, res, err := r.f.enter(ctx, r.cl)
	if err != nil {
		return nil, err
	}
	return res.InFlight(ctx, eps)
}

type faultyIndex struct {
	f  *FaultyStore
	cl *FaultyClient
}

func (x faultyIndex) do(ctx context.Context, fn func(*MemoryIndex) error) error {
	idx, _, err := x.f.enter(ctx, x.cl)
	if err != nil {
		return err
	}
	return fn(idx)
}

func (x faultyIndex) Match(ctx context.Context, model string, keys []BlockKey) ([]EndpointMatch, error) {
	idx, _, err := x.f.enter(ctx, x.cl)
	if err != nil {
		return nil, err
	}
	return idx.Match(ctx, model, keys)
}

func (x faultyIndex) Record(ctx context.Context, model string, ep EndpointID, keys []BlockKey, ttl time.Duration) error {
	return x.do(ctx, func(m *MemoryIndex) error { return m.Record(ctx, model, ep, keys, ttl) })
}

func (x faultyIndex) Add(ctx context.Context, model string, ep EndpointID, tier Tier, keys []BlockKey) error {
	return x.do(ctx, func(m *MemoryIndex) error { return m.Add(ctx, model, ep, tier, keys) })
}

func (x faultyIndex) Remove(ctx context.Context, model string, ep EndpointID, tier Tier, keys []BlockKey) error {
	return x.do(ctx, func(m *MemoryIndex) error { return m.Remove(ctx, model, ep, tier, keys) })
}

func (x faultyIndex) ClearEndpoint(ctx context.Context, model string, ep EndpointID) error {
	return x.do(ctx, func(m *MemoryIndex) error { return m.ClearEndpoint(ctx, model, ep) })
}

func (x faultyIndex) ClearConfirmed(ctx context.Context, model string, ep EndpointID) error {
	return x.do(ctx, func(m *MemoryIndex) error { return m.ClearConfirmed(ctx, model, ep) })
}

func (x faultyIndex) Apply(ctx context.Context, model string, updates []Update) error {
	return x.do(ctx, func(m *MemoryIndex) error { return m.Apply(ctx, model, updates) })
}

func (x faultyIndex) Demote(ctx context.Context, model string, ep EndpointID, ttl time.Duration) error {
	return x.do(ctx, func(m *MemoryIndex) error { return m.Demote(ctx, model, ep, ttl) })
}

func (x faultyIndex) RaiseFence(ctx context.Context, model string, fe Fence) error {
	return x.do(ctx, func(m *MemoryIndex) error { return m.RaiseFence(ctx, model, fe) })
}

func (x faultyIndex) Fenced(fe Fence) FencedIndex { return faultyFenced{x, fe} }

// faultyFenced is a fenced view resolved on the current backend at every call (RestartEmpty replaces it).
type faultyFenced struct {
	x  faultyIndex
	fe Fence
}

func (v faultyFenced) view(ctx context.Context) (FencedIndex, error) {
	idx, _, err := v.x.f.enter(ctx, v.x.cl)
	if err != nil {
		return nil, err
	}
	return idx.Fenced(v.fe), nil
}

func (v faultyFenced) Fence() Fence { return v.fe }

func (v faultyFenced) Match(ctx context.Context, model string, keys []BlockKey) ([]EndpointMatch, error) {
	return v.x.Match(ctx, model, keys)
}

func (v faultyFenced) Record(ctx context.Context, model string, ep EndpointID, keys []BlockKey, ttl time.Duration) error {
	return v.x.Record(ctx, model, ep, keys, ttl)
}

func (v faultyFenced) write(ctx context.Context, fn func(FencedIndex) error) error {
	w, err := v.view(ctx)
	if err != nil {
		return err
	}
	return fn(w)
}

func (v faultyFenced) Add(ctx context.Context, model string, ep EndpointID, tier Tier, keys []BlockKey) error {
	return v.write(ctx, func(w FencedIndex) error { return w.Add(ctx, model, ep, tier, keys) })
}

func (v faultyFenced) Remove(ctx context.Context, model string, ep EndpointID, tier Tier, keys []BlockKey) error {
	return v.write(ctx, func(w FencedIndex) error { return w.Remove(ctx, model, ep, tier, keys) })
}

func (v faultyFenced) ClearEndpoint(ctx context.Context, model string, ep EndpointID) error {
	return v.write(ctx, func(w FencedIndex) error { return w.ClearEndpoint(ctx, model, ep) })
}

func (v faultyFenced) ClearConfirmed(ctx context.Context, model string, ep EndpointID) error {
	return v.write(ctx, func(w FencedIndex) error { return w.ClearConfirmed(ctx, model, ep) })
}

func (v faultyFenced) Apply(ctx context.Context, model string, updates []Update) error {
	return v.write(ctx, func(w FencedIndex) error { return w.Apply(ctx, model, updates) })
}

func (v faultyFenced) Demote(ctx context.Context, model string, ep EndpointID, ttl time.Duration) error {
	return v.write(ctx, func(w FencedIndex) error { return w.Demote(ctx, model, ep, ttl) })
}
