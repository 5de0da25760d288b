package plugins

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/plugins/threetier"
	"github.com/kvgate/kvgate/sdk"
)

var testCacheDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvgate-plugins-cache-")
	if err != nil {
		panic(err)
	}
	testCacheDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func readWasm(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name+".wasm"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestNativeMatchesWasm10k: the embedded module and the native fallback rank 10,000 random snapshots
// (0–64 endpoints, empty prompts, unhealthy endpoints) identically.
func TestNativeMatchesWasm10k(t *testing.T) {
	h := newTestHost(t, Options{})
	n := 10000
	if testing.Short() {
		n = 2000
	}
	tiers := map[threetier.Tier]int{}
	for i := 0; i < n; i++ {
		s := RandomSnapshot(uint64(i)+1, i%65)
		want, tier := nativeRank(threetier.DefaultConfig(), &s)
		tiers[tier]++
		got, info := h.Rank(context.Background(), "m", &s)
		if info.Fallback || !slices.Equal(got, want) {
			t.Fatalf("snapshot %d: wasm %v %+v, native %v", i, got, info, want)
		}
	}
	// The random fleets must exercise every branch, else the comparison proves little.
	for _, tr := range []threetier.Tier{threetier.TierNone, threetier.TierAffinity, threetier.TierBalance, threetier.TierMiss} {
		if tiers[tr] == 0 {
			t.Errorf("no snapshot took branch %s (%v)", tr, tiers)
		}
	}
	t.Logf("branches: %v", tiers)
}

func TestActivateConfigReachesGuest(t *testing.T) {
	h := newTestHost(t, Options{})
	// Loads [20,0,0] with the prefix on endpoint 0: overloaded under the default threshold 8
	// (balance), not under 50 (affinity → 0 first).
	c := rankCase{req: req256(42), eps: []sdk.Endpoint{hep(16, 0, 20, 0), hep(0, 0, 0, 0), hep(0, 0, 0, 0)}}
	if got, _ := h.Rank(context.Background(), "m", snapshotOf(c)); got[0] == 0 {
		t.Fatalf("default config: got %v, want endpoint 0 not first", got)
	}
	if err := h.Activate("m", h.BuiltinVersion(), []byte(`{"imbalance_threshold": 50}`)); err != nil {
		t.Fatal(err)
	}
	got, info := h.Rank(context.Background(), "m", snapshotOf(c))
	if info.Fallback || !slices.Equal(got, []int{0, 1, 2}) && !slices.Equal(got, []int{0, 2, 1}) || got[0] != 0 {
		t.Fatalf("threshold 50: got %v %+v", got, info)
	}
	err := h.Activate("m", h.BuiltinVersion(), []byte(`{"imbalance_treshold": 50}`))
	if !errors.Is(err, ErrInitFailed) {
		t.Fatalf("typo in config: err %v, want ErrInitFailed", err)
	}
	var ce *sdk.ConfigError
	if !errors.As(err, &ce) || ce.Key != "imbalance_treshold" {
		t.Fatalf("typo in config: want *sdk.ConfigError naming the key, got %v", err)
	}
}

func TestLoadRejects(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger(), CallTimeout: 2 * time.Millisecond, ValidationTimeout: 2 * time.Millisecond})
	cases := []struct {
		file string
		want []string // substrings that must appear among the problems
	}{
		{"badimport", []string{"import env.http_get is not allowed", "import wasi_snapshot_preview1.path_open is not allowed"}},
		{"wrongsig", []string{"export kvgate_policy_choose has signature (i64)->(i32), want (i32)->(i32)"}},
		{"missing", []string{"missing export kvgate_policy_abi_v1", "missing export kvgate_policy_choose"}},
		{"newer", []string{"guest ABI v1.9 is newer than the host's v1.0"}},
		{"invalid", []string{"sample no-endpoints: invalid_ranking"}},
		{"loop", []string{"warm-up call: no answer within 20ms"}},
		{"calltree", []string{"function 13 can make more than 1048576 calls without a loop"}},
		{"recurse", []string{"function 0 calls itself without a loop"}},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			start := time.Now()
			v, rep, err := h.Load(c.file, readWasm(t, c.file))
			var ve *ValidationError
			if !errors.Is(err, ErrInvalidModule) || !errors.As(err, &ve) || rep.OK() {
				t.Fatalf("err %v, report ok %v", err, rep.OK())
			}
			if v != VersionOf(c.file, readWasm(t, c.file)) {
				t.Errorf("version %q", v)
			}
			all := strings.Join(rep.Problems, "\n")
			for _, w := range c.want {
				if !strings.Contains(all, w) {
					t.Errorf("problems lack %q:\n%s", w, all)
				}
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("Load took %s", d)
			}
		})
	}
	if err := h.Activate("m", VersionOf("loop", readWasm(t, "loop")), nil); !errors.Is(err, ErrUnknownVersion) {
		t.Errorf("activating a rejected module: %v", err)
	}
	waitAbandoned(t, h) // the call tree given up during validation ends on its own
}

