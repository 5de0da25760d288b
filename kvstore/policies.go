package kvstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Errors of Policies (wrapped with "kvstore: op" context; match with errors.Is).
var (
	// ErrNoPrevious: Rollback found the model's stack at its floor (one entry): nothing to roll back to.
	ErrNoPrevious = errors.New("kvstore: no previous activation")
	// ErrNoStack: Activate or Rollback for a model whose stack was never seeded (SeedStack). Wraps
	// ErrNotFound.
	ErrNoStack = fmt.Errorf("%w: no activation stack", ErrNotFound)
	// ErrStale: a conditional Rollback (ifTop) or Activate (IfLegacy) whose condition no longer holds.
	ErrStale = errors.New("kvstore: condition no longer holds")
	// ErrPolicyInUse: Unload refused; the error is a *PolicyInUseError saying where.
	ErrPolicyInUse = errors.New("kvstore: policy version in use")
)

// FleetStateLayout is the layout of the fleet-state keys (activation stacks, marker, serving reports) inside
// key layout LayoutVersion; layout 1 was one active value per model, which layout 2 keeps in step with each
// stack's top for older gateways (RATIONALE.md, "Fleet state").
const FleetStateLayout = 2

// MaxStackDepth bounds a model's activation stack: an Activate beyond it drops the oldest entry above the
// floor.
const MaxStackDepth = 64

// PolicyEntry is one activation in a model's history: a policy version ("name@sha256hex") and its JSON
// config (compact; "{}" when empty).
type PolicyEntry struct {
	Version string
	Config  []byte
}

// Equal reports whether e and o name the same version with byte-identical configs.
func (e PolicyEntry) Equal(o PolicyEntry) bool {
	return e.Version == o.Version && bytes.Equal(e.Config, o.Config)
}

// PolicyInUseError is Unload's refusal (errors.Is ErrPolicyInUse).
type PolicyInUseError struct {
	Version string
	Model   string
	// Role is "active" (the top of Model's stack), "previous" (the entry below it: what a rollback returns
	// to), "floor" (the bottom entry: the configuration's policy) or "legacy-active" (named by the layout-1
	// active value an older gateway wrote; kvstore/RATIONALE.md, "Fleet state").
	Role string
}

func (e *PolicyInUseError) Error() string {
	return fmt.Sprintf("kvstore: policy %s is in use: %s of %s", e.Version, e.Role, e.Model)
}

// Unwrap returns ErrPolicyInUse.
func (e *PolicyInUseError) Unwrap() error { return ErrPolicyInUse }

// ActivateOptions qualify Policies.Activate.
type ActivateOptions struct {
	// NeedBlob refuses the activation (ErrNotFound) unless a blob named Entry.Version is stored; false
	// for a version every gateway has built in.
	NeedBlob bool
	// IfLegacy, when set, makes the push conditional: it happens only while the model's layout-1 active
	// value is byte-identical to IfLegacy (else ErrStale), and is skipped (no error) when the top already
	// equals the entry. Used to adopt an older gateway's activation exactly once.
	IfLegacy []byte
}

// FleetBlob is one module of a FleetState.
type FleetBlob struct {
	Name   string
	SHA256 string
	Data   []byte
}

// FleetState is the store's fleet state as a gateway keeps a read-only copy of it, for Reseed.
type FleetState struct {
	Blobs  []FleetBlob
	Stacks map[string][]PolicyEntry
	// Endpoints, when not nil, is the run-time endpoint set to write back (Endpoints; seeded at revision 1
	// in the same step). nil leaves the endpoint set as it is (unseeded after an empty restart).
	Endpoints []EndpointRecord
}

// Fleet is one consistent read of the fleet state (ReadFleet).
type Fleet struct {
	// Epoch is the fleet-state marker ("" when the store has none: fresh, or restarted empty).
	Epoch string
	// Stacks are every model's activation stack, oldest first (Entries[0] is the floor, the last one is
	// active).
	Stacks map[string][]PolicyEntry
	// Legacy are the layout-1 active values by model (kept in step with each stack's top by every
	// operation here; differs only after an older gateway wrote one).
	Legacy map[string][]byte
	// Blobs are the stored modules (as ListBlobs).
	Blobs []BlobInfo
}

