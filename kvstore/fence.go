package kvstore

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Fence is an ingestion lease holder's fencing token for one scope of a model's index (the lease's
// endpoint; its data-parallel rank sub-endpoints share it). Token comes from Leases.AcquireLease and grows
// with every new holder of the lease.
type Fence struct {
	Scope string // non-empty, no tab or newline
	Token int64  // > 0
}

// Fencer is implemented by both index backends. Each model's index records, per fence scope, the token of
// the lease's current holder (RaiseFence); a write carrying another one comes from a stale holder (its
// lease expired while it was paused or cut off, and another holder took over) and is refused with
// ErrFenced.
type Fencer interface {
	// RaiseFence records f.Token as the newest token of f.Scope under model (the new lease holder calls it
	// right after acquiring the lease, before its first write): from then on writes with older tokens are
	// refused. It returns ErrFenced when a newer token is already recorded, ErrInvalidArgument for an empty
	// model or scope or a token ≤ 0.
	RaiseFence(ctx context.Context, model string, f Fence) error
	// Fenced returns a view of the index whose writes (Add, Remove, Apply, ClearEndpoint, ClearConfirmed,
	// Demote) carry f: each checks f against the token RaiseFence recorded for f.Scope under the call's
	// model atomically with the write (inside the write's script on Redis) and is refused with ErrFenced,
	// writing nothing, unless it is that token. Writes never record a token themselves, and pass while
	// none is recorded (a Redis restarted empty lost the lease counter too: a stale holder's token from
	// before the restart must not become the fence). Match and Record (the gateways' speculative entries,
	// not ingestion's) are the index's own.
	Fenced(f Fence) FencedIndex
}

// FencedIndex is an index view returned by Fencer.Fenced.
type FencedIndex interface {
	Index
	Demoter
	Fence() Fence
}

var (
	_ Fencer = (*MemoryIndex)(nil)
	_ Fencer = (*RedisIndex)(nil)
)

func checkFence(op, model string, f Fence) error {
	if err := checkNames(op, model, EndpointID(f.Scope)); err != nil {
		return err
	}
	if f.Token <= 0 {
		return fmt.Errorf("kvstore: %s: fencing token %d: %w", op, f.Token, ErrInvalidArgument)
	}
	return nil
}

// ---- memory ----

type memFenceKey struct{ model, scope string }

// memFence is one scope's current token (0: none recorded); mu is held across a fenced write, so a
// RaiseFence cannot slip between a write's check and its effect.
type memFence struct {
	mu    sync.Mutex
	token int64
}

func (m *MemoryIndex) fenceOf(model, scope string) *memFence {
	m.fmu.Lock()
	defer m.fmu.Unlock()
	if m.fences == nil {
		m.fences = map[memFenceKey]*memFence{}
	}
	k := memFenceKey{model, scope}
	f := m.fences[k]
	if f == nil {
		f = &memFence{}
		m.fences[k] = f
	}
	return f
}

// fenced runs write while holding f's scope fence, if f's token is the recorded one (or none is).
func (m *MemoryIndex) fenced(op, model string, f Fence, write func() error) error {
	if err := checkFence(op, model, f); err != nil {
		return err
	}
	mf := m.fenceOf(model, f.Scope)
	mf.mu.Lock()
	defer mf.mu.Unlock()
	if mf.token != 0 && f.Token != mf.token {
		return fmt.Errorf("kvstore: %s: fencing token %d of %q is not the current holder's %d: %w", op, f.Token, f.Scope, mf.token, ErrFenced)
	}
	return write()
}

// RaiseFence implements Fencer.
func (m *MemoryIndex) RaiseFence(_ context.Context, model string, f Fence) error {
	if err := checkFence("raise fence", model, f); err != nil {
		return err
	}
	mf := m.fenceOf(model, f.Scope)
	mf.mu.Lock()
	defer mf.mu.Unlock()
	if f.Token < mf.token {
		return fmt.Errorf("kvstore: raise fence: fencing token %d of %q is older than %d: %w", f.Token, f.Scope, mf.token, ErrFenced)
	}
	mf.token = f.Token
	return nil
}

// Fenced implements Fencer.
func (m *MemoryIndex) Fenced(f Fence) FencedIndex { return &fencedMemory{m: m, f: f} }

type fencedMemory struct {
	m *MemoryIndex
	f Fence
}

func (v *fencedMemory) Fence() Fence { return v.f }

func (v *fencedMemory) Match(ctx context.Context, model string, keys []BlockKey) ([]EndpointMatch, error) {
	return v.m.Match(ctx, model, keys)
}

func (v *fencedMemory) Record(ctx context.Context, model string, ep EndpointID, keys []BlockKey, ttl time.Duration) error {
	return v.m.Record(ctx, model, ep, keys, ttl)
}

func (v *fencedMemory) Add(ctx context.Context, model string, ep EndpointID, tier Tier, keys []BlockKey) error {
	return v.m.fenced("add", model, v.f, func() error { return v.m.Add(ctx, model, ep, tier, keys) })
}

func (v *fencedMemory) Remove(ctx context.Context, model string, ep EndpointID, tier Tier, keys []BlockKey) error {
	return v.m.fenced("remove", model, v.f, func() error { return v.m.Remove(ctx, model, ep, tier, keys) })
}

func (v *fencedMemory) Apply(ctx context.Context, model string, updates []Update) error {
	if err := checkUpdates(model, updates); err != nil {
		return err
	}
	return v.m.fenced("apply", model, v.f, func() error { return v.m.Apply(ctx, model, updates) })
}

func (v *fencedMemory) ClearEndpoint(ctx context.Context, model string, ep EndpointID) error {
	return v.m.fenced("clear endpoint", model, v.f, func() error { return v.m.ClearEndpoint(ctx, model, ep) })
}

func (v *fencedMemory) ClearConfirmed(ctx context.Context, model string, ep EndpointID) error {
	return v.m.fenced("clear confirmed", model, v.f, func() error { return v.m.ClearConfirmed(ctx, model, ep) })
}

func (v *fencedMemory) Demote(ctx context.Context, model string, ep EndpointID, ttl time.Duration) error {
	return v.m.fenced("demote", model, v.f, func() error { return v.m.Demote(ctx, model, ep, ttl) })
}

// ---- Redis ----

var (
	scriptFenceRaise    = script("index_fence_raise")
	scriptFencedAdd     = script("index_fence", "index_lib", "index_add")
	scriptFencedRemove  = script("index_fence", "index_lib", "index_remove")
	scriptFencedClear   = script("index_fence", "index_lib", "index_clear")
	scriptFencedClearC  = script("index_fence", "index_lib", "index_clear_confirmed")
	scriptFencedDemote  = script("index_fence", "index_lib", "index_demote")
	fencedScriptsByBase = map[*redis.Script]*redis.Script{
		scriptIndexAdd: scriptFencedAdd, scriptIndexRemove: scriptFencedRemove, scriptIndexClear: scriptFencedClear,
		scriptIndexClearConfirmed: scriptFencedClearC, scriptIndexDemote: scriptFencedDemote,
	}
)

// FenceKeyName returns the Redis key name of scope's fence under model (for tests and operators).
func (r *RedisIndex) FenceKeyName(model, scope string) string {
	return r.modelPrefix(model) + "f:" + scope
}

// fencedCall adapts one write script call to f: the fenced variant of s, with the fence key appended to
// keys and the token to args. A nil f leaves the call as it is.
func (r *RedisIndex) fencedCall(model string, f *Fence, s *redis.Script, keys []string, args []any) (*redis.Script, []string, []any) {
	if f == nil {
		return s, keys, args
	}
	return fencedScriptsByBase[s], append(keys, r.FenceKeyName(model, f.Scope)), append(args, strconv.FormatInt(f.Token, 10))
}

// redisErr wraps a Redis error of op, as ErrFenced when a fence refused the write.
func redisErr(op string, err error) error {
	if redis.HasErrorPrefix(err, "FENCED") {
		return fmt.Errorf("kvstore: redis %s: %v: %w", op, err, ErrFenced)
	}
	return fmt.Errorf("kvstore: redis %s: %w", op, err)
}

// RaiseFence implements Fencer (one EVALSHA).
func (r *RedisIndex) RaiseFence(ctx context.Context, model string, f Fence) error {
	if err := checkFence("raise fence", model, f); err != nil {
		return err
	}
	if err := scriptFenceRaise.Run(ctx, r.c, []string{r.FenceKeyName(model, f.Scope)}, strconv.FormatInt(f.Token, 10)).Err(); err != nil {
		return redisErr("raise fence", err)
	}
	return nil
}

// Fenced implements Fencer: the view's writes run the write scripts with the fence prologue
// (scripts/index_fence.lua), so check and write are one script.
func (r *RedisIndex) Fenced(f Fence) FencedIndex { return &fencedRedis{r: r, f: f} }

type fencedRedis struct {
	r *RedisIndex
	f Fence
}

func (v *fencedRedis) Fence() Fence { return v.f }

func (v *fencedRedis) Match(ctx context.Context, model string, keys []BlockKey) ([]EndpointMatch, error) {
	return v.r.Match(ctx, model, keys)
}

func (v *fencedRedis) Record(ctx context.Context, model string, ep EndpointID, keys []BlockKey, ttl time.Duration) error {
	return v.r.Record(ctx, model, ep, keys, ttl)
}

func (v *fencedRedis) check(op, model string) (*Fence, error) {
	if err := checkFence(op, model, v.f); err != nil {
		return nil, err
	}
	return &v.f, nil
}

func (v *fencedRedis) Add(ctx context.Context, model string, ep EndpointID, tier Tier, keys []BlockKey) error {
	f, err := v.check("add", model)
	if err != nil {
		return err
	}
	return v.r.addRemove(ctx, f, "add", false, model, ep, tier, keys)
}

func (v *fencedRedis) Remove(ctx context.Context, model string, ep EndpointID, tier Tier, keys []BlockKey) error {
	f, err := v.check("remove", model)
	if err != nil {
		return err
	}
	return v.r.addRemove(ctx, f, "remove", true, model, ep, tier, keys)
}

func (v *fencedRedis) Apply(ctx context.Context, model string, updates []Update) error {
	f, err := v.check("apply", model)
	if err != nil {
		return err
	}
	return v.r.apply(ctx, f, "apply", model, updates)
}

func (v *fencedRedis) ClearEndpoint(ctx context.Context, model string, ep EndpointID) error {
	f, err := v.check("clear endpoint", model)
	if err != nil {
		return err
	}
	return v.r.clearEndpoint(ctx, f, model, ep)
}

func (v *fencedRedis) ClearConfirmed(ctx context.Context, model string, ep EndpointID) error {
	f, err := v.check("clear confirmed", model)
	if err != nil {
		return err
	}
	return v.r.clearConfirmed(ctx, f, model, ep)
}

func (v *fencedRedis) Demote(ctx context.Context, model string, ep EndpointID, ttl time.Duration) error {
	f, err := v.check("demote", model)
	if err != nil {
		return err
	}
	return v.r.demote(ctx, f, model, ep, ttl)
}
