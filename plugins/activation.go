package plugins

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/kvgate/kvgate/plugins/internal/threetier"
	"github.com/kvgate/kvgate/sdk"
)

// instance is one instantiated module; it serves one call at a time.
type instance struct {
	mod    api.Module
	choose api.Function
	init   api.Function
	mem    api.Memory
	buf    uint32
	bufCap uint32
	stack  []uint64
	seen   []bool
	minor  int32 // the guest's ABI minor version (kvgate_policy_abi_minor; 0 without the export)
	out    *capWriter
	dl     callDeadline // the context of the instance's metered calls (uploaded modules)
	// lastErr is the error of the instance's last failed call (a trap's message for validation reports).
	lastErr error
}

// activation is one version with one config for one model: a fixed pool of instances.
type activation struct {
	h        *Host
	model    string
	ver      *version
	config   []byte
	fallback threetier.Config // the native fallback's config (the model's, when the version is three-tier)

	pool    chan *instance
	retired chan struct{}
	refs    atomic.Int64 // holders (callers, replacers) + retiredBit once retired
	misses  atomic.Int32 // consecutive missed deadlines
	retOnce sync.Once
	finOnce sync.Once
}

const retiredBit = int64(1) << 40

func (h *Host) newActivation(ctx context.Context, model string, ver *version, config []byte) (*activation, error) {
	a := &activation{h: h, model: model, ver: ver, config: config, fallback: threetier.DefaultConfig(),
		pool: make(chan *instance, h.opts.PoolSize), retired: make(chan struct{})}
	if ver.builtin {
		c, err := threetier.ParseConfig(config)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInitFailed, err)
		}
		a.fallback = c
	}
	if !ver.hold() {
		return nil, ErrUnknownVersion
	}
	for i := 0; i < h.opts.PoolSize; i++ {
		inst, err := h.newInstance(ctx, ver, config)
		if err != nil {
			for len(a.pool) > 0 {
				(<-a.pool).close()
			}
			ver.drop()
			return nil, err
		}
		a.pool <- inst
	}
	return a, nil
}

// newInstance instantiates ver (running _initialize) and calls its init with config. An uploaded module
// does both under Options.InitTimeout, enforced by its fuel meter.
func (h *Host) newInstance(ctx context.Context, ver *version, config []byte) (*instance, error) {
	return h.instantiate(ctx, ver, config)
}

func (h *Host) instantiate(ctx context.Context, ver *version, config []byte) (*instance, error) {
	var dl *callDeadline
	if !ver.trusted {
		dl = &callDeadline{}
		ctx = dl.start(time.Now().Add(h.opts.InitTimeout))
	}
	stopped := func() bool { return dl != nil && dl.expired }
	out := &capWriter{limit: h.opts.StderrLimitBytes}
	cfg := wazero.NewModuleConfig().WithName("").WithStartFunctions("_initialize").
		WithSysNanotime().WithStdout(out).WithStderr(out)
	mod, err := ver.rt.InstantiateModule(ctx, ver.compiled, cfg)
	if err != nil {
		if stopped() {
			err = fmt.Errorf("%w (did not finish within %s)", err, h.opts.InitTimeout)
		}
		return nil, fmt.Errorf("%w: instantiate: %w (%s)", ErrInitFailed, err, out.String())
	}
	inst := &instance{mod: mod, choose: mod.ExportedFunction(sdk.ExportChoose), init: mod.ExportedFunction(sdk.ExportInit),
		mem: mod.Memory(), stack: make([]uint64, 1), out: out}
	fail := func(err error) (*instance, error) {
		_ = mod.Close(context.Background())
		if stopped() {
			err = fmt.Errorf("%w (instantiate and init did not finish within %s)", err, h.opts.InitTimeout)
		}
		return nil, fmt.Errorf("%w: %w", ErrInitFailed, err)
	}
	if inst.choose == nil || inst.init == nil || inst.mem == nil {
		return fail(errors.New("missing exports"))
	}
	ptr, err := mod.ExportedFunction(sdk.ExportBuf).Call(ctx)
	if err != nil {
		return fail(fmt.Errorf("%s: %w", sdk.ExportBuf, err))
	}
	capa, err := mod.ExportedFunction(sdk.ExportBufCap).Call(ctx)
	if err != nil {
		return fail(fmt.Errorf("%s: %w", sdk.ExportBufCap, err))
	}
	inst.buf, inst.bufCap = uint32(ptr[0]), uint32(capa[0])
	if f := mod.ExportedFunction(sdk.ExportMinor); f != nil {
		m, err := f.Call(ctx)
		if err != nil {
			return fail(fmt.Errorf("%s: %w", sdk.ExportMinor, err))
		}
		inst.minor = api.DecodeI32(m[0])
	}
	if inst.bufCap < sdk.HeaderSize+sdk.RecordSize {
		return fail(fmt.Errorf("buffer of %d bytes is too small", inst.bufCap))
	}
	if _, ok := inst.mem.Read(inst.buf, inst.bufCap); !ok {
		return fail(fmt.Errorf("buffer [%d,+%d) is outside memory", inst.buf, inst.bufCap))
	}
	if uint64(len(config)) > uint64(inst.bufCap) {
		return fail(fmt.Errorf("config of %d bytes exceeds the %d-byte buffer", len(config), inst.bufCap))
	}
	inst.mem.Write(inst.buf, config)
	inst.stack[0] = api.EncodeI32(int32(len(config)))
	if err := inst.init.CallWithStack(ctx, inst.stack); err != nil {
		return fail(fmt.Errorf("%s: %w (%s)", sdk.ExportInit, err, out.String()))
	}
	if code := api.DecodeI32(inst.stack[0]); code != 0 {
		if msg := strings.TrimSpace(out.String()); msg != "" {
			return fail(fmt.Errorf("%s returned %d: %s", sdk.ExportInit, code, msg))
		}
		return fail(fmt.Errorf("%s returned %d", sdk.ExportInit, code))
	}
	return inst, nil
}

