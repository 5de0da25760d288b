package plugins

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/kvgate/kvgate/sdk"
)

// Snapshot is the input of one routing decision; it is the SDK's type, so the layout has one definition
// (plugins/ABI.md). Rank sets every Endpoints[i].Index to i.
type Snapshot = sdk.Snapshot

// RequestInfo is the per-request part of a Snapshot.
type RequestInfo = sdk.Request

// EndpointInfo is one candidate endpoint of a Snapshot.
type EndpointInfo = sdk.Endpoint

// Version names one loaded module: its name, "@", and the lowercase hex sha256 of its bytes (VersionOf
// builds one, ParseVersion checks one, ResolveVersion finds one from a name or a digest prefix).
type Version string

// Options configure a Host. The zero value gives the documented defaults.
type Options struct {
	// PoolSize is the number of instances per activation (concurrent calls per model). Default
	// GOMAXPROCS, at least 2. Each Go instance holds about 2.5 MiB.
	PoolSize int
	// CallTimeout is the per-call deadline of uploaded modules (waiting for an instance included). Default
	// 5ms. The trusted built-in runs without one.
	CallTimeout time.Duration
	// ValidationTimeout is the deadline of each validation sample (after one warm-up call under 10×
	// this), longer than CallTimeout so a busy machine does not reject a sound module. Default 50ms.
	ValidationTimeout time.Duration
	// InitTimeout bounds instantiating an uploaded module plus its init (a Go runtime starts in ~3 ms).
	// Default 2s.
	InitTimeout time.Duration
	// MemoryLimitPages caps each instance's linear memory in 64 KiB pages. Default 512 (32 MiB).
	MemoryLimitPages uint32
	// CacheDir, if set, is wazero's on-disk compilation cache (compiled code survives restarts).
	CacheDir string
	// FuelInterval is how much fuel an uploaded module gets between two deadline checks (plugins/internal/wasmmeter:
	// one unit per function entry or loop iteration, plus one per 1 KiB of bulk memory operations). A
	// call therefore ends at most one interval after its deadline, and the Go runtime can stop its
	// goroutine (for a garbage collection) at least once per interval. Default 16384.
	FuelInterval int32
	// RunawayRefills: a call interrupted at its deadline after at least this many fuel intervals within
	// that call was computing, not waiting for a CPU, so its version is disabled at once (the model's
	// previous activation serves). Default 8.
	RunawayRefills int
	// MaxConsecutiveMisses: this many missed deadlines in a row disable a version. Default 3. A single
	// short miss (e.g. a goroutine starved of CPU) only costs that request the fallback.
	MaxConsecutiveMisses int
	// OnDisable, if set, is called on its own goroutine after a version was disabled (a runaway call, missed
	// deadlines in a row, a failed instance rebuild) with the models it was active for, now rolled back to
	// their previous activation (Active tells which). The gateway uses it to store the rollback, so every
	// gateway sharing the store follows and the version can be unloaded.
	OnDisable func(v Version, models []string)
	// StderrLimitBytes is how much guest stdout+stderr is kept per instance. Default 4096.
	StderrLimitBytes int
	// LogBurstInterval: fallbacks are logged once, then at most once per interval with a count of those
	// not logged. Default 10s.
	LogBurstInterval time.Duration
	// Logger receives lifecycle (Info) and fallback (Warn) records. Default slog.Default().
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.PoolSize <= 0 {
		o.PoolSize = max(2, runtime.GOMAXPROCS(0))
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = 5 * time.Millisecond
	}
	if o.ValidationTimeout <= 0 {
		o.ValidationTimeout = 50 * time.Millisecond
	}
	if o.InitTimeout <= 0 {
		o.InitTimeout = 2 * time.Second
	}
	if o.MemoryLimitPages == 0 {
		o.MemoryLimitPages = 512
	}
	if o.FuelInterval <= 0 {
		o.FuelInterval = 16384
	}
	if o.RunawayRefills <= 0 {
		o.RunawayRefills = 8
	}
	if o.MaxConsecutiveMisses <= 0 {
		o.MaxConsecutiveMisses = 3
	}
	if o.StderrLimitBytes <= 0 {
		o.StderrLimitBytes = 4096
	}
	if o.LogBurstInterval <= 0 {
		o.LogBurstInterval = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Reason says why Rank used the native fallback ranking ("" when the policy answered).
type Reason uint8

// Fallback reasons; they are the "reason" label of kvgate_policy_fallbacks_total.
const (
	ReasonNone       Reason = iota
	ReasonTrap              // the guest trapped (panic outside the SDK, unreachable, out of memory...)
	ReasonTimeout           // the call missed its deadline (see Options.RunawayRefills, MaxConsecutiveMisses)
	ReasonGuestError        // the guest returned a negative error code
	ReasonInvalid           // the ranking had an out-of-range or duplicate index, or was empty
	ReasonTooLarge          // more endpoints than the guest's buffer holds
	ReasonClosed            // the host is closed
	numReasons
)

var reasonNames = [numReasons]string{"", "trap", "timeout", "guest_error", "invalid_ranking", "too_large", "closed"}

// String returns the metric label of r.
func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// FallbackReasons returns every reason a ranking can fall back for (all but ReasonNone), in order: the
// label values of kvgate_policy_fallbacks_total.
func FallbackReasons() []Reason {
	out := make([]Reason, 0, numReasons-1)
	for r := ReasonNone + 1; r < numReasons; r++ {
		out = append(out, r)
	}
	return out
}

// RankInfo describes how one ranking was made.
type RankInfo struct {
	Version  Version // the policy version that was asked (the built-in when the model has none active)
	Fallback bool    // true when the ranking is the native three-tier fallback
	Reason   Reason  // why it fell back
	Code     int32   // the guest's error code for ReasonGuestError
	// Partial says the ranking may be the first Request.RankLimit entries of a longer one: it has exactly
	// that many, fewer than the snapshot's endpoints. Rank again with RankLimit 0 for the whole ranking,
	// which begins with the same entries.
	Partial bool
}

// Host loads, validates, activates and calls routing policies. Create it with New; Close releases it.
type Host struct {
	opts  Options
	log   *slog.Logger
	cache wazero.CompilationCache
	rt    wazero.Runtime // built-in as shipped; uploaded modules metered (see meter.go)

	builtin    *activation // the default for models without an activation
	builtinVer Version

	mu       sync.Mutex // guards versions, models writes, activation changes
	versions map[Version]*version
	models   atomic.Pointer[map[string]*modelState]
	closed   atomic.Bool

	fallbacks   [numReasons]atomic.Uint64
	calls       atomic.Uint64
	swaps       atomic.Uint64
	refills     atomic.Uint64 // fuel refills of metered calls (each one a deadline check)
	interrupted atomic.Uint64 // metered calls stopped at a refill after their deadline
	overrunNano atomic.Int64  // time interrupted calls ran past their deadline
	replaced    atomic.Uint64 // instances discarded after a trap or timeout and replaced
	unloaded    atomic.Uint64 // versions unloaded

	logLast       atomic.Int64 // unix nanos of the last fallback log record
	logSuppressed atomic.Uint64

	followMu sync.Mutex // serializes Follow
}

type version struct {
	v        Version
	name     string
	sha      string
	size     int
	trusted  bool
	compiled wazero.CompiledModule
	rt       wazero.Runtime
	report   *ValidationReport
	loadedAt time.Time
	disabled atomic.Bool
	builtin  bool

	live      atomic.Int64 // activations of this version not yet finished (see hold, drop)
	unloaded  atomic.Bool  // Unload was called; compiled is closed when live reaches 0
	closeOnce sync.Once
}

// hold counts one more activation of ver; false when ver was unloaded.
func (ver *version) hold() bool {
	ver.live.Add(1)
	if ver.unloaded.Load() {
		ver.drop()
		return false
	}
	return true
}

// drop counts one activation fewer, closing the compiled module after Unload once none is left.
func (ver *version) drop() {
	if ver.live.Add(-1) == 0 && ver.unloaded.Load() {
		ver.closeCompiled()
	}
}

func (ver *version) closeCompiled() {
	ver.closeOnce.Do(func() { _ = ver.compiled.Close(context.Background()) })
}

// modelState is what runs for one model: the active activation and one warm activation (what a rollback or
// a disabled version falls back to). The history itself is the store's (Follow), not the host's.
type modelState struct {
	active atomic.Pointer[activation] // nil: the built-in default serves
	prev   *activation                // kept warm for Rollback and timeout deactivation; guarded by Host.mu
}

// New starts a host and compiles the embedded built-in policy (about 0.6 s cold; a few ms from a warm
// CacheDir). ctx bounds the start-up only.
func New(ctx context.Context, opts Options) (*Host, error) {
	opts = opts.withDefaults()
	h := &Host{opts: opts, log: opts.Logger, versions: map[Version]*version{}}
	empty := map[string]*modelState{}
	h.models.Store(&empty)
	if opts.CacheDir != "" {
		c, err := wazero.NewCompilationCacheWithDir(opts.CacheDir)
		if err != nil {
			return nil, fmt.Errorf("plugins: compilation cache %s: %w", opts.CacheDir, err)
		}
		h.cache = c
	} else {
		h.cache = wazero.NewCompilationCache()
	}
	// One compiler runtime without WithCloseOnContextDone (it costs ~25 ns per loop iteration and cannot
	// stop a loop-free call tree): uploaded modules are metered instead (meter.go).
	h.rt = wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler().WithCompilationCache(h.cache).
		WithMemoryLimitPages(opts.MemoryLimitPages))
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, h.rt); err != nil {
		h.closeRuntimes()
		return nil, fmt.Errorf("plugins: instantiate WASI: %w", err)
	}
	if err := h.instantiateMeter(ctx, h.rt); err != nil {
		h.closeRuntimes()
		return nil, fmt.Errorf("plugins: instantiate the fuel meter: %w", err)
	}
	ver, rep, err := h.load(ctx, BuiltinName, BuiltinWasm, true)
	if err != nil {
		h.closeRuntimes()
		return nil, fmt.Errorf("plugins: built-in policy: %w (%v)", err, rep.Problems)
	}
	a, err := h.newActivation(ctx, "", ver, nil)
	if err != nil {
		h.closeRuntimes()
		return nil, fmt.Errorf("plugins: built-in policy: %w", err)
	}
	h.builtin, h.builtinVer = a, ver.v
	h.log.LogAttrs(ctx, slog.LevelInfo, "policy host started", slog.String(attrPolicy, string(ver.v)),
		slog.Int("pool_size", opts.PoolSize), slog.Float64("call_timeout_seconds", opts.CallTimeout.Seconds()))
	return h, nil
}

