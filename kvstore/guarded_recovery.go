package kvstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// pendingRelease is a store lease whose release could not reach the store.
type pendingRelease struct {
	lease Lease
	epoch string
}

// maxPendingReleases bounds the releases kept for retry; beyond it leases are left to expire.
const maxPendingReleases = 1 << 14

func (g *Guarded) deferRelease(l Lease, epoch string) {
	g.pendingMu.Lock()
	if len(g.pending) < maxPendingReleases {
		g.pending = append(g.pending, pendingRelease{l, epoch})
	}
	g.pendingMu.Unlock()
}

func (g *Guarded) currentEpoch() string {
	g.epochMu.Lock()
	defer g.epochMu.Unlock()
	return g.epoch
}

func (g *Guarded) inGrace() bool { return g.o.Now().UnixNano() < g.graceUntil.Load() }

// storeFailed switches to store-down mode (once per outage): the ledger freezes its base, from which the
// store-down caps are computed, and a probe starts.
func (g *Guarded) storeFailed(op string, err error) { g.storeFailedKind(op, err, false) }

// storeFailedKind is storeFailed; stalled says the store timed out rather than refused: the store-down caps
// then also keep within what the store still counts for this gateway (ledger.stalled).
func (g *Guarded) storeFailedKind(op string, err error, stalled bool) {
	g.downMu.Lock()
	g.downErr = op + ": " + err.Error()
	first := !g.down.Load()
	if first {
		g.downAt = g.o.Now()
		// Before the switch, so every store-down reservation sees this outage's base. A failure during the
		// recovery grace keeps the previous outage's base.
		g.led.freeze(g.inGrace(), time.Now(), stalled)
		g.down.Store(true)
	}
	g.downMu.Unlock()
	if !first {
		return
	}
	if g.o.OnDown != nil {
		g.o.OnDown(true)
	}
	g.o.Log.Warn("store unreachable: reserving within the store-down caps until it answers",
		slog.String("op", op), slog.String("error", err.Error()))
	if g.probing.CompareAndSwap(false, true) {
		select {
		case <-g.stop:
			g.probing.Store(false)
		default:
			g.wg.Go(g.probe)
		}
	}
}

// probe pings the store every probe interval until it answers and Guarded has re-registered its claims on
// it.
func (g *Guarded) probe() {
	defer g.probing.Store(false)
	t := time.NewTicker(g.o.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(g.o.ProbeInterval, time.Second))
		err := g.o.Remote.Ping(ctx)
		if err == nil {
			err = g.recover(ctx)
		}
		cancel()
		if err == nil {
			if g.o.OnDown != nil {
				g.o.OnDown(false)
			}
			g.o.Log.Info("store reachable again: claims re-registered; store-down caps kept during the recovery grace",
				slog.Float64("grace_seconds", g.o.RecoveryGrace.Seconds()))
			return
		}
	}
}

// recover brings the store's counters up to date with the ledger and switches back to store mode with a
// recovery grace. Under modeMu's write lock, so no store-down reservation slips in between.
func (g *Guarded) recover(ctx context.Context) error {
	g.modeMu.Lock()
	defer g.modeMu.Unlock()
	old := g.currentEpoch()
	epoch, err := g.o.Remote.Epoch(ctx)
	if err != nil {
		return err
	}
	changed := epoch != old
	if changed {
		g.o.Log.Warn("store epoch changed (it lost its data): re-registering every running request",
			slog.String("epoch", epoch))
	}
	g.sweep()
	n := 0
	for _, c := range g.led.live() {
		c.mu.Lock()
		err := g.syncClaimLocked(ctx, c, epoch)
		c.mu.Unlock()
		if err != nil {
			return err
		}
		n++
	}
	if err := g.flushReleases(ctx, epoch); err != nil {
		return err
	}
	if changed && g.o.OnEpochChange != nil {
		g.o.OnEpochChange(old, epoch)
	}
	g.epochMu.Lock()
	g.epoch = epoch
	g.epochMu.Unlock()
	g.graceUntil.Store(g.o.Now().Add(g.o.RecoveryGrace).UnixNano())
	g.downMu.Lock()
	g.down.Store(false)
	g.fails.Store(0)
	g.led.clearOrphans()
	g.downMu.Unlock()
	// Releases deferred while the switch was under way (best effort: a lease left behind expires).
	_ = g.flushReleases(ctx, epoch)
	g.o.Log.Info("claims checked on the store", slog.Int("claims", n), slog.Bool("epoch_changed", changed))
	return nil
}

