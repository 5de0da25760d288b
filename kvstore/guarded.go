package kvstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Remote is a store that can fail or lose its data while the gateway runs (Redis: RedisEpoch; tests:
// FaultyStore). Guarded probes it and reads its epoch.
type Remote interface {
	// Ping reports whether the store answers.
	Ping(ctx context.Context) error
	// Epoch returns the store's epoch: an opaque value that changes when the store loses its data (a Redis
	// restart without persistence), set by the first caller after such a loss.
	Epoch(ctx context.Context) (string, error)
}

// GuardConfig configures Guarded.
type GuardConfig struct {
	// Reservations is the store's reservations (required).
	Reservations Reservations
	// Index is the store's index (nil: Guarded's Index methods return ErrInvalidArgument).
	Index Index
	// Remote is the store's probe and epoch; nil for an in-process store (memory), which is never marked
	// down: nothing would probe it back up.
	Remote Remote
	// DownLimitShare is store_down_limit_share, in (0,1] (default 1): the share of each endpoint's limits
	// this gateway may use while the store is down (see the store-down cap in RATIONALE.md).
	DownLimitShare float64
	// Timeout bounds each call on a request's path (Match, Reserve, Renew, Release, InFlight; the caller's
	// deadline still applies when earlier): a hung store fails the call after this long and Guarded goes to
	// store-down mode. Default 200ms. Only with a Remote: an in-process store's calls run unbounded.
	Timeout time.Duration
	// ProbeInterval is how often the store is probed while down, and its epoch checked and the fleet's
	// in-flight counters read while up (Endpoints). Default 500ms.
	ProbeInterval time.Duration
	// RecoveryGrace is how long after the store returns Guarded still keeps to the store-down caps (besides
	// the store's own limit check), so gateways that notice the store later have re-registered their claims
	// before anyone reserves on the shared counters alone. Default max(3 × ProbeInterval, 1 s).
	RecoveryGrace time.Duration
	// DownAfter is how many consecutive ErrUnavailable failures mark the store down (default 5); a single
	// failure marks it down only if a PING (bounded by Timeout/2) fails too. A failure that does not mark the
	// store down fails its call (a Reserve then answers ErrNoCapacity wrapping the cause: the request waits
	// rather than being admitted outside the store's count).
	DownAfter int
	// StrictOnTimeout (store_down_strict) keeps a gateway whose store calls time out (rather than being
	// refused) within what the store still counts for it: its claims' store leases and the leases of
	// requests that ended during the outage, no new capacity. That closes the partial-outage overshoot (a
	// store that answers the other gateways while this one is cut off) at a price: a store hung for every
	// gateway then serves only what each held when it hung (an idle gateway answers 429). Default false:
	// a timed-out store is treated like a refused one, and this gateway keeps to the store-down share caps
	// (kvstore/RATIONALE.md, "Partial outages").
	StrictOnTimeout bool
	// OnsetHold, if set, keeps this gateway within what it held when the store failed, for up to OnsetHold
	// or until the engine's load has been scraped after the failure (NoteLoad); the store-down caps then
	// use that scrape. The gateway sets it to 2 × scrape_interval + 100 ms.
	OnsetHold time.Duration
	// Endpoints lists the endpoints whose fleet in-flight counters are read every ProbeInterval (for the
	// store-down base when no request read them lately); nil: only requests' InFlight calls read them.
	Endpoints func() []EndpointID
	// OnError is called for every failed store call (op: "match", "record", "reserve", "renew", "release",
	// "inflight", "epoch", "ping", an index write's name), down saying whether the failure is
	// ErrUnavailable (the store is then marked down). May be nil.
	OnError func(op string, err error, down bool)
	// OnDown is called when the store is marked down (true) and when Guarded has recovered onto it (false).
	// May be nil.
	OnDown func(down bool)
	// OnEpochChange is the one hook for "the store restarted empty": called, once per new epoch, after
	// Guarded re-registered its running claims on the new epoch and before it reserves there again (old is
	// "" when the first epoch read failed). It runs on the recovery goroutine: it must not call Guarded's
	// Reserve (it would wait for the recovery it runs in); other store writes (re-seeding) are fine. May be
	// nil.
	OnEpochChange func(old, new string)
	// Log receives Guarded's warnings (nil: slog.Default()).
	Log *slog.Logger
	// Now is the clock of lease expiry and the grace (nil: time.Now).
	Now func() time.Time
}

// Guarded is a decorator over a store's Reservations and Index that owns the store's failure handling, so
// that callers (the request pipeline) only see a store that answers, refuses (ErrNoCapacity, ...) or is
// unavailable (ErrUnavailable):
//   - Ledger: it counts every lease it hands out, per endpoint, whatever store the lease lives on, until
//     Release or until it expires unrenewed on Guarded's clock. Its leases keep their ID across outages
//     (re-registration gives the claim a new store lease under the same ID).
//   - Store-down mode: a call failing with ErrUnavailable (backends classify: RedisUnavailable) marks the
//     store down: Reserve then admits on the ledger alone within the store-down caps, InFlight answers this
//     gateway's own counts, Match and Record fail fast with ErrUnavailable, Renew extends locally and
//     Release is deferred; a probe runs every ProbeInterval until the store answers.
//   - Recovery: on the store's return it reads the epoch; it renews each running claim's lease if the store
//     still holds it (same epoch), else registers it again without the limit check, retries the deferred
//     releases of that epoch, calls OnEpochChange when the epoch changed, then reserves on the store again,
//     within the store-down caps as well for RecoveryGrace.
//   - Epoch detection while up: every ProbeInterval the epoch is read; a change (a restart nobody saw
//     fail) is an outage followed by recovery. ExpectedEpoch feeds the Redis connection check
//     (RedisEpoch.Expect), which refuses a restarted standalone Redis on its first new connection.
//   - Status for /readyz (Status).
//
// The index writes (Add, Remove, Apply, Clear*, Demote, RaiseFence, a Fenced view's writes) pass through
// (errors classified, never failed fast): ingestion has its own retry and resync. With Remote nil the store
// is never marked down. Safe for concurrent use; create with NewGuarded, stop with Close. RATIONALE.md,
// "Guarded: the store owns store failure", explains the rules.
type Guarded struct {
	o   GuardConfig
	res Reservations
	idx Index
	led *ledger

	// modeMu orders store-down reservations (read lock) against recovery (write lock), so no claim taken
	// while the store is down escapes re-registration.
	modeMu sync.RWMutex
	// graceMu serializes reservations during the recovery grace (store reserve + ledger cap, as one step).
	graceMu    sync.Mutex
	graceUntil atomic.Int64 // unix nanoseconds
	epochMu    sync.Mutex
	epoch      string // the store epoch the store claims were taken in ("" when unknown or no Remote)
	pendingMu  sync.Mutex
	pending    []pendingRelease

	down     atomic.Bool
	fails    atomic.Int64 // consecutive ErrUnavailable failures while up (reset by any answered call)
	downMu   sync.Mutex
	downErr  string
	downAt   time.Time
	probing  atomic.Bool
	stopOnce sync.Once
	stop     chan struct{}
	wg       sync.WaitGroup
}

// claim is one lease Guarded handed out: one request's count on one endpoint, in the ledger until Release
// or expiry, with a lease on the store when the store took it (or once recovery registered it).
type claim struct {
	id   string // the lease ID handed out (stable across re-registration)
	ep   EndpointID
	cost Cost

	// backedUntil (unix nanoseconds on Guarded's clock, 0 = never) is when the store stops counting this
	// claim's store lease at the latest: the start of the last call that set its TTL, plus the TTL. Atomic,
	// so the ledger reads it under its own lock (c.mu is taken before the ledger's, never after).
	backedUntil atomic.Int64

	mu       sync.Mutex
	ttl      time.Duration
	expires  time.Time // on Guarded's clock
	lease    Lease     // the store lease when onStore
	onStore  bool
	epoch    string // the store epoch lease was taken in
	released bool
}

// guardIDPrefix starts the IDs of leases only Guarded knows (taken while the store was down, or renamed
// because a restarted store reused an ID): never passed to the store.
const guardIDPrefix = "guard-"

var (
	_ Reservations = (*Guarded)(nil)
	_ Index        = (*Guarded)(nil)
	_ Fencer       = (*Guarded)(nil)
	_ Demoter      = (*Guarded)(nil)
)

// NewGuarded returns a Guarded over o's store. With a Remote it reads the store's epoch once (bounded by
// 2 s; a failure starts in store-down mode) and starts its probe and epoch check.
func NewGuarded(o GuardConfig) *Guarded {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = 500 * time.Millisecond
	}
	if o.Timeout <= 0 {
		o.Timeout = 200 * time.Millisecond
	}
	if o.DownLimitShare <= 0 || o.DownLimitShare > 1 {
		o.DownLimitShare = 1
	}
	if o.DownAfter <= 0 {
		o.DownAfter = 5
	}
	if o.RecoveryGrace <= 0 {
		o.RecoveryGrace = max(3*o.ProbeInterval, time.Second)
	}
	led := newLedger(o.DownLimitShare)
	led.hold, led.margin, led.now = o.OnsetHold, 50*time.Millisecond, o.Now
	g := &Guarded{o: o, res: o.Reservations, idx: o.Index, led: led, stop: make(chan struct{})}
	if o.Remote != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		ep, err := o.Remote.Epoch(ctx)
		cancel()
		if err != nil {
			g.storeFailed("epoch", err)
		} else {
			g.epoch = ep
		}
	}
	g.wg.Go(g.watch)
	return g
}