// Policies is the fleet's policy state, the one truth every gateway follows: each model's activation stack
// (its history, bottom entry the floor set by the configuration) beside the stored modules (Blobs). Each
// operation is one atomic step (a Lua script on Redis, under the store's mutex in memory), so whichever
// gateway is asked, the fleet gives one answer; two concurrent Rollbacks move a stack back two entries, or
// the second one is refused. Every change notifies "stack:<model>" (or "blob:<name>") on Blobs.Subscribe.
type Policies interface {
	// SeedStack creates model's stack as [floor] unless it exists, and returns the stack. needBlob as in
	// ActivateOptions. A layout-1 active value already stored for model is kept (an older gateway's
	// activation, for the caller to adopt); otherwise it is set to the floor.
	SeedStack(ctx context.Context, model string, floor PolicyEntry, needBlob bool) ([]PolicyEntry, error)
	// SetFloor is SeedStack, except that an existing stack gets floor as its bottom entry (the configuration
	// changed); with a one-entry stack that changes the active entry too.
	SetFloor(ctx context.Context, model string, floor PolicyEntry, needBlob bool) ([]PolicyEntry, error)
	// Activate pushes e on model's stack and returns the stack. Errors: ErrNoStack, ErrNotFound (NeedBlob
	// and no such blob), ErrStale (IfLegacy).
	Activate(ctx context.Context, model string, e PolicyEntry, o ActivateOptions) ([]PolicyEntry, error)
	// Rollback pops model's top entry and returns the stack. ifTop, when not "", makes it conditional on
	// the top naming that version (ErrStale otherwise). Errors: ErrNoStack, ErrNoPrevious (at the floor).
	Rollback(ctx context.Context, model, ifTop string) ([]PolicyEntry, error)
	// Unload deletes the blob named version and drops the stack entries that name it below the previous
	// one. Refused with a *PolicyInUseError while some stack has it on top, just below the top, or as its
	// floor, or a layout-1 active value names it. Errors: ErrNotFound (no such blob).
	Unload(ctx context.Context, version string) error
	// ReadFleet reads the marker, every stack, the layout-1 active values and the blob list at once.
	ReadFleet(ctx context.Context) (Fleet, error)
	// Reseed writes st (blobs not stored yet, the stacks, and the endpoint set when st.Endpoints is not
	// nil; layout-1 values only where none is stored) and sets the fleet-state marker to epoch, in one step, only when the store has no marker. It returns the marker now in the store and whether this
	// call set it. A zero st with a fresh marker only names the epoch.
	Reseed(ctx context.Context, epoch string, st FleetState) (marker string, won bool, err error)
	// ReportServing stores gateway's report (opaque bytes) for ttl; a report not renewed disappears.
	ReportServing(ctx context.Context, gateway string, report []byte, ttl time.Duration) error
	// ListServing returns the live reports by gateway.
	ListServing(ctx context.Context) (map[string][]byte, error)
}

func checkEntry(op, model string, e PolicyEntry) error {
	if model == "" || e.Version == "" || strings.ContainsAny(e.Version, " \n") || strings.ContainsAny(model, "\n") {
		return fmt.Errorf("kvstore: %s: model %q version %q: %w", op, model, e.Version, ErrInvalidArgument)
	}
	return nil
}

// LegacyActiveValue is the layout-1 active value of e (what gateways before the fleet-state layout read):
// {"version":"…","config":…}. The config must be compact JSON.
func LegacyActiveValue(e PolicyEntry) []byte {
	cfg := e.Config
	if len(cfg) == 0 {
		cfg = []byte("{}")
	}
	return []byte(`{"version":"` + e.Version + `","config":` + string(cfg) + `}`)
}

func cloneStack(s []PolicyEntry) []PolicyEntry {
	out := make([]PolicyEntry, len(s))
	for i, e := range s {
		out[i] = PolicyEntry{Version: e.Version, Config: slices.Clone(e.Config)}
	}
	return out
}

// The memory twin: MemoryBlobs implements Policies under its mutex.

var _ Policies = (*MemoryBlobs)(nil)

// SeedStack implements Policies.
func (m *MemoryBlobs) SeedStack(_ context.Context, model string, floor PolicyEntry, needBlob bool) ([]PolicyEntry, error) {
	if err := checkEntry("seed stack", model, floor); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.stacks[model]; ok {
		return cloneStack(s), nil
	}
	if _, ok := m.blobs[floor.Version]; needBlob && !ok {
		return nil, fmt.Errorf("kvstore: seed stack %s: blob %q: %w", model, floor.Version, ErrNotFound)
	}
	m.stacks[model] = cloneStack([]PolicyEntry{floor})
	m.keepLegacy(model, floor)
	m.notify("stack:" + model)
	return cloneStack(m.stacks[model]), nil
}

