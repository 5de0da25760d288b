package plugins

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Tests of the host's lifecycle under concurrency: rollback, activate, disable, unload and close racing
// with callers and with each other (run them with -race).

// settled returns st.prev.
func settled(h *Host, st *modelState) *activation {
	h.mu.Lock()
	defer h.mu.Unlock()
	return st.prev
}

// TestRollbackToDefaultKeepsNothingWarm: a rollback that returns a model to the built-in default (its
// previous activation was disabled) leaves nothing warm and no older version held: the host keeps no
// history beyond its one warm activation (an earlier design re-warmed older versions in the background and
// once left such a pool unreachable, pinning its version against Unload).
func TestRollbackToDefaultKeepsNothingWarm(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger(), PoolSize: 2})
	wasm := readWasm(t, "good")
	var vs [3]Version
	for i, name := range []string{"a", "b", "c"} {
		v, _, err := h.Load(name, wasm)
		if err != nil {
			t.Fatal(err)
		}
		vs[i] = v
		if err := h.Activate("m", v, nil); err != nil { // m: c active, b previous, a in the history
			t.Fatal(err)
		}
	}
	a, b := h.versions[vs[0]], h.versions[vs[1]]
	h.disable(b, "test") // the previous activation goes: nothing warm to roll back to
	if err := h.Rollback("m"); err != nil {
		t.Fatal(err)
	}
	if v, _ := h.Active("m"); v != h.BuiltinVersion() {
		t.Fatalf("active %s, want the built-in", v)
	}
	st := (*h.models.Load())["m"]
	if prev := settled(h, st); prev != nil {
		t.Fatalf("the model serves the built-in default, yet %s was re-warmed as its previous activation", prev.ver.v)
	}
	if err := h.Rollback("m"); !errors.Is(err, ErrNoPrevious) {
		t.Fatalf("rollback from the default: %v", err)
	}
	if n := a.live.Load(); n != 0 {
		t.Fatalf("%s: %d activations left, want 0", a.v, n)
	}
	if err := h.Unload(vs[0]); err != nil {
		t.Fatalf("unload of a version no model uses: %v", err)
	}
}

// TestLifecycleStress: callers rank (including calls that trap, so instances are replaced in the
// background) while another goroutine activates, rolls back, follows, unloads and reloads versions of two
// models.
// Afterwards every version's live count equals the activations that still reference it (active or kept
// warm): no retired activation is left holding a version (which would keep its compiled code forever),
// and no count went negative.
func TestLifecycleStress(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger(), PoolSize: 2, CallTimeout: time.Second})
	good, bomb := readWasm(t, "good"), readWasm(t, "bomb")
	models := []string{"m1", "m2"}
	stop := rankUntilStopped(t, h, 4, models, func(i int) uint64 {
		if i%5 == 0 {
			return 1003 // bomb traps; good answers
		}
		return 7
	}, func(got []int, info RankInfo) bool {
		return len(got) == 3 && (!info.Fallback || info.Reason == ReasonTrap)
	})
	names := []string{"a", "b", "c"}
	seen := map[*version]bool{} // every version object, unloaded ones included
	for i := 0; i < 60; i++ {
		name := names[i%3]
		wasm := good
		if i%2 == 1 {
			wasm = bomb
		}
		v, _, err := h.Load(name, wasm)
		if err != nil {
			t.Fatal(err)
		}
		h.mu.Lock()
		seen[h.versions[v]] = true
		h.mu.Unlock()
		model := models[i%2]
		if err := h.Activate(model, v, nil); err != nil {
			t.Fatal(err)
		}
		if i%4 == 3 {
			_ = h.Rollback(model)
			_ = h.Rollback(model)
		}
		if i%6 == 5 { // as a gateway follows its store: the other model gets v, with the built-in warm
			_ = h.Follow(models[(i+1)%2], Entry{Version: v, Config: []byte("{}")}, &Entry{Version: h.BuiltinVersion(), Config: []byte("{}")})
		}
		for _, vi := range h.Versions() {
			if !vi.Builtin && len(vi.ActiveFor) == 0 {
				_ = h.Unload(vi.Version) // refused when kept warm for a rollback
			}
		}
	}
	stop()
	checkLiveCounts(t, h, seen)
}