// Close stops the probe and the epoch check (the store itself is the caller's).
func (g *Guarded) Close() {
	g.stopOnce.Do(func() { close(g.stop) })
	g.wg.Wait()
}

// IsRemote says whether the store is a remote one (Remote set): its calls are round trips.
func (g *Guarded) IsRemote() bool { return g.o.Remote != nil }

// GuardStatus is the store's state as Guarded sees it, for /readyz.
type GuardStatus struct {
	Down bool `json:"down"`
	// Since is when it was found down (zero when up).
	Since time.Time `json:"since,omitzero"`
	// LastError is the last failure that marked the store down ("op: error").
	LastError string `json:"last_error,omitempty"`
	// Recovering says the store is back but Guarded still keeps to its store-down caps (the recovery grace).
	Recovering bool `json:"recovering"`
	// OwnInFlight counts the leases this gateway holds (its ledger).
	OwnInFlight int `json:"own_inflight"`
	// LocalInFlight counts those of them with no lease on the current store (taken while it was down, or not
	// yet re-registered after it came back).
	LocalInFlight int `json:"local_inflight"`
	// PictureAt is when this gateway last read the store's shared in-flight counters with the store up and
	// no recovery grace running: the fleet's picture its store-down caps start from (zero before the first).
	PictureAt time.Time `json:"picture_at,omitzero"`
}

