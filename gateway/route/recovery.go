package route

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/kvgate/kvgate/kvstore"
)

// pendingRelease is a store lease whose release could not reach the store.
type pendingRelease struct {
	lease kvstore.Lease
	epoch string
}

// maxPendingReleases bounds the releases kept for retry; beyond it leases are left to expire.
const maxPendingReleases = 1 << 14

func (r *Router) deferRelease(l kvstore.Lease, epoch string) {
	r.pendingMu.Lock()
	if len(r.pending) < maxPendingReleases {
		r.pending = append(r.pending, pendingRelease{l, epoch})
	}
	r.pendingMu.Unlock()
}

func (r *Router) currentEpoch() string {
	r.epochMu.Lock()
	defer r.epochMu.Unlock()
	return r.epoch
}

func (r *Router) inGrace() bool { return r.o.Now().UnixNano() < r.graceUntil.Load() }

// storeFailed switches to store-down routing (once per outage): the ledger freezes its base, from which the
// store-down caps are computed, and a probe starts.
func (r *Router) storeFailed(op string, err error) {
	r.o.Metrics.StoreErrors.WithLabelValues(op).Inc()
	r.downMu.Lock()
	r.downErr = op + ": " + err.Error()
	first := !r.down.Load()
	if first {
		r.downAt = r.o.Now()
		// Before the switch, so every store-down reservation sees this outage's base. A failure during the
		// recovery grace keeps the previous outage's base.
		r.led.freeze(r.inGrace(), time.Now())
		r.down.Store(true)
	}
	r.downMu.Unlock()
	if first {
		r.o.Metrics.StoreDown.Set(1)
		r.o.Log.Warn("store unreachable: routing on load only within the store-down caps",
			slog.String("op", op), slog.String("error", err.Error()))
		if r.o.Pinger != nil && r.probing.CompareAndSwap(false, true) {
			go r.probeStore()
		}
	}
}

// probeStore pings the store every probe interval until it answers and this router has re-registered its
// claims on it.
func (r *Router) probeStore() {
	defer r.probing.Store(false)
	t := time.NewTicker(r.o.StoreProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(r.o.StoreProbeInterval, time.Second))
		err := r.o.Pinger.Ping(ctx)
		if err == nil {
			err = r.recoverStore(ctx)
		}
		cancel()
		if err == nil {
			r.o.Metrics.StoreDown.Set(0)
			r.o.Log.Info("store reachable again: claims re-registered; store-down caps kept during the recovery grace",
				slog.Float64("grace_seconds", r.o.RecoveryGrace.Seconds()))
			return
		}
	}
}

// recoverStore brings the store's counters up to date with this gateway's ledger and switches back to store
// routing with a recovery grace. Under modeMu's write lock, so no store-down reservation slips in between.
func (r *Router) recoverStore(ctx context.Context) error {
	r.modeMu.Lock()
	defer r.modeMu.Unlock()
	epoch := r.currentEpoch()
	if r.o.Epocher != nil {
		var err error
		if epoch, err = r.o.Epocher.Epoch(ctx); err != nil {
			return err
		}
	}
	changed := epoch != r.currentEpoch()
	if changed {
		r.o.Log.Warn("store epoch changed (it lost its data): re-registering every running request",
			slog.String("epoch", epoch))
	}
	n := 0
	for _, c := range r.led.live() {
		c.mu.Lock()
		err := r.syncClaimLocked(ctx, c, epoch)
		c.mu.Unlock()
		if err != nil {
			return err
		}
		n++
	}
	if err := r.flushReleases(ctx, epoch); err != nil {
		return err
	}
	r.epochMu.Lock()
	r.epoch = epoch
	r.epochMu.Unlock()
	r.graceUntil.Store(r.o.Now().Add(r.o.RecoveryGrace).UnixNano())
	r.downMu.Lock()
	r.down.Store(false)
	r.downMu.Unlock()
	// Releases deferred while the switch was under way (best effort: a lease left behind expires).
	_ = r.flushReleases(ctx, epoch)
	r.o.Log.Info("claims checked on the store", slog.Int("claims", n), slog.Bool("epoch_changed", changed))
	return nil
}

