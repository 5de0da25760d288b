package server

import (
	"context"
	"net"
	"sync"
	"time"
)

// watch cancels cancel when the client connection closes; stop ends the watch (it may be called more than
// once). Every watched connection is polled by one shared timer (disconnects), not a timer or goroutine per
// request (see RATIONALE.md "Per-request overhead" and "Short requests (issue 16)").
func watch(conn net.Conn, cancel context.CancelFunc) (stop func()) {
	if conn == nil || !canPoll(conn) {
		return func() {}
	}
	return disconnects.add(conn, cancel, DisconnectPoll)
}

// disconnects is the process's one disconnect poller.
var disconnects watchSet

// watchSet polls its connections with peerClosed on one timer callback, every period while any is
// watched. Arming a timer per request cost a runtime timer insertion and removal and, on an idle machine,
// a thread wake-up (the netpoller is woken for the earlier timer); the shared timer is armed at most once
// per period. A connection watched just before a tick is polled sooner than one period after it was added,
// never later. A poll already under way when stop is called may still cancel once (a no-op on a finished
// request).
type watchSet struct {
	mu     sync.Mutex
	m      map[*watchEntry]struct{}
	t      *time.Timer
	armed  bool
	period time.Duration
	poll   []*watchEntry // the tick's snapshot, reused
}

type watchEntry struct {
	conn   net.Conn
	cancel context.CancelFunc
	set    *watchSet
}

// add watches conn every period (the first add fixes the period) and returns the entry's stop.
func (w *watchSet) add(conn net.Conn, cancel context.CancelFunc, period time.Duration) func() {
	e := &watchEntry{conn: conn, cancel: cancel, set: w}
	w.mu.Lock()
	if w.m == nil {
		w.m = map[*watchEntry]struct{}{}
		w.period = period
	}
	w.m[e] = struct{}{}
	if !w.armed {
		w.armed = true
		if w.t == nil {
			w.t = time.AfterFunc(w.period, w.tick)
		} else {
			w.t.Reset(w.period)
		}
	}
	w.mu.Unlock()
	return e.stop
}

func (e *watchEntry) stop() {
	e.set.mu.Lock()
	delete(e.set.m, e)
	e.set.mu.Unlock()
}

// tick polls every watched connection (outside the lock), cancels and drops those whose client closed,
// and re-arms while any connection stays watched.
func (w *watchSet) tick() {
	w.mu.Lock()
	entries := w.poll[:0]
	for e := range w.m {
		entries = append(entries, e)
	}
	w.poll = nil
	w.mu.Unlock()
	for i, e := range entries {
		if closed, _ := peerClosed(e.conn); closed {
			e.cancel()
			e.stop()
		}
		entries[i] = nil
	}
	w.mu.Lock()
	w.poll = entries[:0]
	if len(w.m) > 0 {
		w.t.Reset(w.period)
	} else {
		w.armed = false
	}
	w.mu.Unlock()
}