// Status reports the store's state.
func (g *Guarded) Status() GuardStatus {
	g.downMu.Lock()
	s := GuardStatus{Down: g.down.Load(), LastError: g.downErr}
	if s.Down {
		s.Since = g.downAt
	}
	g.downMu.Unlock()
	s.Recovering = !s.Down && g.inGrace()
	s.OwnInFlight, s.LocalInFlight = g.led.counts(g.currentEpoch())
	s.PictureAt = g.led.pictureAt()
	return s
}

// Down says whether the store is marked down now.
func (g *Guarded) Down() bool { return g.down.Load() }

// NoteLoad records a scrape of ep's engine load (running plus waiting requests, taken at), for the
// store-down caps at the onset of an outage (GuardConfig.OnsetHold). Safe from any goroutine.
func (g *Guarded) NoteLoad(ep EndpointID, inflight int64, at time.Time) {
	g.led.noteEngine(ep, inflight, at)
}

// ExpectedEpoch returns the store epoch Guarded's store leases belong to, and whether new connections to the
// store must show it: true while the store is up and out of its recovery, false while it is down or
// recovering (the recovery itself reads the new epoch) or without a Remote. Pass it to RedisEpoch.Expect.
func (g *Guarded) ExpectedEpoch() (string, bool) {
	ep := g.currentEpoch()
	return ep, g.o.Remote != nil && ep != "" && g.storeUp()
}

func (g *Guarded) storeUp() bool { return !g.down.Load() }

