package kvstore

import (
	"context"
	"fmt"
	"time"
)

// errNoIndex is returned by Guarded's index methods when GuardConfig.Index is nil.
var errNoIndex = fmt.Errorf("kvstore: guarded store without an index: %w", ErrInvalidArgument)

// Match implements Index: ErrUnavailable at once while the store is down (the caller routes on load alone),
// else the index's answer within the request-path timeout; an ErrUnavailable answer marks the store down.
func (g *Guarded) Match(ctx context.Context, model string, keys []BlockKey) ([]EndpointMatch, error) {
	if g.idx == nil {
		return nil, errNoIndex
	}
	if !g.storeUp() {
		return nil, g.downErrNow("match")
	}
	sctx, cancel := g.bounded(ctx)
	defer cancel()
	ms, err := g.idx.Match(sctx, model, keys)
	if err != nil && ctx.Err() == nil {
		g.failed("match", err)
	}
	return ms, err
}

// Record implements Index: ErrUnavailable at once while the store is down (a speculative entry is not worth
// a wait), else the index's; an ErrUnavailable answer marks the store down. ctx bounds it (Record runs off
// the request's path).
func (g *Guarded) Record(ctx context.Context, model string, ep EndpointID, keys []BlockKey, ttl time.Duration) error {
	if g.idx == nil {
		return errNoIndex
	}
	if !g.storeUp() {
		return g.downErrNow("record")
	}
	return g.write(ctx, "record", g.idx.Record(ctx, model, ep, keys, ttl))
}

// write reports a failed index write op (an ErrUnavailable one marks the store down) and returns err.
func (g *Guarded) write(ctx context.Context, op string, err error) error {
	if err != nil && ctx.Err() == nil {
		g.failed(op, err)
	}
	return err
}

// Add implements Index (passed through; see Guarded).
func (g *Guarded) Add(ctx context.Context, model string, ep EndpointID, tier Tier, keys []BlockKey) error {
	if g.idx == nil {
		return errNoIndex
	}
	return g.write(ctx, "add", g.idx.Add(ctx, model, ep, tier, keys))
}

// Remove implements Index (passed through).
func (g *Guarded) Remove(ctx context.Context, model string, ep EndpointID, tier Tier, keys []BlockKey) error {
	if g.idx == nil {
		return errNoIndex
	}
	return g.write(ctx, "remove", g.idx.Remove(ctx, model, ep, tier, keys))
}

// ClearEndpoint implements Index (passed through).
func (g *Guarded) ClearEndpoint(ctx context.Context, model string, ep EndpointID) error {
	if g.idx == nil {
		return errNoIndex
	}
	return g.write(ctx, "clear_endpoint", g.idx.ClearEndpoint(ctx, model, ep))
}

// ClearConfirmed implements Index (passed through).
func (g *Guarded) ClearConfirmed(ctx context.Context, model string, ep EndpointID) error {
	if g.idx == nil {
		return errNoIndex
	}
	return g.write(ctx, "clear_confirmed", g.idx.ClearConfirmed(ctx, model, ep))
}

// Apply implements Index (passed through).
func (g *Guarded) Apply(ctx context.Context, model string, updates []Update) error {
	if g.idx == nil {
		return errNoIndex
	}
	return g.write(ctx, "apply", g.idx.Apply(ctx, model, updates))
}

// Demote implements Demoter (passed through); ErrInvalidArgument when the index is not a Demoter.
func (g *Guarded) Demote(ctx context.Context, model string, ep EndpointID, ttl time.Duration) error {
	d, ok := g.idx.(Demoter)
	if !ok {
		return errNoIndex
	}
	return g.write(ctx, "demote", d.Demote(ctx, model, ep, ttl))
}

// RaiseFence implements Fencer (passed through); ErrInvalidArgument when the index is not a Fencer.
func (g *Guarded) RaiseFence(ctx context.Context, model string, f Fence) error {
	fc, ok := g.idx.(Fencer)
	if !ok {
		return errNoIndex
	}
	return g.write(ctx, "raise_fence", fc.RaiseFence(ctx, model, f))
}

// Fenced implements Fencer: the index's fenced view, its writes passed through (errors reported as
// Guarded's), its Match and Record Guarded's. When the index is not a Fencer, every write of the view
// returns ErrInvalidArgument.
func (g *Guarded) Fenced(f Fence) FencedIndex {
	var inner FencedIndex
	if fc, ok := g.idx.(Fencer); ok {
		inner = fc.Fenced(f)
	}
	return &guardedFenced{g: g, in: inner, f: f}
}

type guardedFenced struct {
	g  *Guarded
	in FencedIndex // nil: the index cannot fence
	f  Fence
}

func (v *guardedFenced) Fence() Fence { return v.f }

func (v *guardedFenced) Match(ctx context.Context, model string, keys []BlockKey) ([]EndpointMatch, error) {
	return v.g.Match(ctx, model, keys)
}

func (v *guardedFenced) Record(ctx context.Context, model string, ep EndpointID, keys []BlockKey, ttl time.Duration) error {
	return v.g.Record(ctx, model, ep, keys, ttl)
}

func (v *guardedFenced) do(ctx context.Context, op string, fn func(FencedIndex) error) error {
	if v.in == nil {
		return errNoIndex
	}
	return v.g.write(ctx, op, fn(v.in))
}

func (v *guardedFenced) Add(ctx context.Context, model string, ep EndpointID, tier Tier, keys []BlockKey) error {
	return v.do(ctx, "add", func(w FencedIndex) error { return w.Add(ctx, model, ep, tier, keys) })
}

func (v *guardedFenced) Remove(ctx context.Context, model string, ep EndpointID, tier Tier, keys []BlockKey) error {
	return v.do(ctx, "remove", func(w FencedIndex) error { return w.Remove(ctx, model, ep, tier, keys) })
}

func (v *guardedFenced) ClearEndpoint(ctx context.Context, model string, ep EndpointID) error {
	return v.do(ctx, "clear_endpoint", func(w FencedIndex) error { return w.ClearEndpoint(ctx, model, ep) })
}

func (v *guardedFenced) ClearConfirmed(ctx context.Context, model string, ep EndpointID) error {
	return v.do(ctx, "clear_confirmed", func(w FencedIndex) error { return w.ClearConfirmed(ctx, model, ep) })
}

func (v *guardedFenced) Apply(ctx context.Context, model string, updates []Update) error {
	return v.do(ctx, "apply", func(w FencedIndex) error { return w.Apply(ctx, model, updates) })
}

func (v *guardedFenced) Demote(ctx context.Context, model string, ep EndpointID, ttl time.Duration) error {
	return v.do(ctx, "demote", func(w FencedIndex) error { return w.Demote(ctx, model, ep, ttl) })
}
