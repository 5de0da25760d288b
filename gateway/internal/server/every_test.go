package server

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestEveryRepeatsAndStops checks the timer-callback loop that replaced the per-request goroutines: it calls
// f repeatedly, no more after stop, and not again once f returns false. every is timers only, so the test
// runs on synctest's fake clock: the counts are exact, whatever the machine's load.
func TestEveryRepeatsAndStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int32
		stop := every(2*time.Millisecond, func() bool { n.Add(1); return true })
		time.Sleep(7 * time.Millisecond) // calls at 2, 4 and 6 ms
		synctest.Wait()
		if got := n.Load(); got != 3 {
			t.Fatalf("f ran %d times in 7 ms every 2 ms, want 3", got)
		}
		stop()
		time.Sleep(20 * time.Millisecond)
		synctest.Wait()
		if got := n.Load(); got != 3 {
			t.Fatalf("f ran %d times after stop", got-3)
		}

		var m atomic.Int32
		stop2 := every(time.Millisecond, func() bool { m.Add(1); return false })
		defer stop2()
		time.Sleep(30 * time.Millisecond)
		synctest.Wait()
		if got := m.Load(); got != 1 {
			t.Fatalf("f returning false ran %d times, want 1", got)
		}
	})
}