func waitAbandoned(t *testing.T, h *Host) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for h.Stats().AbandonedRunning > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("abandoned calls still running after 60s: %+v", h.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestLoadAcceptsAndReports(t *testing.T) {
	h := newTestHost(t, Options{})
	wasm := readWasm(t, "good")
	v, rep, err := h.Load("good", wasm)
	if err != nil || !rep.OK() {
		t.Fatalf("%v %v", err, rep.Problems)
	}
	if want := "good@"; !strings.HasPrefix(string(v), want) || len(v) != len(want)+64 {
		t.Fatalf("version %q", v)
	}
	if len(rep.Samples) != len(SampleSnapshots()) || rep.BufferCap != 32768 || rep.ABIMinor != 0 {
		t.Fatalf("report %+v", rep)
	}
	// Same bytes, same name: same version; Load is idempotent.
	if v2, _, err := h.Load("good", wasm); err != nil || v2 != v {
		t.Fatalf("reload: %v %v", v2, err)
	}
	if _, _, err := h.Load("bad name!", wasm); !errors.Is(err, ErrBadName) {
		t.Fatalf("bad name: %v", err)
	}
	if !strings.Contains(rep.String(), "ACCEPTED "+string(v)) {
		t.Fatalf("report text:\n%s", rep.String())
	}
}

// activateBomb loads bomb.wasm under a fresh name (a timeout disables a version for good) on top of
// good.wasm, so the previous version is known.
func activateBomb(t *testing.T, h *Host, model, name string) (good, bomb Version) {
	t.Helper()
	good, _, err := h.Load("good", readWasm(t, "good"))
	if err != nil {
		t.Fatal(err)
	}
	bomb, _, err = h.Load(name, readWasm(t, "bomb"))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Activate(model, good, nil); err != nil {
		t.Fatal(err)
	}
	if err := h.Activate(model, bomb, nil); err != nil {
		t.Fatal(err)
	}
	return good, bomb
}

func bombSnapshot(seq uint64) *Snapshot {
	s := &Snapshot{Request: req256(1), Endpoints: []sdk.Endpoint{hep(0, 0, 5, 0), hep(0, 0, 1, 0), hep(0, 0, 3, 0)}}
	s.Request.Seq = seq
	return s
}

// TestFallbacks: traps, guest errors and invalid rankings answer with the native three-tier ranking,
// counted by reason; the module stays active and keeps answering.
func TestFallbacks(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger()})
	_, bomb := activateBomb(t, h, "m", "bomb")
	native := []int{1, 2, 0} // miss, by load
	for _, c := range []struct {
		seq    uint64
		reason Reason
		code   int32
	}{{1003, ReasonTrap, 0}, {1004, ReasonInvalid, 0}, {1005, ReasonGuestError, -7}, {1006, ReasonInvalid, 0}} {
		got, info := h.Rank(context.Background(), "m", bombSnapshot(c.seq))
		if !info.Fallback || info.Reason != c.reason || info.Code != c.code || info.Version != bomb || !slices.Equal(got, native) {
			t.Errorf("seq %d: %v %+v", c.seq, got, info)
		}
		// The next ordinary call is answered by the module (identity ranking of healthy endpoints).
		got, info = h.Rank(context.Background(), "m", bombSnapshot(7))
		if info.Fallback || !slices.Equal(got, []int{0, 1, 2}) {
			t.Errorf("after seq %d: %v %+v", c.seq, got, info)
		}
	}
	st := h.Stats()
	if st.Fallbacks["trap"] != 1 || st.Fallbacks["invalid_ranking"] != 2 || st.Fallbacks["guest_error"] != 1 || st.ReplacedInstance != 1 {
		t.Errorf("stats %+v", st)
	}
	reg := prometheus.NewRegistry()
	if err := h.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			got[key] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	for key, want := range map[string]float64{
		"kvgate_policy_host_fallbacks_total{reason=trap}":            1,
		"kvgate_policy_host_fallbacks_total{reason=invalid_ranking}": 2,
		"kvgate_policy_host_fallbacks_total{reason=timeout}":         0,
		"kvgate_policy_instances_replaced_total":                     1,
		"kvgate_policy_calls_total":                                  8,
	} {
		if v, ok := got[key]; !ok || v != want {
			t.Errorf("metric %s = %v (present %v), want %v", key, v, ok, want)
		}
	}
}

