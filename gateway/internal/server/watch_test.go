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
	// The poll that cancelled the first also polled the second (both are watched on every tick).
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
