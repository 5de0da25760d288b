package kvstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Reservation layouts on Redis (StoreConfig.ReservationLayout, config store.reservation_layout).
const (
	// ReservationLayoutFollow (0) follows the store's reservation-layout marker (LayoutRedisReservations).
	ReservationLayoutFollow = 0
	// ReservationLayoutSingle (1) is RedisReservations: every reservation under the one tag {res}, what
	// releases before the sharded layout run.
	ReservationLayoutSingle = 1
	// ReservationLayoutSharded (2) is ShardedRedisReservations only: a tag per endpoint (a fleet with no
	// gateway of an older release).
	ReservationLayoutSharded = 2
)

const (
	// reservationLayoutMarker is the store's reservation-layout marker, "<Prefix>:v1:reservation-layout".
	reservationLayoutMarker = "reservation-layout"
	// layoutSwitchDelay is how long after the first read of a raised marker the layouts switch (server time).
	layoutSwitchDelay = 5 * time.Second
	// layoutMarkerPoll is how often a LayoutRedisReservations reads the marker.
	layoutMarkerPoll = time.Second
	// layoutMarkerFresh is the oldest marker read a single-tag grant without a known switch time relies on
	// (below layoutSwitchDelay, so no single-tag grant made in ignorance of a raised marker can land after
	// the switch unless it spends layoutSwitchDelay-layoutMarkerFresh between the gateway and Redis).
	layoutMarkerFresh = 2 * time.Second
)

// LayoutRedisReservations are the Redis reservations of store.reservation_layout 0: the single-tag layout
// (RedisReservations) until the store's marker <Prefix>:v1:reservation-layout is raised, then the layout
// sharded by endpoint (ShardedRedisReservations), with no moment at which both grant:
//   - The operator raises the marker with SET <marker> 2 once every gateway on the store runs this release.
//     The first gateway to read it (every gateway reads it once a second, and before a single-tag grant
//     when its last read is more than 2 s old) rewrites it to "2 <ms>": a switch time 5 s ahead on the
//     server's clock. Each reserve script is given the window it may grant in (single tag: before the
//     switch; sharded: from it) and refuses outside it, so on one Redis the two layouts never grant at the
//     same time whatever the gateways' clocks say; the gateway then tries the other layout.
//   - After the switch a sharded grant still counts the single-tag leases that run (they are renewed and
//     released where they were taken: a lease ID without "@" is the single tag's): the candidates' limits
//     are lowered by the single-tag counts read first (one more round trip, script-free on one server).
//     Those counts only fall after the switch, so an endpoint's two counts together stay within its limit.
//     Once the single-tag layout holds no lease (checked with each marker read), the extra read stops.
//   - InFlight adds both layouts' counts while the single tag may hold leases.
//   - A switched gateway that finds the marker gone (an empty restart) writes it back.
//
// kvstore/RATIONALE.md, "Reservations on Redis Cluster", has the reasoning and the limits. Safe for
// concurrent use; Close stops the marker reads.
type LayoutRedisReservations struct {
	c         redis.UniversalClient
	single    *RedisReservations
	sharded   *ShardedRedisReservations
	marker    string
	oldLeases string // the single-tag lease ZSET (absent when it holds no lease)

	mu       sync.Mutex
	started  bool
	stop     chan struct{}
	done     chan struct{}
	read     time.Time // the last successful marker read (local clock)
	switchAt int64     // server ms of the switch; 0 while the marker is not raised
	offset   int64     // server ms minus local unix ms, at the last read
	drained  bool      // the switch has passed and the single tag held no lease at the last read
}

var _ Reservations = (*LayoutRedisReservations)(nil)

// NewLayoutRedisReservations returns reservations on client that follow the store's reservation-layout
// marker. It fails only for an invalid cfg.Prefix; it does not contact Redis (the marker is read at the
// first call).
func NewLayoutRedisReservations(client redis.UniversalClient, cfg RedisConfig) (*LayoutRedisReservations, error) {
	base, err := cfg.base()
	if err != nil {
		return nil, err
	}
	single, err := NewRedisReservations(client, cfg)
	if err != nil {
		return nil, err
	}
	sharded, err := NewShardedRedisReservations(client, cfg)
	if err != nil {
		return nil, err
	}
	return &LayoutRedisReservations{c: client, single: single, sharded: sharded, marker: base + reservationLayoutMarker,
		oldLeases: single.keys[1]}, nil
}