const (
	attrPolicy = "policy"
	attrModel  = "model"
)

func (h *Host) closeRuntimes() {
	_ = h.rt.Close(context.Background())
}

// BuiltinVersion returns the Version of the embedded three-tier module.
func (h *Host) BuiltinVersion() Version { return h.builtinVer }

// Load compiles and validates a module and keeps it under Version name@sha256. Loading the same bytes
// under the same name again returns the existing version and its report. A rejected module gives a
// *ValidationError (errors.Is ErrInvalidModule) together with its report; bad names give ErrBadName.
func (h *Host) Load(name string, wasm []byte) (Version, ValidationReport, error) {
	if h.closed.Load() {
		return "", ValidationReport{}, ErrClosed
	}
	if err := checkName(name); err != nil {
		return "", ValidationReport{}, err
	}
	ver, rep, err := h.load(context.Background(), name, wasm, false)
	if err != nil {
		return rep.Version, *rep, err
	}
	return ver.v, *rep, nil
}

func checkName(name string) error {
	if name == "" || len(name) > 64 {
		return fmt.Errorf("%w: %q", ErrBadName, name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w: %q", ErrBadName, name)
		}
	}
	return nil
}

func (h *Host) load(ctx context.Context, name string, wasm []byte, trusted bool) (*version, *ValidationReport, error) {
	v := VersionOf(name, wasm)
	h.mu.Lock()
	if old, ok := h.versions[v]; ok {
		h.mu.Unlock()
		return old, old.report, nil
	}
	h.mu.Unlock()
	ver := &version{v: v, name: name, sha: string(v[len(name)+1:]), size: len(wasm), trusted: trusted, rt: h.rt,
		loadedAt: time.Now(), builtin: trusted}
	rep := h.validate(ctx, ver, wasm)
	ver.report = rep
	if !rep.OK() {
		if ver.compiled != nil {
			_ = ver.compiled.Close(ctx)
		}
		return nil, rep, &ValidationError{Report: rep}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if old, ok := h.versions[v]; ok { // a concurrent Load of the same bytes won
		_ = ver.compiled.Close(ctx)
		return old, old.report, nil
	}
	h.versions[v] = ver
	h.log.LogAttrs(ctx, slog.LevelInfo, "policy loaded", slog.String(attrPolicy, string(v)),
		slog.Int("size_bytes", len(wasm)), slog.Float64("compile_seconds", rep.CompileTime.Seconds()))
	return ver, rep, nil
}

// Activate makes version v, initialised with configJSON, the policy of model: it builds a pool of
// instances (each runs the guest's init with the config), then swaps it in. Calls in flight finish on
// the previous activation, which is kept warm for Rollback; the one before that is closed once drained
// (the host keeps no longer history: a fleet's history lives in its store, see Follow).
func (h *Host) Activate(model string, v Version, configJSON []byte) error {
	if h.closed.Load() {
		return ErrClosed
	}
	if model == "" {
		return fmt.Errorf("%w: empty model", ErrBadName)
	}
	h.mu.Lock()
	ver, ok := h.versions[v]
	h.mu.Unlock()
	if !ok {
		return fmt.Errorf("plugins: activate %s for %s: %w", v, model, ErrUnknownVersion)
	}
	if ver.disabled.Load() {
		return fmt.Errorf("plugins: activate %s for %s: %w", v, model, ErrVersionDisabled)
	}
	a, err := h.newActivation(context.Background(), model, ver, slices.Clone(configJSON))
	if err != nil {
		return fmt.Errorf("plugins: activate %s for %s: %w", v, model, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if ver.unloaded.Load() || ver.disabled.Load() { // while the pool was built
		a.retire()
		if ver.unloaded.Load() {
			return fmt.Errorf("plugins: activate %s for %s: %w", v, model, ErrUnknownVersion)
		}
		return fmt.Errorf("plugins: activate %s for %s: %w", v, model, ErrVersionDisabled)
	}
	st := h.stateLocked(model)
	old := st.active.Swap(a)
	h.swaps.Add(1)
	if old != nil {
		if st.prev != nil {
			st.prev.retire()
		}
		st.prev = old
	}
	h.log.LogAttrs(context.Background(), slog.LevelInfo, "policy activated", slog.String(attrModel, model),
		slog.String(attrPolicy, string(v)))
	return nil
}

// Rollback makes model's warm previous activation active again (the current one is closed once drained);
// with none, the model goes back to the built-in default. With nothing active it returns ErrNoPrevious. One
// step only: the host keeps no longer history (a gateway's history is its store's activation stack, which it
// follows with Follow).
func (h *Host) Rollback(model string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := (*h.models.Load())[model]
	if st == nil || st.active.Load() == nil {
		return fmt.Errorf("plugins: rollback %s: %w", model, ErrNoPrevious)
	}
	h.rollbackLocked(model, st, st.active.Load())
	return nil
}

// rollbackLocked replaces cur (if it is still active) by the warm previous activation and retires cur.
func (h *Host) rollbackLocked(model string, st *modelState, cur *activation) {
	if st.active.Load() != cur {
		return
	}
	next := st.prev
	st.prev = nil
	st.active.Store(next)
	h.swaps.Add(1)
	cur.retire()
	to := string(h.builtinVer)
	if next != nil {
		to = string(next.ver.v)
	}
	h.log.LogAttrs(context.Background(), slog.LevelInfo, "policy rolled back", slog.String(attrModel, model),
		slog.String("from", string(cur.ver.v)), slog.String("to", to))
}

func (h *Host) stateLocked(model string) *modelState {
	m := *h.models.Load()
	if st, ok := m[model]; ok {
		return st
	}
	nm := make(map[string]*modelState, len(m)+1)
	for k, v := range m {
		nm[k] = v
	}
	st := &modelState{}
	nm[model] = st
	h.models.Store(&nm)
	return st
}

// disable marks ver unusable and rolls back every model it is active for.
func (h *Host) disable(ver *version, why string) {
	if ver.trusted || !ver.disabled.CompareAndSwap(false, true) {
		return
	}
	h.mu.Lock()
	var rolledBack []string
	for model, st := range *h.models.Load() {
		if st.prev != nil && st.prev.ver == ver {
			st.prev.retire()
			st.prev = nil
		}
		if cur := st.active.Load(); cur != nil && cur.ver == ver {
			h.rollbackLocked(model, st, cur)
			rolledBack = append(rolledBack, model)
		}
	}
	h.mu.Unlock()
	slices.Sort(rolledBack)
	h.log.LogAttrs(context.Background(), slog.LevelWarn, "policy disabled",
		slog.String(attrPolicy, string(ver.v)), slog.String("why", why), slog.Any("rolled_back", rolledBack))
	if h.opts.OnDisable != nil && len(rolledBack) > 0 {
		go h.opts.OnDisable(ver.v, rolledBack)
	}
}

// Unload forgets version v: it is no longer listed nor activatable, and its compiled code is freed once
// no activation of it is left. A version active for some model, or kept warm as a model's previous
// activation (what Rollback returns to), cannot be unloaded. Errors: ErrUnknownVersion, ErrVersionInUse
// (also for the built-in), ErrClosed.
func (h *Host) Unload(v Version) error {
	if h.closed.Load() {
		return ErrClosed
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	ver, ok := h.versions[v]
	if !ok {
		return fmt.Errorf("plugins: unload %s: %w", v, ErrUnknownVersion)
	}
	if ver.builtin {
		return fmt.Errorf("plugins: unload %s: %w: it is the built-in default", v, ErrVersionInUse)
	}
	for _, model := range sortedKeys(*h.models.Load()) {
		st := (*h.models.Load())[model]
		if a := st.active.Load(); a != nil && a.ver == ver {
			return fmt.Errorf("plugins: unload %s: %w: active for %s", v, ErrVersionInUse, model)
		}
		if st.prev != nil && st.prev.ver == ver {
			return fmt.Errorf("plugins: unload %s: %w: previous activation of %s", v, ErrVersionInUse, model)
		}
	}
	delete(h.versions, v)
	ver.unloaded.Store(true)
	if ver.live.Load() == 0 {
		ver.closeCompiled()
	}
	h.unloaded.Add(1)
	h.log.LogAttrs(context.Background(), slog.LevelInfo, "policy unloaded", slog.String(attrPolicy, string(v)))
	return nil
}

// VersionInfo describes one loaded version.
type VersionInfo struct {
	Version   Version   // name@sha256
	Name      string    // the name it was loaded under
	SHA256    string    // lowercase hex digest of the module bytes
	SizeBytes int       // module size in bytes
	Builtin   bool      // the embedded three-tier module (trusted: runs unmetered, without a deadline)
	Disabled  bool      // disabled after a missed deadline
	ActiveFor []string  // models it is active for, sorted
	LoadedAt  time.Time // when Load accepted it
}

// Versions lists every loaded version, sorted by Version.
func (h *Host) Versions() []VersionInfo {
	h.mu.Lock()
	defer h.mu.Unlock()
	active := map[*version][]string{}
	for model, st := range *h.models.Load() {
		if a := st.active.Load(); a != nil {
			active[a.ver] = append(active[a.ver], model)
		}
	}
	out := make([]VersionInfo, 0, len(h.versions))
	for _, v := range h.versions {
		models := active[v]
		slices.Sort(models)
		out = append(out, VersionInfo{Version: v.v, Name: v.name, SHA256: v.sha, SizeBytes: v.size,
			Builtin: v.builtin, Disabled: v.disabled.Load(), ActiveFor: models, LoadedAt: v.loadedAt})
	}
	slices.SortFunc(out, func(a, b VersionInfo) int {
		if a.Version < b.Version {
			return -1
		}
		if a.Version > b.Version {
			return 1
		}
		return 0
	})
	return out
}

// Active returns the version serving model and its config (the built-in with a nil config when the
// model has no activation).
func (h *Host) Active(model string) (Version, []byte) {
	a := h.current(model)
	return a.ver.v, slices.Clone(a.config)
}

func (h *Host) current(model string) *activation {
	if st := (*h.models.Load())[model]; st != nil {
		if a := st.active.Load(); a != nil {
			return a
		}
	}
	return h.builtin
}

// Close retires every activation and closes the runtime.
func (h *Host) Close(ctx context.Context) error {
	if !h.closed.CompareAndSwap(false, true) {
		return nil
	}
	h.mu.Lock()
	for _, st := range *h.models.Load() {
		if a := st.active.Swap(nil); a != nil {
			a.retire()
		}
		if st.prev != nil {
			st.prev.retire()
			st.prev = nil
		}
	}
	h.mu.Unlock()
	h.builtin.retire()
	return h.rt.Close(ctx)
}