// TestForLoopStopped: a for {} at run time is answered by the fallback at the deadline and wazero
// stops it (the instance is replaced); one miss leaves the version active, three in a row disable it
// and the previous version serves the next request.
func TestForLoopStopped(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger(), CallTimeout: 2 * time.Millisecond})
	good, bomb := activateBomb(t, h, "m", "bomb-loop")
	for i := 1; i <= 3; i++ {
		start := time.Now()
		got, info := h.Rank(context.Background(), "m", bombSnapshot(1001))
		took := time.Since(start)
		if !info.Fallback || info.Reason != ReasonTimeout || info.Version != bomb || !slices.Equal(got, []int{1, 2, 0}) {
			t.Fatalf("miss %d: %v %+v", i, got, info)
		}
		if took > 250*time.Millisecond { // the tree itself runs for seconds // 2 ms deadline; generous for a loaded 2-core CI box
			t.Errorf("miss %d: answer took %s", i, took)
		}
		waitAbandoned(t, h) // wazero stops the loop shortly after the deadline
		if v, _ := h.Active("m"); i < 3 && v != bomb || i == 3 && v != good {
			t.Fatalf("after %d misses the active version is %s", i, v)
		}
	}
	got, info := h.Rank(context.Background(), "m", bombSnapshot(7))
	if info.Fallback || info.Version != good || !slices.Equal(got, []int{0, 1, 2}) {
		t.Fatalf("next request: %v %+v", got, info)
	}
	if err := h.Activate("m", bomb, nil); !errors.Is(err, ErrVersionDisabled) {
		t.Fatalf("re-activating: %v", err)
	}
	st := h.Stats()
	if st.Fallbacks["timeout"] != 3 || st.AbandonedOverrun > 3*time.Second {
		t.Errorf("stats %+v", st)
	}
	t.Logf("3 for {} calls ran %s past their deadlines in total", st.AbandonedOverrun)
}