// ReservationLayoutKeyName returns the store's reservation-layout marker key
// ("<Prefix>:v1:reservation-layout").
func (r *LayoutRedisReservations) ReservationLayoutKeyName() string { return r.marker }

// Layout returns the layout this gateway grants in now (by its estimate of the server's clock): 1 (single
// tag) or 2 (sharded), and whether single-tag leases may still run (so sharded grants subtract them).
func (r *LayoutRedisReservations) Layout(ctx context.Context) (layout int, singleTagLeases bool) {
	st, _ := r.state(ctx, false)
	if st.switched() {
		return ReservationLayoutSharded, !st.drained
	}
	return ReservationLayoutSingle, true
}

// Close stops the marker reads (the client stays open). Calls still work afterwards, on the last state read.
func (r *LayoutRedisReservations) Close() error {
	r.mu.Lock()
	stop, done := r.stop, r.done
	r.stop, r.started = nil, true // no reads start after Close
	r.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	return nil
}

// layoutState is what the last marker read said.
type layoutState struct {
	switchAt, offset int64
	drained          bool
}

// switched reports whether the switch time has passed by the local estimate of the server's clock.
func (s layoutState) switched() bool {
	return s.switchAt > 0 && time.Now().UnixMilli()+s.offset >= s.switchAt
}

// state returns the marker's state, starting the marker reads at the first call. With fresh, a gateway
// that knows no switch time reads the marker first unless its last read is at most layoutMarkerFresh old
// (the error is then the read's).
func (r *LayoutRedisReservations) state(ctx context.Context, fresh bool) (layoutState, error) {
	r.mu.Lock()
	first := !r.started
	if first {
		r.started = true
		r.stop, r.done = make(chan struct{}), make(chan struct{})
		go r.follow(r.stop, r.done)
	}
	st := layoutState{switchAt: r.switchAt, offset: r.offset, drained: r.drained}
	stale := r.read.IsZero() || time.Since(r.read) > layoutMarkerFresh
	r.mu.Unlock()
	if first || (fresh && st.switchAt == 0 && stale) {
		if err := r.readMarker(ctx); err != nil && fresh && st.switchAt == 0 {
			return st, err
		}
		r.mu.Lock()
		st = layoutState{switchAt: r.switchAt, offset: r.offset, drained: r.drained}
		r.mu.Unlock()
	}
	return st, nil
}

// follow reads the marker every layoutMarkerPoll until stop is closed.
func (r *LayoutRedisReservations) follow(stop, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(layoutMarkerPoll)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = r.readMarker(ctx) // a failed read keeps what was in effect
		cancel()
	}
}