func (i *instance) close() { _ = i.mod.Close(context.Background()) }

// acquire takes an instance, or returns nil when the activation was retired (true) or the deadline
// passed while every instance was busy (false). A zero deadline waits as long as it takes.
func (a *activation) acquire(deadline time.Time) (*instance, bool) {
	if a.refs.Add(1)&retiredBit != 0 {
		a.release(nil)
		return nil, true
	}
	select {
	case inst := <-a.pool:
		return inst, false
	default:
	}
	var expired <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		expired = t.C
	}
	select {
	case inst := <-a.pool:
		return inst, false
	case <-a.retired:
		a.release(nil)
		return nil, true
	case <-expired:
		a.release(nil)
		return nil, false
	}
}

// release puts inst back (nil: nothing to put back) and drops the caller's reference.
func (a *activation) release(inst *instance) {
	if inst != nil {
		a.pool <- inst
	}
	if a.refs.Add(-1) == retiredBit {
		a.finish()
	}
}

// retire stops new calls; the pool is closed when the last holder leaves.
func (a *activation) retire() {
	a.retOnce.Do(func() {
		close(a.retired)
		if a.refs.Add(retiredBit) == retiredBit {
			a.finish()
		}
	})
}

func (a *activation) finish() {
	a.finOnce.Do(func() {
		for {
			select {
			case inst := <-a.pool:
				inst.close()
			default:
				a.ver.drop()
				return
			}
		}
	})
}

// replace discards a broken instance and builds a new one in the background.
func (a *activation) replace(inst *instance) {
	inst.close()
	a.h.replaced.Add(1)
	if a.refs.Add(1)&retiredBit != 0 {
		a.release(nil)
		return
	}
	go func() {
		n, err := a.h.newInstance(context.Background(), a.ver, a.config)
		if err != nil && a.h.closed.Load() { // the runtime is gone: shutdown, not a broken policy
			a.release(nil)
			return
		}
		if err != nil {
			a.h.log.LogAttrs(context.Background(), slog.LevelError, "policy instance replacement failed",
				slog.String(attrPolicy, string(a.ver.v)), slog.String("error", err.Error()))
			a.release(nil)
			if !a.ver.trusted {
				a.h.disable(a.ver, "instance replacement failed")
			}
			return
		}
		a.release(n)
	}()
}