// TestDisableStress: like TestLifecycleStress, but callers also send runaway requests (bomb's for {}), so
// versions are disabled and models rolled back from the request path while versions are activated,
// rolled back and unloaded; afterwards every version's live count equals the activations referencing it.
func TestDisableStress(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger(), PoolSize: 2, CallTimeout: 20 * time.Millisecond})
	good, bomb := readWasm(t, "good"), readWasm(t, "bomb")
	models := []string{"m1", "m2"}
	stop := rankUntilStopped(t, h, 3, models, func(i int) uint64 {
		switch i % 16 {
		case 5:
			return 1003 // trap
		case 11:
			return 1001 // for {}: a runaway, disables a bomb version
		}
		return 7
	}, func(got []int, _ RankInfo) bool { return len(got) == 3 })
	seen := map[*version]bool{}
	for i := 0; i < 40; i++ {
		name, wasm := fmt.Sprintf("good%d", i%3), good
		if i%2 == 1 {
			name, wasm = fmt.Sprintf("bomb%d", i), bomb
		}
		v, _, err := h.Load(name, wasm)
		if err != nil {
			t.Fatal(err)
		}
		h.mu.Lock()
		if ver := h.versions[v]; ver != nil {
			seen[ver] = true
		}
		h.mu.Unlock()
		model := models[i%3%2]
		if err := h.Activate(model, v, nil); err != nil && !errors.Is(err, ErrVersionDisabled) && !errors.Is(err, ErrUnknownVersion) {
			t.Fatal(err)
		}
		if i%5 == 4 {
			_ = h.Rollback(model)
		}
		for _, vi := range h.Versions() {
			if !vi.Builtin && len(vi.ActiveFor) == 0 && i%3 == 0 {
				_ = h.Unload(vi.Version)
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	stop()
	checkLiveCounts(t, h, seen)
	t.Logf("stats %+v", h.Stats())
}

// TestDisabledWhileActivating: a version disabled while Activate builds its pool (outside the lock) is
// refused with ErrVersionDisabled, as documented, not ErrUnknownVersion (it is still loaded), and the pool
// built for it is released.
func TestDisabledWhileActivating(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger(), PoolSize: 8})
	v, _, err := h.Load("uploaded-three-tier", BuiltinWasm) // a Go guest, metered: each instance takes ms
	if err != nil {
		t.Fatal(err)
	}
	ver := h.versions[v]
	errc := make(chan error, 1)
	go func() { errc <- h.Activate("m", v, nil) }()
	for ver.live.Load() == 0 { // the pool is being built
		time.Sleep(50 * time.Microsecond)
	}
	h.disable(ver, "test")
	err = <-errc
	if !errors.Is(err, ErrVersionDisabled) {
		t.Fatalf("activate: %v, want ErrVersionDisabled", err)
	}
	if got, _ := h.Active("m"); got != h.BuiltinVersion() {
		t.Fatalf("active %s", got)
	}
	if n := ver.live.Load(); n != 0 {
		t.Fatalf("live %d after the refused activation", n)
	}
	if vi := h.Versions(); !slices.ContainsFunc(vi, func(i VersionInfo) bool { return i.Version == v && i.Disabled }) {
		t.Fatalf("versions %+v", vi)
	}
}

// TestUnloadWhileActivating: Unload of a version whose pool Activate is building succeeds (nothing uses it
// yet), does not close its compiled code under the instances still being made (they would fail to
// instantiate: ErrInitFailed), and Activate then refuses with ErrUnknownVersion and releases the pool.
func TestUnloadWhileActivating(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger(), PoolSize: 8})
	v, _, err := h.Load("uploaded-three-tier", BuiltinWasm)
	if err != nil {
		t.Fatal(err)
	}
	ver := h.versions[v]
	errc := make(chan error, 1)
	go func() { errc <- h.Activate("m", v, nil) }()
	for ver.live.Load() == 0 {
		time.Sleep(50 * time.Microsecond)
	}
	if err := h.Unload(v); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, ErrUnknownVersion) {
		t.Fatalf("activate: %v, want ErrUnknownVersion", err)
	}
	if n := ver.live.Load(); n != 0 {
		t.Fatalf("live %d", n)
	}
	// Loading the same bytes again compiles afresh and serves.
	v2, _, err := h.Load("uploaded-three-tier", BuiltinWasm)
	if err != nil || v2 != v {
		t.Fatal(v2, err)
	}
	if err := h.Activate("m", v2, nil); err != nil {
		t.Fatal(err)
	}
	if got, info := h.Rank(context.Background(), "m", bombSnapshot(7)); info.Fallback || len(got) != 3 {
		t.Fatalf("%v %+v", got, info)
	}
}

