package gateway

import "log/slog"

// storeRestartedEmpty is the one hook for "the store restarted empty" (kvstore.GuardConfig.OnEpochChange):
// the guard found a new store epoch (a Redis restart without persistence, or a flush), re-registered this
// gateway's running requests there, and calls this before it reserves on the new store. It runs on the
// guard's recovery goroutine and must not reserve through the router. It hands the event to the fleet
// state (policySync.storeEmptied): modules, stacks, run-time endpoints and the TPU quarantine are re-seeded
// with the new epoch as the fleet-state marker, on the follower's goroutine; the first re-seeder under it
// wins (kvstore/RATIONALE.md, "One empty-restart event").
func (g *Gateway) storeRestartedEmpty(old, new string) {
	g.log.Warn("the store restarted without its data: running requests re-registered",
		slog.String("old_epoch", old), slog.String("epoch", new))
	if g.policySync != nil && old != "" {
		g.policySync.storeEmptied(new)
	}
}
