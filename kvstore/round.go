package kvstore

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// SharedRound lets calls that run at the same time on one Redis server send their first round trip as
// one pipeline: a request's Match and its in-flight read (route.Plan) each cost Redis a read and a write
// system call per round trip (~13-40 µs of its CPU here), more than their commands (RATIONALE.md, "What a
// reservation costs Redis"). Each call gets its own context from Join; the first pipeline a Redis index
// or reservations call sends under that context waits until every other joined call has queued its own
// first pipeline or left (Leave), and then one of them sends all the commands in one Exec. Keys, values
// and results are the same as without it; a call that sends nothing to Redis (the memory store, a store
// that is down, a Redis Cluster client) must Leave, or the others wait for it until their context ends.
// A context from Join belongs to one call at a time.
type SharedRound struct {
	mu      sync.Mutex
	pending int // joined calls that have neither queued nor left
	c       redis.UniversalClient
	cmds    []redis.Cmder
	done    chan struct{}
	fired   bool
}

type roundTicket struct {
	sr   *SharedRound
	used atomic.Bool
}

type roundKey struct{}

// NewSharedRound returns an empty round.
func NewSharedRound() *SharedRound { return &SharedRound{done: make(chan struct{})} }

// Join returns a context for one more call of the round.
func (sr *SharedRound) Join(ctx context.Context) context.Context {
	sr.mu.Lock()
	sr.pending++
	sr.mu.Unlock()
	return context.WithValue(ctx, roundKey{}, &roundTicket{sr: sr})
}

// LeaveRound ends ctx's part in its round (ctx from SharedRound.Join; any other context: nothing): the
// other calls no longer wait for it. Call it when the call has returned; after its first pipeline it does
// nothing.
func LeaveRound(ctx context.Context) {
	t, _ := ctx.Value(roundKey{}).(*roundTicket)
	if t == nil || !t.used.CompareAndSwap(false, true) {
		return
	}
	t.sr.arrive(ctx, nil, nil)
}

// arrive counts one call in: with its commands cmds on client c, or leaving (cmds nil). The last arrival
// sends every queued command in one pipeline (on its own context) and releases the others.
func (sr *SharedRound) arrive(ctx context.Context, c redis.UniversalClient, cmds []redis.Cmder) {
	sr.mu.Lock()
	if cmds != nil {
		if sr.c == nil {
			sr.c = c
		}
		sr.cmds = append(sr.cmds, cmds...)
	}
	sr.pending--
	last := sr.pending == 0 && !sr.fired
	if last {
		sr.fired = true
	}
	all, client := sr.cmds, sr.c
	sr.mu.Unlock()
	if !last {
		return
	}
	if len(all) > 0 {
		p := client.Pipeline()
		_ = p.BatchProcess(ctx, all...)
		_, _ = p.Exec(ctx) // each command carries its own error
	}
	close(sr.done)
}

// execRound sends pipeline p of client c: with ctx's round when ctx has a ticket not used yet and c is a
// client of one server (the round's first caller's client), else by itself. It returns the first error of
// p's own commands, as p.Exec would.
func execRound(ctx context.Context, c redis.UniversalClient, p redis.Pipeliner) error {
	t, _ := ctx.Value(roundKey{}).(*roundTicket)
	if t == nil || !t.used.CompareAndSwap(false, true) {
		_, err := p.Exec(ctx)
		return err
	}
	sr := t.sr
	_, single := c.(*redis.Client)
	sr.mu.Lock()
	other := sr.c != nil && sr.c != c
	sr.mu.Unlock()
	if !single || other || p.Len() == 0 {
		sr.arrive(ctx, nil, nil) // leaves the round; sends its own
		_, err := p.Exec(ctx)
		return err
	}
	cmds := append([]redis.Cmder(nil), p.Cmds()...)
	p.Discard()
	sr.arrive(ctx, c, cmds)
	select {
	case <-sr.done:
	case <-ctx.Done():
		return classify(ctx.Err()) // as go-redis's hook would: a deadline is the store not answering
	}
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil {
			return err
		}
	}
	return nil
}