// Rank returns the ranking of s's endpoints (indices into s.Endpoints, best first) by model's active
// policy. It never fails: on guest trouble it returns the native three-tier ranking and says why in
// RankInfo. It sets s.Endpoints[i].Index = i. With no healthy endpoint the ranking is empty.
//
// s.Request.RankLimit = L > 0 asks for the first L entries only: a policy of ABI v1.1 or later may stop
// there (the built-in and the native fallback do: a selection instead of a sort), and RankInfo.Partial
// then says so. A v1.0 policy is sent RankLimit 0 and ranks in full.
func (h *Host) Rank(ctx context.Context, model string, s *Snapshot) ([]int, RankInfo) {
	for i := range s.Endpoints {
		s.Endpoints[i].Index = uint32(i)
	}
	h.calls.Add(1)
	var info RankInfo
	for attempt := 0; attempt < 4; attempt++ {
		a := h.current(model)
		info = RankInfo{Version: a.ver.v}
		if h.closed.Load() {
			info.Reason = ReasonClosed
			break
		}
		out, reason, code, retry := a.call(ctx, s)
		if retry {
			continue
		}
		if reason == ReasonNone {
			info.Partial = partial(s, len(out))
			return out, info
		}
		info.Reason, info.Code = reason, code
		break
	}
	if info.Reason == ReasonNone { // retired on every attempt (swap storm)
		info.Reason = ReasonClosed
	}
	info.Fallback = true
	h.fallbacks[info.Reason].Add(1)
	h.logFallback(ctx, model, info)
	out := h.fallbackRank(model, s)
	info.Partial = partial(s, len(out))
	return out, info
}

// partial says whether a ranking of count entries answering s may have been cut at s.Request.RankLimit.
func partial(s *Snapshot, count int) bool {
	l := int(s.Request.RankLimit)
	return l > 0 && count == l && l < len(s.Endpoints)
}

// FallbackRank is the native three-tier ranking Rank falls back to, with the config of model's active
// three-tier activation (else the defaults).
func (h *Host) fallbackRank(model string, s *Snapshot) []int {
	cfg := h.current(model).fallback
	r := threetier.Ranker{Config: cfg}
	idx, _ := r.Rank(s, make([]uint32, 0, len(s.Endpoints)))
	out := make([]int, len(idx))
	for i, v := range idx {
		out[i] = int(v)
	}
	return out
}

func (h *Host) logFallback(ctx context.Context, model string, info RankInfo) {
	now := time.Now().UnixNano()
	last := h.logLast.Load()
	if now-last < int64(h.opts.LogBurstInterval) || !h.logLast.CompareAndSwap(last, now) {
		h.logSuppressed.Add(1)
		return
	}
	h.log.LogAttrs(ctx, slog.LevelWarn, "policy fell back to native three-tier",
		slog.String(attrModel, model), slog.String(attrPolicy, string(info.Version)),
		slog.String("reason", info.Reason.String()), slog.Int("code", int(info.Code)),
		slog.Uint64("suppressed", h.logSuppressed.Swap(0)))
}

// call runs the guest once. retry means the activation was retired before the call started. An
// uploaded module runs metered under Options.CallTimeout, waiting for a free instance included; the
// caller's own cancellation (client gone) is not the policy's miss and does not stop the call.
func (a *activation) call(ctx context.Context, s *Snapshot) (out []int, reason Reason, code int32, retry bool) {
	h := a.h
	if a.ver.trusted {
		inst, retired := a.acquire(time.Time{})
		if inst == nil {
			return nil, ReasonNone, 0, retired
		}
		out, reason, code, broken := inst.run(ctx, s)
		if broken {
			a.replace(inst)
			a.release(nil)
		} else {
			a.release(inst)
		}
		return out, reason, code, false
	}
	deadline := time.Now().Add(h.opts.CallTimeout)
	inst, retired := a.acquire(deadline)
	if inst == nil {
		if retired {
			return nil, ReasonNone, 0, true
		}
		return nil, ReasonTimeout, 0, false // every instance busy until the deadline
	}
	dl := inst.dl.start(deadline)
	out, reason, code, broken := inst.run(dl, s)
	// Disable (which retires this activation) before replacing the instance, so a disabled version's
	// instance is not rebuilt in the background only to be closed; inst is still ours, so dl is too.
	switch reason {
	case ReasonTimeout:
		if dl.refills >= h.opts.RunawayRefills {
			h.disable(a.ver, fmt.Sprintf("a call still computing at its %s deadline (%d fuel intervals)", h.opts.CallTimeout, dl.refills))
		} else {
			a.miss()
		}
	case ReasonNone:
		a.misses.Store(0)
	}
	if broken {
		a.replace(inst)
		a.release(nil)
	} else {
		a.release(inst)
	}
	return out, reason, code, false
}