// TestDisabledVersionNotRebuilt: a missed deadline that disables its version (here the first miss, with
// MaxConsecutiveMisses 1) does not rebuild the discarded instance in the background: the activation is
// retired, so a new instance (a Go guest's runtime start, metered: many refills; up to InitTimeout for a
// slow one) would only be closed again. Before the fix the instance was replaced before the version was
// disabled, and the rebuild ran anyway.
func TestDisabledVersionNotRebuilt(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger(), PoolSize: 2, CallTimeout: time.Nanosecond,
		FuelInterval: 64, MaxConsecutiveMisses: 1})
	v, _, err := h.Load("uploaded-three-tier", BuiltinWasm)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Activate("m", v, nil); err != nil {
		t.Fatal(err)
	}
	ver := h.versions[v]
	_, info := h.Rank(context.Background(), "m", bombSnapshot(7))
	before := h.Stats().Refills
	if info.Reason != ReasonTimeout || !ver.disabled.Load() {
		t.Fatalf("%+v, disabled %v", info, ver.disabled.Load())
	}
	// The retired activation is released once nothing holds it; a rebuild would hold it until done.
	for end := time.Now().Add(5 * time.Second); ver.live.Load() != 0; {
		if time.Now().After(end) {
			t.Fatalf("live %d", ver.live.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if st := h.Stats(); st.ReplacedInstance != 1 {
		t.Fatalf("stats %+v", st)
	}
	if after := h.Stats().Refills; after != before {
		t.Fatalf("%d fuel refills after the version was disabled: its instance was rebuilt", after-before)
	}
}

// TestCloseDuringRebuild: an instance being rebuilt when the host closes fails to instantiate (the
// runtime is gone); that is shutdown, not a broken policy: nothing is logged as an error and the version
// is not disabled. Before the fix every such rebuild logged "policy instance replacement failed" and
// disabled its version.
func TestCloseDuringRebuild(t *testing.T) {
	var buf syncBuffer
	h := newTestHost(t, Options{Logger: slog.New(slog.NewTextHandler(&buf, nil)), PoolSize: 2,
		CallTimeout: time.Nanosecond, FuelInterval: 64, MaxConsecutiveMisses: 1 << 20, RunawayRefills: 1 << 20})
	v, _, err := h.Load("uploaded-three-tier", BuiltinWasm)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Activate("m", v, nil); err != nil {
		t.Fatal(err)
	}
	ver := h.versions[v]
	if _, info := h.Rank(context.Background(), "m", bombSnapshot(7)); info.Reason != ReasonTimeout {
		t.Fatalf("%+v", info) // the instance is discarded and rebuilt in the background (a Go runtime start)
	}
	if err := h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(5 * time.Second); ver.live.Load() != 0; { // the rebuild holds the activation
		if time.Now().After(end) {
			t.Fatalf("live %d", ver.live.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if out := buf.String(); strings.Contains(out, "replacement failed") || strings.Contains(out, "policy disabled") ||
		ver.disabled.Load() {
		t.Fatalf("disabled %v, log:\n%s", ver.disabled.Load(), out)
	}
}

// rankUntilStopped starts callers goroutines that rank bombSnapshot(seqFor(i)) for models[i%len(models)]
// until the returned stop is called (which waits for them); a ranking ok rejects fails the test.
func rankUntilStopped(t *testing.T, h *Host, callers int, models []string, seqFor func(i int) uint64,
	ok func(got []int, info RankInfo) bool) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				if got, info := h.Rank(context.Background(), models[i%len(models)], bombSnapshot(seqFor(i))); !ok(got, info) {
					t.Errorf("ranking %v %+v", got, info)
					return
				}
			}
		})
	}
	return func() { close(done); wg.Wait() }
}

// checkLiveCounts waits for background replacements, then checks that every version (seen,
// loaded, or referenced by a model) has a live count equal to the activations referencing it (active or
// kept warm), and that no disabled version serves or is kept warm.
func checkLiveCounts(t *testing.T, h *Host, seen map[*version]bool) {
	t.Helper()
	var bad string
	for end := time.Now().Add(5 * time.Second); ; {
		bad = ""
		want := map[*version]int64{}
		h.mu.Lock()
		all := maps.Clone(seen)
		for _, ver := range h.versions {
			all[ver] = true
		}
		for _, st := range *h.models.Load() {
			for _, a := range []*activation{st.active.Load(), st.prev} {
				if a != nil {
					want[a.ver]++
					all[a.ver] = true
					if a.ver.disabled.Load() {
						bad += fmt.Sprintf("disabled %s still serves or is kept warm; ", a.ver.v)
					}
				}
			}
		}
		h.mu.Unlock()
		for ver := range all {
			if n := ver.live.Load(); !ver.builtin && n != want[ver] {
				bad += fmt.Sprintf("%s: live %d, referenced %d; ", ver.v, n, want[ver])
			}
		}
		if bad == "" || time.Now().After(end) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if bad != "" {
		t.Fatal(bad)
	}
}