// flushReleases releases on the store the leases whose release could not reach it, when they belong to
// epoch (a store of another epoch no longer holds them).
func (r *Router) flushReleases(ctx context.Context, epoch string) error {
	r.pendingMu.Lock()
	pend := r.pending
	r.pending = nil
	r.pendingMu.Unlock()
	for i, p := range pend {
		if p.epoch != epoch {
			continue
		}
		if err := r.o.Reservations.Release(ctx, p.lease); err != nil {
			r.pendingMu.Lock()
			r.pending = append(r.pending, pend[i:]...)
			r.pendingMu.Unlock()
			return err
		}
	}
	return nil
}

// syncClaimLocked makes c's lease live on the store of epoch: renewed when the store still holds it, else
// registered again. c.mu is held.
func (r *Router) syncClaimLocked(ctx context.Context, c *Claim, epoch string) error {
	if c.released {
		return nil
	}
	if c.onStore && c.epoch == epoch {
		l, err := r.o.Reservations.Renew(ctx, c.lease, r.o.LeaseTTL)
		if err == nil {
			c.lease = l
			return nil
		}
		if !errors.Is(err, kvstore.ErrLeaseNotLive) {
			return err
		}
	}
	return r.registerLocked(ctx, c, epoch)
}

// registerLocked takes a new store lease for c without the limit check (the request already runs on the
// engine: the count must be there, whatever it says about the limit). c.mu is held.
func (r *Router) registerLocked(ctx context.Context, c *Claim, epoch string) error {
	l, err := r.o.Reservations.Reserve(ctx, []kvstore.Candidate{{Endpoint: c.ep}}, c.cost, r.o.LeaseTTL)
	if err != nil {
		return fmt.Errorf("route: re-register a running request on %s: %w", c.ep, err)
	}
	c.lease, c.onStore, c.epoch = l, true, epoch
	return nil
}

// watchStore runs while the router lives: every probe interval, with the store up, it checks the store's
// epoch (a store that restarted empty without any failed call in between is treated as an outage), refreshes
// the fleet's in-flight counters for the store-down base, and ends the recovery grace.
func (r *Router) watchStore() {
	t := time.NewTicker(r.o.StoreProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		if !r.storeUp() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(r.o.StoreProbeInterval, time.Second))
		r.checkStore(ctx)
		cancel()
	}
}

func (r *Router) checkStore(ctx context.Context) {
	if r.o.Epocher != nil {
		ep, err := r.o.Epocher.Epoch(ctx)
		if err != nil {
			r.storeError("epoch", err)
			return
		}
		if ep != r.currentEpoch() {
			r.storeFailed("epoch", fmt.Errorf("store epoch changed from %q to %q: it restarted without its data", r.currentEpoch(), ep))
			return
		}
	}
	if r.inGrace() || r.o.Endpoints == nil {
		return
	}
	all := r.o.Endpoints.Endpoints()
	ids := make([]kvstore.EndpointID, 0, len(all))
	for _, e := range all {
		ids = append(ids, RankIDs(e.ID, e.DataParallelSize)...)
	}
	m, err := r.o.Reservations.InFlight(ctx, ids)
	if err != nil {
		r.storeError("inflight", err)
		return
	}
	if r.storeUp() && !r.inGrace() {
		r.led.observe(ids, m)
	}
}

// StoreEpoch returns the store epoch this router's store leases belong to, and whether new connections to the
// store must show it: true while the store is up and out of its recovery, false while it is down or recovering
// (the recovery itself reads the new epoch) or when no Epocher is configured.
func (r *Router) StoreEpoch() (string, bool) {
	ep := r.currentEpoch()
	return ep, r.o.Epocher != nil && ep != "" && r.storeUp()
}