// TestCallTreeAbandonedAndBounded: a loop-free exponential call tree cannot be interrupted by wazero.
// The request still gets the fallback at the deadline; StuckAfter later the version is disabled and the
// previous one serves; the stuck call keeps running on its goroutine (counted) until it ends by itself;
// while MaxAbandoned calls run, uploaded modules are not called at all.
func TestCallTreeAbandonedAndBounded(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger(), CallTimeout: 2 * time.Millisecond, MaxAbandoned: 1,
		StuckAfter: 20 * time.Millisecond})
	good, bomb := activateBomb(t, h, "m", "bomb-tree")
	// A goroutine inside uninterruptible compiled Wasm cannot be preempted, so a garbage collection that
	// starts meanwhile stops the whole process until the call ends (see RATIONALE.md). Keep the GC off
	// here so the test measures the host's own deadline handling.
	runtime.GC()
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	start := time.Now()
	got, info := h.Rank(context.Background(), "m", bombSnapshot(1002))
	took := time.Since(start)
	if !info.Fallback || info.Reason != ReasonTimeout || !slices.Equal(got, []int{1, 2, 0}) || took > 250*time.Millisecond { // the tree itself runs for seconds
		t.Fatalf("%v %+v after %s", got, info, took)
	}
	st := h.Stats()
	if st.AbandonedRunning != 1 || st.AbandonedTotal != 1 {
		t.Skipf("the call tree finished before the deadline on this machine: %+v", st)
	}
	// Cap reached: the uploaded module is skipped at once; the built-in still serves other models.
	_, info = h.Rank(context.Background(), "m", bombSnapshot(7))
	if !info.Fallback || info.Reason != ReasonAbandonLimit {
		t.Fatalf("with the cap reached: %+v", info)
	}
	if _, info = h.Rank(context.Background(), "other", bombSnapshot(7)); info.Fallback {
		t.Fatalf("built-in: %+v", info)
	}
	time.Sleep(40 * time.Millisecond)
	if v, _ := h.Active("m"); v != good {
		t.Fatalf("active %s StuckAfter past the deadline, want previous %s", v, good)
	}
	if vs := h.Versions(); !slices.ContainsFunc(vs, func(v VersionInfo) bool { return v.Version == bomb && v.Disabled }) {
		t.Fatalf("bomb not disabled: %+v", vs)
	}
	waitAbandoned(t, h)
	st = h.Stats()
	if st.AbandonedOverrun <= 0 {
		t.Fatalf("overrun not measured: %+v", st)
	}
	t.Logf("the call tree ran %s past its deadline", st.AbandonedOverrun)
	if _, info = h.Rank(context.Background(), "m", bombSnapshot(7)); info.Fallback || info.Version != good {
		t.Fatalf("after the abandoned call ended: %+v", info)
	}
}

func TestRollback(t *testing.T) {
	h := newTestHost(t, Options{})
	good, _, err := h.Load("good", readWasm(t, "good"))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Rollback("m"); !errors.Is(err, ErrNoPrevious) {
		t.Fatalf("rollback with nothing active: %v", err)
	}
	if err := h.Activate("m", good, nil); err != nil {
		t.Fatal(err)
	}
	if err := h.Activate("m", h.BuiltinVersion(), []byte(`{"match_threshold":0.5}`)); err != nil {
		t.Fatal(err)
	}
	if v, cfg := h.Active("m"); v != h.BuiltinVersion() || string(cfg) != `{"match_threshold":0.5}` {
		t.Fatalf("active %s %s", v, cfg)
	}
	if err := h.Rollback("m"); err != nil {
		t.Fatal(err)
	}
	if v, _ := h.Active("m"); v != good {
		t.Fatalf("after rollback: %s", v)
	}
	if err := h.Rollback("m"); err != nil {
		t.Fatal(err)
	}
	if v, cfg := h.Active("m"); v != h.BuiltinVersion() || cfg != nil {
		t.Fatalf("after second rollback: %s %s", v, cfg)
	}
	vs := h.Versions()
	if len(vs) != 2 || !vs[1].Builtin && !vs[0].Builtin {
		t.Fatalf("versions %+v", vs)
	}
	if err := h.Activate("m", "nope@00", nil); !errors.Is(err, ErrUnknownVersion) {
		t.Fatalf("unknown: %v", err)
	}
}