// bounded returns ctx bounded by the request-path timeout. An in-process store (Remote nil) gets ctx as it
// is: its calls do no I/O that could hang, and a timer per call was ~3% of a short request's CPU on the
// memory store (gateway/RATIONALE.md, "Where a short request's CPU goes").
func (g *Guarded) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if g.o.Remote == nil {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, g.o.Timeout)
}

// downErrNow is the error of a call refused because the store is marked down.
func (g *Guarded) downErrNow(op string) error {
	g.downMu.Lock()
	last := g.downErr
	g.downMu.Unlock()
	return Unavailable(fmt.Errorf("kvstore: %s: store down (%s)", op, last))
}

// failed handles a failed store call op: an ErrUnavailable one marks the store down (with a Remote), any
// other is only reported. It reports whether the store is now marked down.
func (g *Guarded) failed(op string, err error) bool {
	unavailable := g.o.Remote != nil && errors.Is(err, ErrUnavailable)
	down, stalled := false, false
	if unavailable {
		down, stalled = g.confirmDown(err)
		stalled = stalled && g.o.StrictOnTimeout
	}
	if g.o.OnError != nil {
		g.o.OnError(op, err, down)
	}
	if down {
		g.storeFailedKind(op, err, stalled)
		return true
	}
	if unavailable {
		return false // counted toward DownAfter; the call fails, the store stays up
	}
	if !refusal(err) {
		g.o.Log.Warn("store refused an operation (the store stays up)", slog.String("op", op),
			slog.String("error", err.Error()))
	}
	return false
}

// confirmDown decides whether an ErrUnavailable failure marks the store down: when it is already down,
// after DownAfter consecutive failures, or when a PING bounded by Timeout/2 fails too. stalled says the
// store timed out rather than refused (see ledger.stalled): it may still answer other gateways.
func (g *Guarded) confirmDown(err error) (down, stalled bool) {
	stalled = isTimeout(err)
	if g.down.Load() || errors.Is(err, ErrEpochChanged) {
		return true, stalled // a restarted store: recovery must run before anything is reserved there
	}
	if g.fails.Add(1) >= int64(g.o.DownAfter) {
		return true, stalled
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(g.o.Timeout/2, time.Millisecond))
	perr := g.o.Remote.Ping(ctx)
	cancel()
	if perr == nil {
		return false, false
	}
	return true, stalled || isTimeout(perr)
}

// answered notes a store call that got an answer (any reply, a refusal included): failures are no longer
// consecutive.
func (g *Guarded) answered() {
	if g.fails.Load() != 0 {
		g.fails.Store(0)
	}
}

// isTimeout says whether err is a deadline or an I/O timeout (the store may be alive but out of reach),
// as opposed to a refusal to connect (the store process is gone, for every gateway).
func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne interface{ Timeout() bool }
	return errors.As(err, &ne) && ne.Timeout()
}

