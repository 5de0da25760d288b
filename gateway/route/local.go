package route

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"time"

	"github.com/kvgate/kvgate/kvstore"
)

// LocalReservations is a mutex-guarded, in-process kvstore.Reservations. The router uses it while the shared
// store is unreachable, with every limit scaled by store_down_limit_share, so N gateways that each keep to
// their share still respect the fleet-wide limits. Expired leases stop counting.
type LocalReservations struct {
	share float64
	now   func() time.Time

	mu     sync.Mutex
	leases map[string]kvstore.Lease
	used   map[kvstore.EndpointID]kvstore.Cost
}

var _ kvstore.Reservations = (*LocalReservations)(nil)

// NewLocalReservations returns local reservations enforcing share (in (0,1]) of every limit; a limit that
// scales below 1 becomes 1 (one request may always run).
func NewLocalReservations(share float64) *LocalReservations {
	return &LocalReservations{share: share, now: time.Now, leases: map[string]kvstore.Lease{},
		used: map[kvstore.EndpointID]kvstore.Cost{}}
}

// ErrLeaseGone is returned by Renew for a lease that expired or was released.
var ErrLeaseGone = errors.New("route: lease expired or released")

func (l *LocalReservations) scaled(v int64) int64 {
	if v == 0 {
		return 0
	}
	s := int64(float64(v) * l.share)
	return max(s, 1)
}

// expireLocked drops expired leases.
func (l *LocalReservations) expireLocked(now time.Time) {
	for id, ls := range l.leases {
		if !ls.Expires.After(now) {
			l.dropLocked(id, ls)
		}
	}
}

func (l *LocalReservations) dropLocked(id string, ls kvstore.Lease) {
	delete(l.leases, id)
	u := l.used[ls.Endpoint]
	u.Requests -= ls.Cost.Requests
	u.Tokens -= ls.Cost.Tokens
	if u.Requests <= 0 && u.Tokens <= 0 {
		delete(l.used, ls.Endpoint)
	} else {
		l.used[ls.Endpoint] = u
	}
}

// Reserve leases cost on the first candidate within its scaled limits.
func (l *LocalReservations) Reserve(_ context.Context, ranked []kvstore.Candidate, cost kvstore.Cost, ttl time.Duration) (kvstore.Lease, error) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expireLocked(now)
	for _, c := range ranked {
		u := l.used[c.Endpoint]
		if mr := l.scaled(c.Limits.MaxRequests); mr > 0 && u.Requests+cost.Requests > mr {
			continue
		}
		if mt := l.scaled(c.Limits.MaxTokens); mt > 0 && u.Tokens+min(cost.Tokens, mt) > mt {
			continue
		}
		var b [12]byte
		rand.Read(b[:])
		ls := kvstore.Lease{ID: "local-" + hex.EncodeToString(b[:]), Endpoint: c.Endpoint, Cost: cost, Expires: now.Add(ttl)}
		l.leases[ls.ID] = ls
		u.Requests += cost.Requests
		u.Tokens += cost.Tokens
		l.used[c.Endpoint] = u
		return ls, nil
	}
	return kvstore.Lease{}, kvstore.ErrNoCapacity
}

// Renew extends a live lease.
func (l *LocalReservations) Renew(_ context.Context, ls kvstore.Lease, ttl time.Duration) (kvstore.Lease, error) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	cur, ok := l.leases[ls.ID]
	if !ok || !cur.Expires.After(now) {
		if ok {
			l.dropLocked(ls.ID, cur)
		}
		return kvstore.Lease{}, ErrLeaseGone
	}
	cur.Expires = now.Add(ttl)
	l.leases[ls.ID] = cur
	return cur, nil
}

// Release ends a lease (idempotent).
func (l *LocalReservations) Release(_ context.Context, ls kvstore.Lease) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if cur, ok := l.leases[ls.ID]; ok {
		l.dropLocked(ls.ID, cur)
	}
	return nil
}

// InFlight returns the live leased cost per endpoint.
func (l *LocalReservations) InFlight(_ context.Context, eps []kvstore.EndpointID) (map[kvstore.EndpointID]kvstore.Cost, error) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expireLocked(now)
	out := make(map[kvstore.EndpointID]kvstore.Cost, len(eps))
	for _, e := range eps {
		if u, ok := l.used[e]; ok {
			out[e] = u
		}
	}
	return out, nil
}
