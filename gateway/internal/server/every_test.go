package server

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestEveryRepeatsAndStops checks the timer-callback loop that replaced the per-request goroutines: it calls
// f repeatedly, no more after stop, and not again once f returns false.
func TestEveryRepeatsAndStops(t *testing.T) {
	var n atomic.Int32
	stop := every(2*time.Millisecond, func() bool { n.Add(1); return true })
	deadline := time.Now().Add(3 * time.Second)
	for n.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	stop()
	if n.Load() < 3 {
		t.Fatalf("f ran %d times, want ≥ 3", n.Load())
	}
	after := n.Load()
	time.Sleep(20 * time.Millisecond)
	if got := n.Load(); got > after+1 { // one call may already have been due when stop ran
		t.Fatalf("f ran %d times after stop", got-after)
	}

	var m atomic.Int32
	stop2 := every(time.Millisecond, func() bool { m.Add(1); return false })
	defer stop2()
	time.Sleep(30 * time.Millisecond)
	if got := m.Load(); got != 1 {
		t.Fatalf("f returning false ran %d times, want 1", got)
	}
}
