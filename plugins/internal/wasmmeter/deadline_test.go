package wasmmeter_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/sdk"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// gcLoop runs runtime.GC back to back until stop is closed and reports how many cycles finished and the
// longest one. A GC cycle needs every goroutine to reach a safe point, so a goroutine stuck in compiled
// Wasm would hold each cycle (and every other goroutine) until its call ends.
func gcLoop(stop <-chan struct{}) (wait func() (cycles int, longest time.Duration)) {
	var wg sync.WaitGroup
	var cycles int
	var longest time.Duration
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			t0 := time.Now()
			runtime.GC()
			longest = max(longest, time.Since(t0))
			cycles++
		}
	})
	return func() (int, time.Duration) { wg.Wait(); return cycles, longest }
}

// TestRunawayStoppedWithGC runs the adversarial modules of plugins/testdata, instrumented, in a compiler
// runtime WITHOUT WithCloseOnContextDone while another goroutine runs the GC in a loop: each call ends
// with the refill's error soon after its deadline, and GC cycles keep completing during the call.
// Uninstrumented, the loop-free call trees (calltree, recurse, bomb 1002, slowstart) run for seconds
// and a GC that starts meanwhile stalls until they end (plugins/RATIONALE.md, "Why metering instead of wazero's interruption?").
func TestRunawayStoppedWithGC(t *testing.T) {
	const deadline = 5 * time.Millisecond
	// Allowed overrun: a shared 2-core machine running other test packages, GC looping. Unmetered, the
	// call trees run ~0.5 s past the deadline and hold the GC as long (TestUnmeteredCallTreeStallsGC).
	const slack = 200 * time.Millisecond
	cases := []struct {
		name, file string
		seq        uint64 // snapshot sequence number (bomb's trigger)
		start      bool   // the runaway is the start function: stopped during instantiation
		export     string // call this export of a non-policy module instead
	}{
		{"calltree", "calltree.wasm", 0, false, ""},
		{"recurse", "recurse.wasm", 0, false, ""},
		{"loop", "loop.wasm", 0, false, ""},
		{"bomb-for", "bomb.wasm", 1001, false, ""},
		{"bomb-calltree", "bomb.wasm", 1002, false, ""},
		{"slowstart", "slowstart.wasm", 0, true, ""},
		{"bulk-fill", "bulk", 0, false, "forever"}, // endless 8 MiB memory.fill: stopped between two fills
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := &meter{Interval: 10000}
			rt := newRuntime(t, m)
			path := "../../testdata/" + c.file
			if c.export != "" {
				path = "testdata/" + c.file + ".wasm"
			}
			compiled, err := rt.CompileModule(context.Background(), instrument(t, readModule(t, path)))
			if err != nil {
				t.Fatal(err)
			}
			var p *policy
			var fn api.Function
			if c.export != "" {
				mod, err := rt.InstantiateModule(context.Background(), compiled, wazero.NewModuleConfig())
				if err != nil {
					t.Fatal(err)
				}
				fn = mod.ExportedFunction(c.export)
			} else if !c.start {
				if p, err = newPolicy(context.Background(), t, rt, compiled); err != nil {
					t.Fatal(err)
				}
			}
			stop := make(chan struct{})
			wait := gcLoop(stop)
			time.Sleep(time.Millisecond) // let the GC loop start
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			before := m.calls.Load()
			t0 := time.Now()
			switch {
			case fn != nil:
				_, err = fn.Call(ctx)
			case c.start:
				_, err = newPolicy(ctx, t, rt, compiled)
			default:
				s := randomSnapshot(1, 4)
				s.Request.Seq = c.seq
				_, _, err = p.rank(ctx, &s)
			}
			took := time.Since(t0)
			close(stop)
			cycles, longest := wait()
			if !errors.Is(err, errFuelDeadline) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("call returned %v, want the refill's deadline error", err)
			}
			if over := took - deadline; over > slack {
				t.Errorf("call ended %v after its %v deadline", over, deadline)
			}
			if cycles == 0 || longest > slack {
				t.Errorf("GC during the call: %d cycles, longest %v", cycles, longest)
			}
			t.Logf("stopped after %v (deadline %v), %d refills; %d GC cycles meanwhile, longest %v",
				took, deadline, m.calls.Load()-before, cycles, longest)
		})
	}
}

// TestBombOrdinaryCallsStillWork: after a refused refill aborted one call, the same instance is not
// reused (wazero leaves it in an unknown state); a fresh instance of the metered bomb ranks normally.
func TestBombOrdinaryCallsStillWork(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t, &meter{Interval: 10000})
	compiled, err := rt.CompileModule(ctx, instrument(t, readModule(t, "../../testdata/bomb.wasm")))
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPolicy(ctx, t, rt, compiled)
	if err != nil {
		t.Fatal(err)
	}
	s := sdk.Snapshot{Request: sdk.Request{Seq: 7}, Endpoints: []sdk.Endpoint{
		{Index: 0, Flags: sdk.FlagHealthy}, {Index: 1}, {Index: 2, Flags: sdk.FlagHealthy}}}
	got, _, err := p.rank(ctx, &s)
	if err != nil || len(got) != 2 || got[0] != 0 || got[1] != 2 {
		t.Fatalf("rank = %v, %v; want [0 2]", got, err)
	}
}

// TestUnmeteredCallTreeStallsGC is the control for TestRunawayStoppedWithGC: the same calltree.wasm,
// NOT instrumented, ignores its deadline and runs its 2^28 calls to the end, and a GC cycle started
// meanwhile cannot finish before the call does. If this stopped failing to stop, the test above would
// prove nothing.
func TestUnmeteredCallTreeStallsGC(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an uninterruptible call tree for about half a second")
	}
	rt := newRuntime(t, nil)
	compiled, err := rt.CompileModule(context.Background(), readModule(t, "../../testdata/calltree.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPolicy(context.Background(), t, rt, compiled)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	stop := make(chan struct{})
	wait := gcLoop(stop)
	time.Sleep(time.Millisecond)
	t0 := time.Now()
	s := randomSnapshot(1, 4)
	_, _, err = p.rank(ctx, &s)
	took := time.Since(t0)
	close(stop)
	cycles, longest := wait()
	if err != nil {
		t.Fatalf("unmetered call: %v", err)
	}
	if took < 100*time.Millisecond || longest < 100*time.Millisecond {
		t.Fatalf("unmetered call took %v and the longest GC cycle %v: expected both >= 100ms", took, longest)
	}
	t.Logf("unmetered: call took %v past a 5ms deadline; %d GC cycles, longest %v", took, cycles, longest)
}