// SetFloor implements Policies.
func (m *MemoryBlobs) SetFloor(ctx context.Context, model string, floor PolicyEntry, needBlob bool) ([]PolicyEntry, error) {
	if err := checkEntry("set floor", model, floor); err != nil {
		return nil, err
	}
	m.mu.Lock()
	s, ok := m.stacks[model]
	if ok {
		defer m.mu.Unlock()
		if _, ok := m.blobs[floor.Version]; needBlob && !ok {
			return nil, fmt.Errorf("kvstore: set floor %s: blob %q: %w", model, floor.Version, ErrNotFound)
		}
		if !s[0].Equal(floor) {
			s[0] = PolicyEntry{Version: floor.Version, Config: slices.Clone(floor.Config)}
			if len(s) == 1 {
				m.active[model] = LegacyActiveValue(floor)
			}
			m.notify("stack:" + model)
		}
		return cloneStack(s), nil
	}
	m.mu.Unlock()
	return m.SeedStack(ctx, model, floor, needBlob)
}

// Activate implements Policies.
func (m *MemoryBlobs) Activate(_ context.Context, model string, e PolicyEntry, o ActivateOptions) ([]PolicyEntry, error) {
	if err := checkEntry("activate", model, e); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.stacks[model]
	if !ok {
		return nil, fmt.Errorf("kvstore: activate %s: %w", model, ErrNoStack)
	}
	if _, ok := m.blobs[e.Version]; o.NeedBlob && !ok {
		return nil, fmt.Errorf("kvstore: activate %s: blob %q: %w", model, e.Version, ErrNotFound)
	}
	if o.IfLegacy != nil {
		if !bytes.Equal(m.active[model], o.IfLegacy) {
			return nil, fmt.Errorf("kvstore: adopt %s: %w", model, ErrStale)
		}
		if s[len(s)-1].Equal(e) {
			return cloneStack(s), nil
		}
	}
	s = append(s, PolicyEntry{Version: e.Version, Config: slices.Clone(e.Config)})
	if len(s) > MaxStackDepth {
		s = slices.Delete(s, 1, 2)
	}
	m.stacks[model] = s
	m.active[model] = LegacyActiveValue(e)
	m.notify("stack:" + model)
	return cloneStack(s), nil
}

// Rollback implements Policies.
func (m *MemoryBlobs) Rollback(_ context.Context, model, ifTop string) ([]PolicyEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.stacks[model]
	if !ok {
		return nil, fmt.Errorf("kvstore: rollback %s: %w", model, ErrNoStack)
	}
	if ifTop != "" && s[len(s)-1].Version != ifTop {
		return nil, fmt.Errorf("kvstore: rollback %s from %s: %w", model, ifTop, ErrStale)
	}
	if len(s) <= 1 {
		return nil, fmt.Errorf("kvstore: rollback %s: %w", model, ErrNoPrevious)
	}
	s = s[:len(s)-1]
	m.stacks[model] = s
	m.active[model] = LegacyActiveValue(s[len(s)-1])
	m.notify("stack:" + model)
	return cloneStack(s), nil
}

// keepLegacy writes the layout-1 value of a new stack's top only where an older gateway left none (that
// value is adopted by the next reconcile).
func (m *MemoryBlobs) keepLegacy(model string, top PolicyEntry) {
	if _, ok := m.active[model]; !ok {
		m.active[model] = LegacyActiveValue(top)
	}
}