// TestSwapUnderLoad: callers rank continuously while another goroutine swaps between two versions; no
// call may fall back or see an invalid ranking, and retired pools are closed.
func TestSwapUnderLoad(t *testing.T) {
	// A generous deadline: this test is about swapping, and a starved 2-core box misses short ones.
	h := newTestHost(t, Options{Logger: quietLogger(), CallTimeout: time.Second})
	good, _, err := h.Load("good", readWasm(t, "good"))
	if err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var calls, bad atomic.Int64
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				s := bombSnapshot(7)
				got, info := h.Rank(context.Background(), "m", s)
				calls.Add(1)
				if info.Fallback || len(got) != 3 {
					bad.Add(1)
				}
			}
		}()
	}
	swaps := 0
	// Alternate two WAT modules (bomb.wasm answers sequence 7 like good.wasm); every 10th swap goes to
	// the Go built-in (not with -short: its instances are costly to start under -race).
	other, _, err := h.Load("bomb-swap", readWasm(t, "bomb"))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 60; i++ {
		v := good
		switch {
		case i%10 == 9 && !testing.Short():
			v = h.BuiltinVersion()
		case i%2 == 1:
			v = other
		}
		if err := h.Activate("m", v, nil); err != nil {
			t.Error(err)
		}
		swaps++
		time.Sleep(time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	if bad.Load() != 0 || calls.Load() == 0 {
		t.Fatalf("%d bad of %d calls over %d swaps", bad.Load(), calls.Load(), swaps)
	}
	t.Logf("%d calls over %d swaps", calls.Load(), swaps)
}

// TestCallTreeInterpreterKeepsGCRunning: with InterpretUploaded the stuck call runs in Go code, which the
// runtime can preempt, so the request gets its fallback at the deadline even with the GC on and the
// test allocating (under the compiler a GC cycle would wait for the whole call tree).
func TestCallTreeInterpreterKeepsGCRunning(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a call tree in the interpreter")
	}
	h := newTestHost(t, Options{Logger: quietLogger(), CallTimeout: 2 * time.Millisecond, InterpretUploaded: true,
		StuckAfter: 20 * time.Millisecond, MaxAbandoned: 1})
	good, _ := activateBomb(t, h, "m", "bomb-interp")
	stop := make(chan struct{})
	defer close(stop)
	go func() { // garbage, so GC cycles start while the call tree runs
		var keep [][]byte
		for {
			select {
			case <-stop:
				return
			default:
			}
			keep = append(keep, make([]byte, 1<<16))
			if len(keep) > 64 {
				keep = keep[:0]
			}
			time.Sleep(100 * time.Microsecond)
		}
	}()
	start := time.Now()
	_, info := h.Rank(context.Background(), "m", bombSnapshot(1007)) // 2^22 calls: ~0.2 s interpreted
	if took := time.Since(start); info.Reason != ReasonTimeout || took > 100*time.Millisecond {
		t.Fatalf("%+v after %s", info, took)
	}
	if st := h.Stats(); st.AbandonedRunning != 1 {
		t.Skipf("the call tree ended before StuckAfter: %+v", st)
	}
	time.Sleep(60 * time.Millisecond)
	if v, _ := h.Active("m"); v != good && h.Stats().AbandonedRunning == 1 {
		t.Fatalf("active %s, want %s", v, good)
	}
	waitAbandoned(t, h)
	t.Logf("the interpreted call tree ran %s past its deadline", h.Stats().AbandonedOverrun)
}

// TestFallbackLoggedOncePerBurst: five fallbacks in a burst give one log record; the next record, after
// the interval, reports how many were not logged.
func TestFallbackLoggedOncePerBurst(t *testing.T) {
	var buf syncBuffer
	h := newTestHost(t, Options{Logger: slog.New(slog.NewTextHandler(&buf, nil)), LogBurstInterval: 200 * time.Millisecond})
	activateBomb(t, h, "m", "bomb-log")
	for range 5 {
		h.Rank(context.Background(), "m", bombSnapshot(1005))
	}
	if n := strings.Count(buf.String(), "policy fell back"); n != 1 {
		t.Fatalf("%d records in a burst:\n%s", n, buf.String())
	}
	time.Sleep(250 * time.Millisecond)
	h.Rank(context.Background(), "m", bombSnapshot(1005))
	if out := buf.String(); strings.Count(out, "policy fell back") != 2 || !strings.Contains(out, "suppressed=4") ||
		!strings.Contains(out, "reason=guest_error") || !strings.Contains(out, "code=-7") {
		t.Fatalf("log:\n%s", out)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestMemoryLimit: a Go module declares 38 pages and its runtime grows memory while it starts (40 pages
// end in "pageAlloc: out of memory"), so under a 16-page limit the host does not start; under 128 it
// does and small modules load.
func TestMemoryLimit(t *testing.T) {
	if _, err := New(context.Background(), Options{MemoryLimitPages: 16, CacheDir: testCacheDir, Logger: quietLogger()}); err == nil {
		t.Fatal("host started with a 16-page limit")
	}
	h := newTestHost(t, Options{MemoryLimitPages: 128, Logger: quietLogger()})
	big := readWasm(t, "good") // 1 page: fits
	if _, _, err := h.Load("small", big); err != nil {
		t.Fatal(err)
	}
}

func TestCapWriter(t *testing.T) {
	w := &capWriter{limit: 8}
	for _, s := range []string{"hello ", "world", "!"} {
		if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatal(n, err)
		}
	}
	if w.String() != "hello wo" || w.dropped != 4 {
		t.Fatalf("%q dropped %d", w.String(), w.dropped)
	}
}

// TestCallerCancellationIsNotAMiss: a request whose context is already cancelled (client gone) is still
// answered by the policy within the host's own deadline and counts no miss.
func TestCallerCancellationIsNotAMiss(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger(), MaxConsecutiveMisses: 1})
	_, bomb := activateBomb(t, h, "m", "bomb-cancel")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 3 {
		if got, info := h.Rank(ctx, "m", bombSnapshot(7)); info.Fallback || !slices.Equal(got, []int{0, 1, 2}) {
			t.Fatalf("%v %+v", got, info)
		}
	}
	if v, _ := h.Active("m"); v != bomb {
		t.Fatalf("active %s", v)
	}
}

