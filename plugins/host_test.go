package plugins

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/plugins/internal/threetier"
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

// TestNativeMatchesWasmLargeFleets: the embedded module and the native fallback rank random fleets of
// 1 to 1,024 endpoints identically (the packed-key fast path past 64 endpoints, in Wasm and natively).
func TestNativeMatchesWasmLargeFleets(t *testing.T) {
	h := newTestHost(t, Options{})
	n := 1500
	if testing.Short() {
		n = 300
	}
	for i := 0; i < n; i++ {
		rng := sdk.NewRand(uint64(i))
		size := 1 + rng.Intn(1024)
		if i%10 == 0 {
			size = fleetSizes[i/10%len(fleetSizes)]
		}
		s := RandomSnapshot(uint64(i)+77, size)
		want, _ := nativeRank(threetier.DefaultConfig(), &s)
		got, info := h.Rank(context.Background(), "m", &s)
		if info.Fallback || !slices.Equal(got, want) {
			t.Fatalf("snapshot %d (%d endpoints): wasm %v %+v, native %v", i, size, got, info, want)
		}
	}
}

// TestRankLimitThroughHost: with Request.RankLimit 8 the built-in (trusted), the same module uploaded
// (metered) and the native fallback return exactly the first 8 entries of the native full ranking and say
// Partial when that cut it; a v1.0 guest (good.wasm) is not sent the limit and answers in full.
func TestRankLimitThroughHost(t *testing.T) {
	h := newTestHost(t, Options{CallTimeout: time.Second})
	up, _, err := h.Load("three-tier-uploaded", BuiltinWasm)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Activate("uploaded", up, nil); err != nil {
		t.Fatal(err)
	}
	good, _, err := h.Load("good", readWasm(t, "good"))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Activate("v10", good, nil); err != nil {
		t.Fatal(err)
	}
	n := 600
	if testing.Short() {
		n = 150
	}
	for i := range n {
		size := []int{1, 8, 9, 16, 33, 64, 65, 256, 1024, sdk.MaxEndpoints}[i%10]
		s := RandomSnapshot(uint64(i)+1600, size)
		want, _ := nativeRank(threetier.DefaultConfig(), &s)
		s.Request.RankLimit = 8
		cut := min(8, len(want))
		for _, model := range []string{"m", "uploaded"} {
			got, info := h.Rank(context.Background(), model, &s)
			if info.Fallback || !slices.Equal(got, want[:cut]) || info.Partial != (cut < len(want) || cut == 8 && size > 8) {
				t.Fatalf("%s, snapshot %d (%d endpoints): %v %+v, want %v", model, i, size, got, info, want[:cut])
			}
		}
		if got := h.fallbackRank("m", &s); !slices.Equal(got, want[:cut]) {
			t.Fatalf("native fallback, snapshot %d: %v, want %v", i, got, want[:cut])
		}
		if sdk.EncodedSize(size) > 32768 { // good.wasm's buffer
			continue
		}
		got, info := h.Rank(context.Background(), "v10", &s)
		var healthy []int
		for k, e := range s.Endpoints {
			if e.Healthy() {
				healthy = append(healthy, k)
			}
		}
		if info.Fallback && len(healthy) > 0 || !info.Fallback && (!slices.Equal(got, healthy) || info.Partial != (len(healthy) == 8 && size > 8)) {
			t.Fatalf("v1.0 guest, snapshot %d: %v %+v, want %v", i, got, info, healthy)
		}
	}
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
		{"newer", []string{"guest ABI v1.9 is newer than the host's v1." + strconv.Itoa(sdk.ABIMinor)}}, // the host is v1.1 since RankLimit
		{"invalid", []string{"sample no-endpoints: invalid_ranking"}},
		{"loop", []string{"warm-up call: no answer within 20ms"}},
		{"calltree", []string{"warm-up call: no answer within 20ms"}}, // 2^28 calls without a loop
		{"recurse", []string{"warm-up call: no answer within 20ms"}},  // 2^30 calls without a loop
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
	if st := h.Stats(); st.Interrupted != 3 { // loop, calltree, recurse: each stopped in its warm-up call
		t.Errorf("interrupted %d calls, want 3", st.Interrupted)
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

// TestForLoopStopped: a for {} at run time is stopped by its fuel meter at the deadline and answered by
// the fallback (the instance is replaced); a call still computing at its deadline is a runaway, so its
// version is disabled at once and the previous version serves the next request.
func TestForLoopStopped(t *testing.T) {
	type disabled struct {
		v      Version
		models []string
	}
	onDisable := make(chan disabled, 1)
	h := newTestHost(t, Options{Logger: quietLogger(), CallTimeout: 20 * time.Millisecond,
		OnDisable: func(v Version, models []string) { onDisable <- disabled{v, models} }})
	good, bomb := activateBomb(t, h, "m", "bomb-loop")
	start := time.Now()
	got, info := h.Rank(context.Background(), "m", bombSnapshot(1001))
	took := time.Since(start)
	if !info.Fallback || info.Reason != ReasonTimeout || info.Version != bomb || !slices.Equal(got, []int{1, 2, 0}) {
		t.Fatalf("%v %+v", got, info)
	}
	if took > 300*time.Millisecond { // 20 ms deadline; generous for a loaded 2-core CI box
		t.Errorf("answer took %s", took)
	}
	if v, _ := h.Active("m"); v != good {
		t.Fatalf("after a runaway call the active version is %s, want %s", v, good)
	}
	select {
	case d := <-onDisable:
		if d.v != bomb || !slices.Equal(d.models, []string{"m"}) {
			t.Fatalf("OnDisable(%s, %v), want (%s, [m])", d.v, d.models, bomb)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnDisable was not called")
	}
	got, info = h.Rank(context.Background(), "m", bombSnapshot(7))
	if info.Fallback || info.Version != good || !slices.Equal(got, []int{0, 1, 2}) {
		t.Fatalf("next request: %v %+v", got, info)
	}
	if err := h.Activate("m", bomb, nil); !errors.Is(err, ErrVersionDisabled) {
		t.Fatalf("re-activating: %v", err)
	}
	st := h.Stats()
	if st.Fallbacks["timeout"] != 1 || st.Interrupted != 1 || st.Overrun <= 0 || st.Overrun > 200*time.Millisecond {
		t.Errorf("stats %+v", st)
	}
	t.Logf("the for {} call was stopped %s after its deadline (%d refills in all)", st.Overrun, st.Refills)
}

// TestConsecutiveMisses: misses that are not runaways (RunawayRefills out of reach) cost one fallback
// each; MaxConsecutiveMisses in a row disable the version.
func TestConsecutiveMisses(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger(), CallTimeout: 2 * time.Millisecond, RunawayRefills: 1 << 30})
	good, bomb := activateBomb(t, h, "m", "bomb-miss")
	for i := 1; i <= 3; i++ {
		if got, info := h.Rank(context.Background(), "m", bombSnapshot(1001)); info.Reason != ReasonTimeout || !slices.Equal(got, []int{1, 2, 0}) {
			t.Fatalf("miss %d: %v %+v", i, got, info)
		}
		if v, _ := h.Active("m"); i < 3 && v != bomb || i == 3 && v != good {
			t.Fatalf("after %d misses the active version is %s", i, v)
		}
	}
}

// TestCallTreeInterrupted: a loop-free exponential call tree through call_indirect (2^28 calls, seconds of
// work), with the garbage collector running and garbage being made: the request gets the fallback at the
// deadline, the version is disabled at once, the previous one serves, and the call itself is stopped
// (Stats.Interrupted) shortly after its deadline instead of running on.
func TestCallTreeInterrupted(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger(), CallTimeout: 20 * time.Millisecond})
	good, bomb := activateBomb(t, h, "m", "bomb-tree")
	stop := garbage(t)
	defer stop()
	start := time.Now()
	got, info := h.Rank(context.Background(), "m", bombSnapshot(1002))
	took := time.Since(start)
	if !info.Fallback || info.Reason != ReasonTimeout || info.Version != bomb || !slices.Equal(got, []int{1, 2, 0}) || took > 300*time.Millisecond {
		t.Fatalf("%v %+v after %s", got, info, took)
	}
	if v, _ := h.Active("m"); v != good {
		t.Fatalf("active %s, want previous %s", v, good)
	}
	st := h.Stats()
	if st.Interrupted != 1 || st.Overrun <= 0 || st.Overrun > 200*time.Millisecond {
		t.Fatalf("stats %+v", st)
	}
	t.Logf("the call tree was answered after %s and stopped %s after its deadline", took, st.Overrun)
	if _, info = h.Rank(context.Background(), "m", bombSnapshot(7)); info.Fallback || info.Version != good {
		t.Fatalf("next request: %+v", info)
	}
}