// Unload implements Policies.
func (m *MemoryBlobs) Unload(_ context.Context, version string) error {
	if version == "" {
		return fmt.Errorf("kvstore: unload: empty version: %w", ErrInvalidArgument)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.blobs[version]; !ok {
		return fmt.Errorf("kvstore: unload %q: %w", version, ErrNotFound)
	}
	models := make([]string, 0, len(m.stacks))
	for model := range m.stacks {
		models = append(models, model)
	}
	slices.Sort(models)
	for _, model := range models {
		if role := stackRole(m.stacks[model], version); role != "" {
			return &PolicyInUseError{Version: version, Model: model, Role: role}
		}
	}
	legacy := make([]string, 0, len(m.active))
	for model := range m.active {
		legacy = append(legacy, model)
	}
	slices.Sort(legacy)
	for _, model := range legacy {
		if legacyNames(m.active[model], version) {
			return &PolicyInUseError{Version: version, Model: model, Role: "legacy-active"}
		}
	}
	for model, s := range m.stacks {
		m.stacks[model] = slices.DeleteFunc(s, func(e PolicyEntry) bool { return e.Version == version })
	}
	delete(m.blobs, version)
	m.notify("blob:" + version)
	return nil
}

// stackRole says why version cannot leave stack s ("" when it can).
func stackRole(s []PolicyEntry, version string) string {
	n := len(s)
	switch {
	case n > 0 && s[n-1].Version == version:
		return "active"
	case n > 1 && s[n-2].Version == version:
		return "previous"
	case n > 0 && s[0].Version == version:
		return "floor"
	}
	return ""
}

// legacyNames reports whether a layout-1 active value names version (the same test the Redis script makes).
func legacyNames(value []byte, version string) bool {
	return bytes.Contains(value, []byte(`"version":"`+version+`"`))
}

// ReadFleet implements Policies.
func (m *MemoryBlobs) ReadFleet(context.Context) (Fleet, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := Fleet{Epoch: m.epoch, Stacks: make(map[string][]PolicyEntry, len(m.stacks)),
		Legacy: make(map[string][]byte, len(m.active)), Blobs: make([]BlobInfo, 0, len(m.blobs))}
	for model, s := range m.stacks {
		f.Stacks[model] = cloneStack(s)
	}
	for model, v := range m.active {
		f.Legacy[model] = slices.Clone(v)
	}
	for n, b := range m.blobs {
		f.Blobs = append(f.Blobs, BlobInfo{Name: n, SHA256: b.sha, Size: len(b.data)})
	}
	sortBlobs(f.Blobs)
	return f, nil
}

// Reseed implements Policies.
func (m *MemoryBlobs) Reseed(_ context.Context, epoch string, st FleetState) (string, bool, error) {
	if epoch == "" {
		return "", false, fmt.Errorf("kvstore: reseed: empty epoch: %w", ErrInvalidArgument)
	}
	for _, b := range st.Blobs {
		if err := checkDigest(b.Name, b.SHA256, b.Data); err != nil {
			return "", false, err
		}
	}
	for model, s := range st.Stacks {
		if len(s) == 0 {
			return "", false, fmt.Errorf("kvstore: reseed: empty stack for %s: %w", model, ErrInvalidArgument)
		}
		for _, e := range s {
			if err := checkEntry("reseed", model, e); err != nil {
				return "", false, err
			}
		}
	}
	if err := checkRecords("reseed", st.Endpoints, nil); err != nil {
		return "", false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.epoch != "" {
		return m.epoch, false, nil
	}
	m.epoch = epoch
	for _, b := range st.Blobs {
		if _, ok := m.blobs[b.Name]; !ok {
			m.blobs[b.Name] = memBlob{sha: strings.ToLower(b.SHA256), data: slices.Clone(b.Data)}
		}
	}
	for model, s := range st.Stacks {
		m.stacks[model] = cloneStack(s)
		m.keepLegacy(model, s[len(s)-1])
	}
	if st.Endpoints != nil {
		m.seedEndpointsLocked(st.Endpoints)
	}
	m.notify("fleet:reseeded")
	return epoch, true, nil
}

// ReportServing implements Policies.
func (m *MemoryBlobs) ReportServing(_ context.Context, gateway string, report []byte, ttl time.Duration) error {
	if gateway == "" || ttl <= 0 {
		return fmt.Errorf("kvstore: report serving: gateway %q ttl %v: %w", gateway, ttl, ErrInvalidArgument)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.serving[gateway] = memReport{data: slices.Clone(report), expires: m.now().Add(ttl)}
	return nil
}

// ListServing implements Policies.
func (m *MemoryBlobs) ListServing(context.Context) (map[string][]byte, error) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string][]byte{}
	for gw, r := range m.serving {
		if !now.Before(r.expires) {
			delete(m.serving, gw)
			continue
		}
		out[gw] = slices.Clone(r.data)
	}
	return out, nil
}

type memReport struct {
	data    []byte
	expires time.Time
}

func sortBlobs(b []BlobInfo) {
	slices.SortFunc(b, func(x, y BlobInfo) int { return strings.Compare(x.Name, y.Name) })
}