// miss counts a missed deadline; MaxConsecutiveMisses in a row disable the version.
func (a *activation) miss() {
	if n := a.misses.Add(1); n >= int32(a.h.opts.MaxConsecutiveMisses) {
		a.h.disable(a.ver, "missed "+itoa(int(n))+" deadlines in a row")
	}
}

// call is one prepared guest call: the snapshot already encoded into the instance's buffer, so invoke
// never reads the caller's snapshot.
type call struct {
	size       int  // encoded bytes
	n          int  // endpoints
	anyHealthy bool // an empty ranking is invalid when true
}

// prepare encodes s into the instance's buffer (on the caller's goroutine).
func (i *instance) prepare(s *Snapshot) (call, Reason, bool) {
	n := len(s.Endpoints)
	c := call{size: sdk.EncodedSize(n), n: n}
	if c.size > int(i.bufCap) || 4*n > int(i.bufCap) {
		return c, ReasonTooLarge, false
	}
	view, ok := i.mem.Read(i.buf, uint32(c.size))
	if !ok {
		return c, ReasonTrap, true
	}
	// A v1.0 guest is sent v1.0 bytes: RankLimit is a v1.1 field (it then ranks in full).
	limit := s.Request.RankLimit
	if i.minor < 1 {
		s.Request.RankLimit = 0
	}
	_, err := sdk.EncodeSnapshot(view, s)
	s.Request.RankLimit = limit
	if err != nil {
		return c, ReasonTooLarge, false
	}
	for k := range s.Endpoints {
		if s.Endpoints[k].Healthy() {
			c.anyHealthy = true
			break
		}
	}
	return c, ReasonNone, false
}

// run encodes s, calls choose and checks the ranking. broken means the instance must be discarded.
func (i *instance) run(ctx context.Context, s *Snapshot) (out []int, reason Reason, code int32, broken bool) {
	c, reason, broken := i.prepare(s)
	if reason != ReasonNone {
		return nil, reason, 0, broken
	}
	return i.invoke(ctx, c)
}

// invoke calls choose on a prepared buffer and checks the ranking.
func (i *instance) invoke(ctx context.Context, c call) (out []int, reason Reason, code int32, broken bool) {
	n := c.n
	i.stack[0] = api.EncodeI32(int32(c.size))
	if err := i.choose.CallWithStack(ctx, i.stack); err != nil {
		i.lastErr = err
		if d, ok := ctx.(*callDeadline); ok && d.expired {
			return nil, ReasonTimeout, 0, true // refill stopped it (a guest's own proc_exit is a trap)
		}
		return nil, ReasonTrap, 0, true
	}
	count := api.DecodeI32(i.stack[0])
	if count < 0 {
		return nil, ReasonGuestError, count, false
	}
	if int(count) > n {
		return nil, ReasonInvalid, count, false
	}
	res, ok := i.mem.Read(i.buf, uint32(4*count)) // re-read: the call may have grown memory
	if !ok {
		return nil, ReasonTrap, 0, true
	}
	if cap(i.seen) < n {
		i.seen = make([]bool, n)
	}
	seen := i.seen[:n]
	clear(seen)
	out = make([]int, count)
	for k := range out {
		v := binary.LittleEndian.Uint32(res[4*k:])
		if v >= uint32(n) || seen[v] {
			return nil, ReasonInvalid, 0, false
		}
		seen[v] = true
		out[k] = int(v)
	}
	if count == 0 && c.anyHealthy {
		return nil, ReasonInvalid, 0, false
	}
	return out, ReasonNone, 0, false
}

// capWriter keeps the first limit bytes written (guest stdout/stderr) and drops the rest.
type capWriter struct {
	mu      sync.Mutex
	limit   int
	buf     []byte
	dropped int
}

// Write keeps what fits under the limit and reports p as fully written (the guest must not fail).
func (w *capWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	room := w.limit - len(w.buf)
	if room > len(p) {
		room = len(p)
	}
	if room > 0 {
		w.buf = append(w.buf, p[:room]...)
	}
	w.dropped += len(p) - max(room, 0)
	return len(p), nil
}

// String returns the kept output.
func (w *capWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.buf)
}