// garbage allocates in the background (so GC cycles start) until the returned stop is called.
func garbage(t *testing.T) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var keep [][]byte
		for {
			select {
			case <-done:
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
	return func() { close(done); wg.Wait() }
}

// TestRunawayKeepsGCRunning: while an uploaded call runs a seconds-long loop-free call tree under a long
// deadline, garbage collections on another goroutine still stop the world promptly (Go's own
// /sched/pauses/stopping/gc histogram): the metered guest reaches Go code (refill) at least once per fuel
// interval, where the runtime can stop it. Without metering, compiled Wasm cannot be preempted and the
// world would stay stopped until the whole call ended.
func TestRunawayKeepsGCRunning(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger(), CallTimeout: 400 * time.Millisecond})
	activateBomb(t, h, "m", "bomb-gc")
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.Rank(context.Background(), "m", bombSnapshot(1002))
	}()
	time.Sleep(20 * time.Millisecond) // the call tree is running
	before := stoppingPauses()
	gcs := 0
	for running := true; running && gcs < 20; gcs++ {
		runtime.GC()
		select {
		case <-done:
			running = false
		case <-time.After(5 * time.Millisecond):
		}
	}
	worst := worstNewPause(before, stoppingPauses())
	<-done
	if st := h.Stats(); st.Interrupted != 1 {
		t.Fatalf("the call tree was not interrupted: %+v", st)
	}
	if worst > 0.15 { // unmetered, the world would stay stopped for the rest of the 400 ms call
		t.Fatalf("stopping the world for a GC took up to %.3gs during the runaway call", worst)
	}
	t.Logf("%d GCs during the runaway call; the longest stop-the-world wait was under %.3gs", gcs, worst)
}

