package gateway

import "log/slog"

// storeRestartedEmpty is the one hook for "the store restarted empty" (kvstore.GuardConfig.OnEpochChange):
// the guard found a new store epoch (a Redis restart without persistence, or a flush), re-registered this
// gateway's running requests there, and calls this before it reserves on the new store. Work that must
// follow an empty restart of the reservation store goes here; it runs on the guard's recovery goroutine
// and must not reserve through the router. (The policy fleet state has its own marker and re-seeding:
// policysync.go.)
func (g *Gateway) storeRestartedEmpty(old, new string) {
	g.log.Warn("the store restarted without its data: running requests re-registered",
		slog.String("old_epoch", old), slog.String("epoch", new))
}