// readMarker reads (and, raised as plain "2", sets the switch time of) the marker, and after the switch
// whether the single tag still holds leases.
func (r *LayoutRedisReservations) readMarker(ctx context.Context) error {
	r.mu.Lock()
	restore := ""
	if r.switchAt > 0 {
		restore = "2 " + strconv.FormatInt(r.switchAt, 10)
	}
	r.mu.Unlock()
	t0 := time.Now()
	res, err := scriptResMarker.Run(ctx, r.c, []string{r.marker}, msCeil(layoutSwitchDelay), restore).Slice()
	t1 := time.Now()
	if err != nil {
		return fmt.Errorf("kvstore: redis reservation-layout marker: %w", err)
	}
	var v string
	var now int64
	if len(res) == 2 {
		v, _ = res[0].(string)
		now, _ = res[1].(int64)
	}
	var at int64
	if s, ok := strings.CutPrefix(v, "2 "); ok {
		at, err = strconv.ParseInt(s, 10, 64)
		if err != nil || at <= 0 {
			return fmt.Errorf("kvstore: redis reservation-layout marker %q: %w", v, ErrInvalidArgument)
		}
	}
	drained := false
	if at > 0 && now >= at {
		n, err := r.c.Exists(ctx, r.oldLeases).Result()
		if err != nil {
			return fmt.Errorf("kvstore: redis single-tag leases: %w", err)
		}
		drained = n == 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.read = t1
	r.offset = now - t0.Add(t1.Sub(t0)/2).UnixMilli()
	if at > 0 && r.switchAt == 0 { // never back: a marker gone is put back (by the script, next read)
		r.switchAt = at
	}
	if r.switchAt > 0 && now >= r.switchAt {
		r.drained = drained
	}
	return nil
}

// Reserve implements Reservations: in the layout of the moment (one script; after the switch, while the
// single tag holds leases, a read of its counts first), trying the other layout when the server says the
// switch time is on the other side.
func (r *LayoutRedisReservations) Reserve(ctx context.Context, ranked []Candidate, cost Cost, ttl time.Duration) (Lease, error) {
	if err := checkReserve(cost, ttl); err != nil {
		return Lease{}, err
	}
	st, err := r.state(ctx, true)
	if err != nil {
		return Lease{}, fmt.Errorf("kvstore: redis reserve: %w", err)
	}
	if st.switchAt == 0 {
		return r.single.reserveIn(ctx, ranked, cost, ttl, 0, 0)
	}
	sharded := st.switched()
	for range 2 {
		var l Lease
		if sharded {
			l, err = r.reserveSharded(ctx, ranked, cost, ttl, st)
		} else {
			l, err = r.single.reserveIn(ctx, ranked, cost, ttl, 0, st.switchAt)
		}
		if !errors.As(err, new(errWindow)) {
			return l, err
		}
		sharded = !sharded // the server's clock is on the other side of the switch
	}
	// Only on a Cluster, whose masters' clocks differ: both refused within their skew of the switch.
	return Lease{}, fmt.Errorf("kvstore: redis reserve at the reservation-layout switch: %w", ErrNoCapacity)
}

// reserveSharded grants in the sharded layout from the switch on, within each candidate's limits minus
// the single tag's count while that may hold leases.
func (r *LayoutRedisReservations) reserveSharded(ctx context.Context, ranked []Candidate, cost Cost, ttl time.Duration, st layoutState) (Lease, error) {
	if !st.drained {
		eps := make([]EndpointID, 0, len(ranked))
		for _, c := range ranked {
			if c.Endpoint != "" {
				eps = append(eps, c.Endpoint)
			}
		}
		old, err := r.single.InFlight(ctx, eps)
		if err != nil {
			return Lease{}, fmt.Errorf("kvstore: redis reserve: single-tag counts: %w", err)
		}
		if len(old) > 0 {
			left := make([]Candidate, 0, len(ranked))
			for _, c := range ranked {
				if o, ok := old[c.Endpoint]; ok {
					var full1, full2 bool
					c.Limits.MaxRequests, full1 = lower(c.Limits.MaxRequests, o.Requests, cost.Requests)
					c.Limits.MaxTokens, full2 = lower(c.Limits.MaxTokens, o.Tokens, cost.Tokens)
					if full1 || full2 {
						continue
					}
				}
				left = append(left, c)
			}
			ranked = left
		}
	}
	return r.sharded.reserveIn(ctx, ranked, cost, ttl, st.switchAt, 0)
}

// lower returns limit (0 = unlimited) less used elsewhere, and whether nothing of cost fits any more.
func lower(limit, used, cost int64) (int64, bool) {
	if limit <= 0 || used <= 0 {
		return limit, false
	}
	if left := limit - used; left > 0 {
		return left, false
	}
	return 0, cost > 0 // a zero cost never adds to this count: no bound needed
}

// Renew implements Reservations, in the layout the lease was taken in ("@" in its ID: sharded).
func (r *LayoutRedisReservations) Renew(ctx context.Context, l Lease, ttl time.Duration) (Lease, error) {
	if strings.Contains(l.ID, "@") {
		return r.sharded.Renew(ctx, l, ttl)
	}
	return r.single.Renew(ctx, l, ttl)
}

// Release implements Reservations, in the layout the lease was taken in (idempotent).
func (r *LayoutRedisReservations) Release(ctx context.Context, l Lease) error {
	if strings.Contains(l.ID, "@") {
		return r.sharded.Release(ctx, l)
	}
	return r.single.Release(ctx, l)
}

// InFlight implements Reservations: the single tag's counts until the marker is raised, the sharded
// layout's once the single tag holds no lease after the switch, and both added in between (two round trips).
func (r *LayoutRedisReservations) InFlight(ctx context.Context, eps []EndpointID) (map[EndpointID]Cost, error) {
	st, _ := r.state(ctx, false)
	if st.switchAt == 0 {
		return r.single.InFlight(ctx, eps)
	}
	sh, err := r.sharded.InFlight(ctx, eps)
	if err != nil || st.drained {
		return sh, err
	}
	old, err := r.single.InFlight(ctx, eps)
	if err != nil {
		return nil, err
	}
	for ep, c := range old {
		s := sh[ep]
		sh[ep] = Cost{Requests: s.Requests + c.Requests, Tokens: s.Tokens + c.Tokens}
	}
	return sh, nil
}