// stoppingPauses reads Go's histogram of the time taken to stop the world for a GC.
func stoppingPauses() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: "/sched/pauses/stopping/gc:seconds"}}
	metrics.Read(s)
	return s[0].Value.Float64Histogram()
}

// worstNewPause is the upper bound of the highest bucket that gained samples between two reads.
func worstNewPause(before, after *metrics.Float64Histogram) float64 {
	for i := len(after.Counts) - 1; i >= 0; i-- {
		if after.Counts[i] > before.Counts[i] {
			return after.Buckets[i+1]
		}
	}
	return 0
}

// TestRollback: a rollback returns to the previous activation, the next one to the built-in default with no
// config; activating an unknown version is refused.
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

// TestRunawayStartStopped: a module whose start function runs a loop-free call tree does not hang Load:
// its meter stops instantiation at InitTimeout, with the GC running.
func TestRunawayStartStopped(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger(), InitTimeout: 20 * time.Millisecond})
	stop := garbage(t)
	defer stop()
	start := time.Now()
	_, rep, err := h.Load("slowstart", readWasm(t, "slowstart"))
	took := time.Since(start)
	if !errors.Is(err, ErrInvalidModule) || took > 500*time.Millisecond ||
		!strings.Contains(strings.Join(rep.Problems, "\n"), "did not finish within 20ms") {
		t.Fatalf("after %s: %v %v", took, err, rep.Problems)
	}
	if st := h.Stats(); st.Interrupted != 1 {
		t.Fatalf("stats %+v", st)
	}
}