// flushReleases releases on the store the leases whose release could not reach it, when they belong to
// epoch (a store of another epoch no longer holds them).
func (g *Guarded) flushReleases(ctx context.Context, epoch string) error {
	g.pendingMu.Lock()
	pend := g.pending
	g.pending = nil
	g.pendingMu.Unlock()
	for i, p := range pend {
		if p.epoch != epoch {
			continue
		}
		if err := g.res.Release(ctx, p.lease); err != nil {
			g.pendingMu.Lock()
			g.pending = append(g.pending, pend[i:]...)
			g.pendingMu.Unlock()
			return err
		}
	}
	return nil
}

// syncClaimLocked makes c's lease live on the store of epoch: renewed when the store still holds it, else
// registered again. c.mu is held.
func (g *Guarded) syncClaimLocked(ctx context.Context, c *claim, epoch string) error {
	if c.released {
		return nil
	}
	if c.onStore && c.epoch == epoch {
		start := g.o.Now()
		l, err := g.res.Renew(ctx, c.lease, c.ttl)
		if err == nil {
			c.lease = l
			c.backedUntil.Store(start.Add(c.ttl).UnixNano())
			return nil
		}
		if !errors.Is(err, ErrLeaseNotLive) {
			return err
		}
	}
	return g.registerLocked(ctx, c, epoch)
}

// registerLocked takes a new store lease for c without the limit check (the request already runs on the
// engine: the count must be there, whatever it says about the limit). c.mu is held.
func (g *Guarded) registerLocked(ctx context.Context, c *claim, epoch string) error {
	start := g.o.Now()
	l, err := g.res.Reserve(ctx, []Candidate{{Endpoint: c.ep}}, c.cost, c.ttl)
	if err != nil {
		return fmt.Errorf("kvstore: re-register a running request on %s: %w", c.ep, err)
	}
	c.lease, c.onStore, c.epoch = l, true, epoch
	c.backedUntil.Store(start.Add(c.ttl).UnixNano())
	return nil
}

// sweep stops counting the claims whose lease expired unrenewed on Guarded's clock (their holder neither
// renewed nor released them: the store would have dropped them too).
func (g *Guarded) sweep() {
	now := g.o.Now()
	for _, c := range g.led.live() {
		c.mu.Lock()
		expired := !c.released && now.After(c.expires)
		if expired {
			c.released = true
		}
		c.mu.Unlock()
		if expired {
			g.led.expire(c)
		}
	}
}

// watch runs while Guarded lives: every probe interval it drops expired claims and, with a Remote and the
// store up, checks the store's epoch (a store that restarted empty without any failed call in between is
// treated as an outage), refreshes the fleet's in-flight counters for the store-down base, and so on.
func (g *Guarded) watch() {
	t := time.NewTicker(g.o.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
		g.sweep()
		if g.o.Remote == nil || !g.storeUp() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(g.o.ProbeInterval, time.Second))
		g.check(ctx)
		cancel()
	}
}

func (g *Guarded) check(ctx context.Context) {
	ep, err := g.o.Remote.Epoch(ctx)
	if err != nil {
		g.failed("epoch", err)
		return
	}
	if cur := g.currentEpoch(); ep != cur {
		err := fmt.Errorf("store epoch changed from %q to %q: it restarted without its data", cur, ep)
		if g.o.OnError != nil {
			g.o.OnError("epoch", err, true)
		}
		g.storeFailed("epoch", err)
		return
	}
	if g.inGrace() || g.o.Endpoints == nil {
		return
	}
	ids := g.o.Endpoints()
	m, err := g.res.InFlight(ctx, ids)
	if err != nil {
		g.failed("inflight", err)
		return
	}
	if g.storeUp() && !g.inGrace() {
		g.led.observe(ids, m)
	}
}