// refusal says whether err is one of the store's typed answers (or a cancelled call): not worth a warning.
func refusal(err error) bool {
	for _, e := range []error{context.Canceled, ErrNoCapacity, ErrLeaseNotLive, ErrInvalidArgument, ErrInvalidTier,
		ErrNotFound, ErrFenced, ErrTooManyEndpoints, ErrDigestMismatch} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Reserve implements Reservations: with the store up the store's atomic reservation decides; with it down,
// the ledger's store-down cap; during the recovery grace both must agree. A store failing during the call
// marks it down and the call is tried once more within the store-down cap. The lease returned is Guarded's:
// renew and release it through this Guarded.
func (g *Guarded) Reserve(ctx context.Context, ranked []Candidate, cost Cost, ttl time.Duration) (Lease, error) {
	if err := checkReserve(cost, ttl); err != nil {
		return Lease{}, err
	}
	if len(ranked) == 0 {
		return Lease{}, ErrNoCapacity
	}
	local := func(c Candidate) *claim {
		return &claim{ep: c.Endpoint, cost: cost, ttl: ttl, expires: g.o.Now().Add(ttl)}
	}
	for {
		// The read lock keeps recovery (write lock) from running between the mode check and the claim's
		// counting: every claim is either on the current store or seen by recovery.
		g.modeMu.RLock()
		if !g.storeUp() {
			cl, _ := g.led.reserveLocal(ranked, cost, local)
			g.modeMu.RUnlock()
			if cl == nil {
				return Lease{}, ErrNoCapacity
			}
			return cl.handle(), nil
		}
		grace := g.inGrace()
		if grace {
			g.graceMu.Lock()
		}
		cands := ranked
		if grace {
			cands = g.led.admissible(ranked, cost)
		}
		var cl *claim
		var err error
		if len(cands) == 0 {
			err = ErrNoCapacity
		} else {
			var l Lease
			start := g.o.Now()
			sctx, cancel := g.bounded(ctx)
			l, err = g.res.Reserve(sctx, cands, cost, ttl)
			cancel()
			if err == nil || errors.Is(err, ErrNoCapacity) {
				g.answered()
			}
			if err == nil {
				// expires counts from before the store call: the store's TTL starts later, so the ledger
				// never counts a claim the store has dropped (RATIONALE.md, "One lease clock").
				cl = &claim{id: l.ID, ep: l.Endpoint, cost: cost, ttl: ttl, expires: start.Add(ttl),
					lease: l, onStore: true, epoch: g.currentEpoch()}
				cl.backedUntil.Store(start.Add(ttl).UnixNano())
				if !g.led.addGranted(cl, cands, grace, g.storeUp) {
					// The store failed while its grant was on its way: the store-down reservations made
					// since did not see this claim, and it does not fit beside them. Give the lease back
					// and refuse like any request over the cap.
					g.dropLease(l, cl.epoch)
					cl, err = nil, ErrNoCapacity
				}
			}
		}
		if grace {
			g.graceMu.Unlock()
		}
		g.modeMu.RUnlock()
		if err != nil && !errors.Is(err, ErrNoCapacity) && ctx.Err() == nil {
			if g.failed("reserve", err) {
				continue // the store is unreachable: once more, within the store-down cap
			}
			if errors.Is(err, ErrUnavailable) {
				// Not (yet) marked down: the store may be answering the other gateways, so admitting here
				// outside its count could run an endpoint over its limit. The request waits instead.
				return Lease{}, fmt.Errorf("%w: store call failed, not marked down: %w", ErrNoCapacity, err)
			}
		}
		if err != nil {
			return Lease{}, err
		}
		return cl.handle(), nil
	}
}

// handle is the lease handed out for c.
func (c *claim) handle() Lease {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Lease{ID: c.id, Endpoint: c.ep, Cost: c.cost, Expires: c.expires}
}

// Renew implements Reservations. A lease of this Guarded's is live until its TTL passes on Guarded's clock
// without a renewal (then ErrLeaseNotLive, and the ledger stops counting it), whatever the store says:
// while the store is down, or before recovery registered the claim, the renewal is local; a store lease the
// store no longer knows while the claim is live (a restart, a flush) is registered again without the limit
// check, so the shared count is not lost. A store failing during the renewal marks it down; the renewal
// still succeeds locally. A lease Guarded did not hand out is renewed on the store as it is.
func (g *Guarded) Renew(ctx context.Context, l Lease, ttl time.Duration) (Lease, error) {
	if ttl <= 0 {
		return Lease{}, fmt.Errorf("kvstore: renew: ttl %v: %w", ttl, ErrInvalidArgument)
	}
	c := g.led.lookup(l.ID)
	if c == nil {
		if strings.HasPrefix(l.ID, guardIDPrefix) || g.led.wasExpired(l.ID) {
			return Lease{}, fmt.Errorf("kvstore: renew %s: %w", l.ID, ErrLeaseNotLive)
		}
		if !g.storeUp() {
			return Lease{}, g.downErrNow("renew")
		}
		sctx, cancel := g.bounded(ctx)
		nl, err := g.res.Renew(sctx, l, ttl)
		cancel()
		if err != nil && ctx.Err() == nil && !errors.Is(err, ErrLeaseNotLive) {
			g.failed("renew", err)
		}
		return nl, err
	}
	c.mu.Lock()
	now := g.o.Now()
	if c.released || now.After(c.expires) {
		expired := !c.released
		c.released = true
		c.mu.Unlock()
		if expired {
			g.led.expire(c)
		}
		return Lease{}, fmt.Errorf("kvstore: renew %s: %w", l.ID, ErrLeaseNotLive)
	}
	defer c.mu.Unlock()
	c.ttl, c.expires = ttl, now.Add(ttl)
	out := Lease{ID: c.id, Endpoint: c.ep, Cost: c.cost, Expires: c.expires}
	if !c.onStore || !g.storeUp() || c.epoch != g.currentEpoch() {
		return out, nil
	}
	start := g.o.Now()
	sctx, cancel := g.bounded(ctx)
	sl, err := g.res.Renew(sctx, c.lease, ttl)
	cancel()
	switch {
	case err == nil:
		g.answered()
		c.lease = sl
		c.backedUntil.Store(start.Add(ttl).UnixNano())
	case errors.Is(err, ErrLeaseNotLive):
		g.o.Log.Warn("lease lost on the store while its request runs: registering it again",
			slog.String("endpoint_id", string(c.ep)), slog.String("lease", c.lease.ID))
		rctx, cancel := g.bounded(context.WithoutCancel(ctx))
		defer cancel()
		if err := g.registerLocked(rctx, c, c.epoch); err != nil && !g.failed("renew", err) {
			return out, err
		}
	case ctx.Err() != nil:
		return out, ctx.Err()
	default:
		if !g.failed("renew", err) {
			return out, err
		}
	}
	return out, nil
}

// Release implements Reservations (idempotent): the ledger stops counting the lease and its store lease, if
// it has one in the current store epoch, is released. A release the store cannot take now is retried when
// the store returns in the same epoch (otherwise the lease expires on its own); it is not an error.
func (g *Guarded) Release(ctx context.Context, l Lease) error {
	c := g.led.lookup(l.ID)
	if c == nil {
		if strings.HasPrefix(l.ID, guardIDPrefix) || l.ID == "" {
			return nil
		}
		// Not ours (another gateway's, or already released): release it on the store as it is.
		if !g.storeUp() {
			g.deferRelease(l, g.currentEpoch())
			return nil
		}
		return g.releaseOnStore(ctx, l, g.currentEpoch(), nil)
	}
	c.mu.Lock()
	if c.released {
		c.mu.Unlock()
		return nil
	}
	c.released = true
	onStore, epoch, sl := c.onStore, c.epoch, c.lease
	c.mu.Unlock()
	if !g.led.remove(c) || !onStore {
		return nil
	}
	if !g.storeUp() {
		g.led.addOrphan(c) // the store keeps counting it for this gateway until its TTL
		g.deferRelease(sl, epoch)
		return nil
	}
	if epoch != g.currentEpoch() {
		return nil // the store restarted: this lease ID may name another gateway's lease now
	}
	return g.releaseOnStore(ctx, sl, epoch, c)
}

// releaseOnStore releases l (the store lease of c, nil for a lease that is not this Guarded's claim),
// deferring it when the store fails.
func (g *Guarded) releaseOnStore(ctx context.Context, l Lease, epoch string, c *claim) error {
	sctx, cancel := g.bounded(context.WithoutCancel(ctx))
	defer cancel()
	if err := g.res.Release(sctx, l); err != nil {
		if g.failed("release", err) {
			if c != nil {
				g.led.addOrphan(c)
			}
			g.deferRelease(l, epoch) // retried when the store answers again
			return nil
		}
		return err
	}
	return nil
}

// dropLease gives back a store lease that no claim holds: at once while the store is up, else when it
// answers again in the same epoch.
func (g *Guarded) dropLease(l Lease, epoch string) {
	if !g.storeUp() {
		g.deferRelease(l, epoch)
		return
	}
	_ = g.releaseOnStore(context.Background(), l, epoch, nil)
}

// InFlight implements Reservations: the store's live leased cost per endpoint while the store is up (and
// remembered as the fleet's picture for the store-down caps), this gateway's own (its ledger) while it is
// down or when the call fails with ErrUnavailable.
func (g *Guarded) InFlight(ctx context.Context, eps []EndpointID) (map[EndpointID]Cost, error) {
	if g.storeUp() {
		sctx, cancel := g.bounded(ctx)
		m, err := g.res.InFlight(sctx, eps)
		cancel()
		if err == nil {
			g.answered()
			if g.storeUp() && !g.inGrace() {
				g.led.observe(eps, m)
			}
			return m, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		if !g.failed("inflight", err) {
			return nil, err
		}
	}
	return g.led.ownCounts(eps), nil
}
