package gateway

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/kvgate/kvgate/tpu"
)

// tpuCopyInterval is how often a gateway on Redis copies the store's registered TPU slices (tpuSlices).
const tpuCopyInterval = time.Second

// tpuQuarantineHolder is the holder of the lease that quarantines a restored slice.
const tpuQuarantineHolder = "kvgate: quarantined, the store restarted empty and its leases were lost"

// tpuSlices is this gateway's read-only copy of the store's registered TPU slices, for
// requarantineTPUSlices: the specs and host health by pool, and the longest lease lifetime seen. Slices are
// never unregistered, so the copy only grows (a read of a store that restarted empty changes nothing).
type tpuSlices struct {
	mu      sync.Mutex
	pools   map[string]map[string]tpuSliceCopy // pool → slice ID → copy
	longest time.Duration                      // the longest remaining lease time seen in a copy
}

type tpuSliceCopy struct {
	spec      tpu.SliceSpec
	unhealthy []string // host names
}

// copyTPUSlices refreshes g.tpuCopy from the store every tpuCopyInterval until ctx ends.
func (g *Gateway) copyTPUSlices(ctx context.Context) {
	t := time.NewTicker(tpuCopyInterval)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, tpuCopyInterval)
		g.tpuCopy.refresh(rctx, g.tpu)
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (c *tpuSlices) refresh(ctx context.Context, a *tpu.Allocator) {
	pools, err := a.Pools(ctx)
	if err != nil {
		return
	}
	now := time.Now()
	for _, pool := range pools {
		pi, err := a.List(ctx, pool)
		if err != nil {
			return
		}
		c.mu.Lock()
		if c.pools == nil {
			c.pools = map[string]map[string]tpuSliceCopy{}
		}
		if c.pools[pool] == nil {
			c.pools[pool] = map[string]tpuSliceCopy{}
		}
		for _, s := range pi.Slices {
			sc := tpuSliceCopy{spec: tpu.SliceSpec{ID: s.ID, Generation: s.Generation, Topology: s.Topology, DevicesPerChip: s.DevicesPerChip}}
			for _, h := range s.Hosts {
				sc.spec.Hosts = append(sc.spec.Hosts, tpu.Host{Name: h.Name, WorkerID: h.WorkerID})
				if !h.Healthy {
					sc.unhealthy = append(sc.unhealthy, h.Name)
				}
			}
			for _, l := range s.Leases {
				if l.Holder != tpuQuarantineHolder {
					c.longest = max(c.longest, l.ExpiresAt.Sub(now))
				}
			}
			c.pools[pool][s.ID] = sc
		}
		c.mu.Unlock()
	}
}

// requarantineTPUSlices registers again every TPU slice this gateway's copy holds, after the store restarted
// empty (the re-seed path calls it): the leases were lost, yet their holders may still be using the chips,
// so each slice comes back with every chip quarantined — one whole-slice lease (holder
// tpuQuarantineHolder) for the longest lease lifetime the copy saw plus one copy interval, at most 24 h —
// and its unhealthy hosts marked again, all in the registration's one atomic step (tpu.RegisterHeld), so no
// reservation can take a chip in between. Safe to call from several gateways: the first registration wins
// and the others write nothing.
func (g *Gateway) requarantineTPUSlices(ctx context.Context) {
	c := &g.tpuCopy
	c.mu.Lock()
	ttl := min(c.longest+tpuCopyInterval, 24*time.Hour)
	type item struct {
		pool string
		sc   tpuSliceCopy
	}
	var items []item
	for pool, ss := range c.pools {
		for _, sc := range ss {
			items = append(items, item{pool, sc})
		}
	}
	c.mu.Unlock()
	for _, it := range items {
		log := g.log.With(slog.String("pool", it.pool), slog.String("slice", it.sc.spec.ID))
		created, err := g.tpu.RegisterHeld(ctx, it.pool, it.sc.spec, tpu.Hold{Holder: tpuQuarantineHolder, TTL: ttl, Unhealthy: it.sc.unhealthy})
		switch {
		case err != nil:
			log.Warn("could not register a TPU slice again after the store restarted empty", slog.String("error", err.Error()))
		case created:
			log.Warn("TPU slice registered again after the store restarted empty; every chip quarantined until the lost leases have expired",
				slog.Float64("quarantine_seconds", ttl.Seconds()))
		} // not created: another gateway registered it first, with its hold
	}
}
