package server

import (
	"context"
	"net"
	"testing"
	"time"
)

// TestWatchSetCancelsClosedClientOnly checks the shared disconnect poller over real loopback TCP: the
// request whose client closes is cancelled, one whose client stays is not, and once nothing is watched the
// timer is no longer re-armed.
func TestWatchSetCancelsClosedClientOnly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pair := func() (client, server net.Conn) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(); s.Close() })
		return c, s
	}
	c1, s1 := pair()
	_, s2 := pair()
	var w watchSet
	ctx1, cancel1 := context.WithCancel(context.Background())
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel1()
	defer cancel2()
	stop1 := w.add(s1, cancel1, 2*time.Millisecond)
	stop2 := w.add(s2, cancel2, 2*time.Millisecond)
	defer stop1()
	c1.Close()
	select {
	case <-ctx1.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("closed client's request not cancelled")
	}
	if ctx2.Err() != nil {
		t.Fatal("open client's request cancelled")
	}
	stop2()
	stop2() // idempotent
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.mu.Lock()
		armed, n := w.armed, len(w.m)
		w.mu.Unlock()
		if n != 0 {
			t.Fatalf("%d entries still watched after both ended", n)
		}
		if !armed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("timer still re-armed with nothing watched")
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkDisconnectWatch compares a request's disconnect watch on the shared poller (watchSet.add and
// stop) with the timer per request it replaced (every with DisconnectPoll, then stop). The per-request
// timer's larger cost on an idle machine, the thread the runtime wakes for each new earliest timer, does
// not show in a tight loop; see RATIONALE.md "Short requests (issue 16)".
func BenchmarkDisconnectWatch(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	cancel := func() {}
	b.Run("shared", func(b *testing.B) {
		var w watchSet
		for b.Loop() {
			w.add(s, cancel, DisconnectPoll)()
		}
	})
	b.Run("per-request-timer", func(b *testing.B) {
		for b.Loop() {
			every(DisconnectPoll, func() bool { closed, _ := peerClosed(s); return !closed })()
		}
	})
}