// TestUninterruptibleStartAbandoned: a module whose start function cannot be interrupted does not hang
// Load: instantiation is given up at InitTimeout (the work is counted as abandoned and ends by itself).
func TestUninterruptibleStartAbandoned(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger(), InitTimeout: 20 * time.Millisecond})
	runtime.GC()
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // see TestCallTreeAbandonedAndBounded
	start := time.Now()
	_, rep, err := h.Load("slowstart", readWasm(t, "slowstart"))
	took := time.Since(start)
	if !errors.Is(err, ErrInvalidModule) || took > 200*time.Millisecond ||
		!strings.Contains(strings.Join(rep.Problems, "\n"), "did not finish within 20ms") {
		t.Fatalf("after %s: %v %v", took, err, rep.Problems)
	}
	if st := h.Stats(); st.AbandonedTotal != 1 {
		t.Fatalf("stats %+v", st)
	}
	waitAbandoned(t, h)
}

// With a rollback floor (the gateway's configured policy), Rollback stops at the floor activation instead of
// returning the model to the built-in default with no config; later activations still roll back to it.
func TestRollbackFloor(t *testing.T) {
	h := newTestHost(t, Options{})
	good, _, err := h.Load("good", readWasm(t, "good"))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.SetRollbackFloor("m"); !errors.Is(err, ErrNoPrevious) {
		t.Fatalf("floor with nothing active: %v", err)
	}
	base := []byte(`{"imbalance_threshold":4}`)
	if err := h.Activate("m", h.BuiltinVersion(), base); err != nil {
		t.Fatal(err)
	}
	if err := h.SetRollbackFloor("m"); err != nil {
		t.Fatal(err)
	}
	active := func(wantV Version, wantCfg []byte) {
		t.Helper()
		if v, cfg := h.Active("m"); v != wantV || string(cfg) != string(wantCfg) {
			t.Fatalf("active %s %s, want %s %s", v, cfg, wantV, wantCfg)
		}
	}
	if err := h.Rollback("m"); !errors.Is(err, ErrNoPrevious) {
		t.Fatalf("rollback at the floor: %v", err)
	}
	active(h.BuiltinVersion(), base)
	if err := h.Activate("m", good, nil); err != nil {
		t.Fatal(err)
	}
	if err := h.Rollback("m"); err != nil {
		t.Fatal(err)
	}
	active(h.BuiltinVersion(), base)
	if err := h.Rollback("m"); !errors.Is(err, ErrNoPrevious) {
		t.Fatalf("second rollback: %v", err)
	}
	active(h.BuiltinVersion(), base)
	// Another model keeps the old behaviour (no floor): back to the built-in default.
	if err := h.Activate("other", good, nil); err != nil {
		t.Fatal(err)
	}
	if err := h.Rollback("other"); err != nil {
		t.Fatal(err)
	}
	if v, cfg := h.Active("other"); v != h.BuiltinVersion() || cfg != nil {
		t.Fatalf("other after rollback: %s %s", v, cfg)
	}
}
