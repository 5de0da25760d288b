package gateway

import (
	"context"
	"log/slog"
	"time"
)

// Drain stops the gateway the way a load balancer needs (issue #17 item 6; README "Operations"):
//
//  1. at once: /readyz answers 503 {"ready":false,"draining":true}, every response closes its connection,
//     and the event-ingestion leases are released, so another gateway on the same store takes the
//     endpoints' KV events over at its next lease attempt (within IngestLeaseTick) instead of after
//     the lease expires;
//  2. for grace (shutdown_grace) the listener keeps accepting and requests are served as usual (routing
//     reads the index the new ingestion holders now feed); ctx ending cuts the grace short;
//  3. then the listener closes and in-flight requests, streams included, get up to timeout
//     (drain_timeout) to end; those still running are cancelled (their engine requests too) and their
//     leases released; then the gateway closes (Close).
//
// It returns Close's error (context.DeadlineExceeded when requests had to be cancelled).
func (g *Gateway) Drain(ctx context.Context, grace, timeout time.Duration) error {
	start := time.Now()
	g.srv.SetDraining()
	g.log.Info("draining: /readyz fails; serving on through the grace", slog.Float64("shutdown_grace_seconds", grace.Seconds()),
		slog.Float64("drain_timeout_seconds", timeout.Seconds()), slog.Int64("in_flight", g.srv.Active()))
	g.handOverIngestion()
	t := time.NewTimer(time.Until(start.Add(grace)))
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
	g.log.Info("draining: listener closed; waiting for in-flight requests", slog.Int64("in_flight", g.srv.Active()))
	dctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := g.Close(dctx)
	g.log.Info("drained", slog.Float64("seconds", time.Since(start).Seconds()), slog.Int64("still_active", g.srv.Active()),
		slog.Bool("timed_out", dctx.Err() != nil))
	return err
}

// handOverIngestion stops every event ingester and releases its store lease (runIngestion's exit path).
func (g *Gateway) handOverIngestion() {
	if g.ingCancel == nil {
		return
	}
	g.ingCancel()
	g.ingWG.Wait()
	g.log.Info("event ingestion handed over: leases released")
}

// Draining says whether Drain has begun.
func (g *Gateway) Draining() bool { return g.srv != nil && g.srv.Draining() }
