package kvstore

import (
	"container/heap"
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// MemoryReservations is the in-memory Reservations: one mutex, a lease table, per-endpoint counters and an
// expiry heap. Leases expire on the injected clock. Safe for concurrent use.
type MemoryReservations struct {
	now func() time.Time

	mu       sync.Mutex
	seq      uint64
	leases   map[string]*memLease
	inflight map[EndpointID]Cost
	expiry   leaseHeap
}

type memLease struct {
	ep      EndpointID
	cost    Cost
	expires int64 // Unix ns
}

type heapItem struct {
	expires int64
	id      string
}

type leaseHeap []heapItem

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].expires < h[j].expires }
func (h leaseHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *leaseHeap) Push(x any)        { *h = append(*h, x.(heapItem)) }
func (h *leaseHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

var _ Reservations = (*MemoryReservations)(nil)

// NewMemoryReservations returns empty reservations on clock now (nil means time.Now).
func NewMemoryReservations(now func() time.Time) *MemoryReservations {
	if now == nil {
		now = time.Now
	}
	return &MemoryReservations{now: now, leases: map[string]*memLease{}, inflight: map[EndpointID]Cost{}}
}

func checkReserve(cost Cost, ttl time.Duration) error {
	if cost.Requests < 0 || cost.Tokens < 0 {
		return fmt.Errorf("kvstore: reserve: negative cost %+v: %w", cost, ErrInvalidArgument)
	}
	if ttl <= 0 {
		return fmt.Errorf("kvstore: reserve: ttl %v: %w", ttl, ErrInvalidArgument)
	}
	return nil
}

// fits reports whether cur plus cost stays within lim (zero limits are unlimited).
func fits(cur, cost Cost, lim Limits) bool {
	return (lim.MaxRequests <= 0 || cur.Requests+cost.Requests <= lim.MaxRequests) &&
		(lim.MaxTokens <= 0 || cur.Tokens+cost.Tokens <= lim.MaxTokens)
}

// reap drops leases expired at now. Caller holds mu.
func (m *MemoryReservations) reap(now int64) {
	for len(m.expiry) > 0 && m.expiry[0].expires <= now {
		it := heap.Pop(&m.expiry).(heapItem)
		if l := m.leases[it.id]; l != nil && l.expires == it.expires {
			m.drop(it.id, l)
		}
	}
}

func (m *MemoryReservations) drop(id string, l *memLease) {
	delete(m.leases, id)
	c := m.inflight[l.ep]
	c.Requests = max(0, c.Requests-l.cost.Requests)
	c.Tokens = max(0, c.Tokens-l.cost.Tokens)
	if c == (Cost{}) {
		delete(m.inflight, l.ep)
	} else {
		m.inflight[l.ep] = c
	}
}

// Reserve implements Reservations.
func (m *MemoryReservations) Reserve(_ context.Context, ranked []Candidate, cost Cost, ttl time.Duration) (Lease, error) {
	if err := checkReserve(cost, ttl); err != nil {
		return Lease{}, err
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reap(now.UnixNano())
	for _, c := range ranked {
		if c.Endpoint == "" || !fits(m.inflight[c.Endpoint], cost, c.Limits) {
			continue
		}
		m.seq++
		id := "m" + strconv.FormatUint(m.seq, 10)
		exp := now.Add(ttl)
		m.leases[id] = &memLease{ep: c.Endpoint, cost: cost, expires: exp.UnixNano()}
		heap.Push(&m.expiry, heapItem{expires: exp.UnixNano(), id: id})
		cur := m.inflight[c.Endpoint]
		m.inflight[c.Endpoint] = Cost{Requests: cur.Requests + cost.Requests, Tokens: cur.Tokens + cost.Tokens}
		return Lease{ID: id, Endpoint: c.Endpoint, Cost: cost, Expires: exp}, nil
	}
	return Lease{}, ErrNoCapacity
}

// Renew implements Reservations.
func (m *MemoryReservations) Renew(_ context.Context, l Lease, ttl time.Duration) (Lease, error) {
	if ttl <= 0 {
		return Lease{}, fmt.Errorf("kvstore: renew: ttl %v: %w", ttl, ErrInvalidArgument)
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reap(now.UnixNano())
	ml := m.leases[l.ID]
	if ml == nil {
		return Lease{}, fmt.Errorf("kvstore: renew %s: %w", l.ID, ErrLeaseNotLive)
	}
	exp := now.Add(ttl)
	ml.expires = exp.UnixNano()
	heap.Push(&m.expiry, heapItem{expires: ml.expires, id: l.ID})
	return Lease{ID: l.ID, Endpoint: ml.ep, Cost: ml.cost, Expires: exp}, nil
}

// Release implements Reservations.
func (m *MemoryReservations) Release(_ context.Context, l Lease) error {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reap(now.UnixNano())
	if ml := m.leases[l.ID]; ml != nil {
		m.drop(l.ID, ml)
	}
	return nil
}

// InFlight implements Reservations; endpoints with nothing in flight are omitted.
func (m *MemoryReservations) InFlight(_ context.Context, eps []EndpointID) (map[EndpointID]Cost, error) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reap(now.UnixNano())
	out := make(map[EndpointID]Cost, len(eps))
	for _, ep := range eps {
		if c, ok := m.inflight[ep]; ok {
			out[ep] = c
		}
	}
	return out, nil
}
