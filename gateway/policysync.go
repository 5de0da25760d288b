package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/gateway/internal/admin"
	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/plugins"
)

// PolicyReconcileInterval is how often a gateway re-reads the store's fleet state besides reacting to change
// notifications (which a disconnected subscriber misses), and reports what it serves.
const PolicyReconcileInterval = 500 * time.Millisecond

// Timings of the fleet-state follower.
const (
	// servingReportTTL is how long a gateway's serving report outlives its last renewal.
	servingReportTTL = 6 * PolicyReconcileInterval
	// reseedGrace: a gateway that has never seen a fleet-state marker waits this long before naming an epoch
	// itself, so the gateways that hold a copy of the fleet state (and re-seed it) go first.
	reseedGrace = 4 * PolicyReconcileInterval
	// loadRetryMin and loadRetryMax bound the backoff between two attempts to load a module that failed.
	loadRetryMin = time.Second
	loadRetryMax = 30 * time.Second
)

// policySync makes the local policy host follow the store's fleet state (kvstore.Policies, the one truth):
// every model's activation stack and the stored modules. Uploads are stored as blobs named by their version
// (name@sha256); activate, rollback and unload are each one atomic step on the store, and every gateway
// follows the result (Host.Follow: the top serves, the entry below it is kept warm) on notifications and
// every PolicyReconcileInterval. It implements admin.Sync.
//
// It also reports what this gateway serves per model (ReportServing: /readyz, `kvgate policy list`), retries
// failed loads with backoff (keeping the cause), and keeps a read-only copy of the fleet state (marker,
// modules, stacks) that it writes back when the store comes back empty (Reseed; the first re-seeder under
// the new marker wins).
type policySync struct {
	g  *Gateway
	id string // this gateway's ID in serving reports

	opMu sync.Mutex // serializes following with the admin operations, so no stale read undoes an answer

	mu       sync.Mutex
	floors   map[string]kvstore.PolicyEntry // model → the configuration's policy (its stack's floor)
	floorSet map[string]bool                // models whose floor this gateway has set in the store (reconcile only)
	failed   map[string]*loadFailure        // versions that failed to load here, retried with backoff
	loading  map[string]chan struct{}       // versions being loaded, closed when done
	stored   map[string]uint64              // versions seen in the store → gen when first seen; unloaded once gone
	gen      uint64                         // counts reads and stores, so a list is never older than a mark it judges
	status   map[string]admin.ModelServing  // model → what this gateway serves, wants, and why not
	copy     fleetCopy
	noMarker time.Time // when this gateway, holding no copy, first saw the store without a marker
	kick     chan struct{}
	// emptied wakes the follower when the guard found the store restarted empty (storeEmptied); epochHint
	// is that new store epoch, used once as the fleet-state marker of the re-seed, so both markers name one
	// epoch. quarantined is the marker this gateway last re-quarantined TPU slices under (once per epoch).
	emptied     chan struct{}
	epochHint   string
	quarantined string
	// rounds and loads count the finished reconcile rounds of run and passes of runLoader. Only tests read
	// them: a "nothing changes" check waits for a round begun after its action instead of sleeping.
	rounds, loads atomic.Uint64
}

// loadFailure is a module that failed to load here: the cause, how often, and when to try again.
type loadFailure struct {
	err      error
	attempts int
	next     time.Time
}

// fleetCopy is this gateway's read-only copy of the store's fleet state, for Reseed.
type fleetCopy struct {
	epoch   string // the marker it was read under ("" before any)
	stacks  map[string][]kvstore.PolicyEntry
	modules map[string]kvstore.FleetBlob
}

func newPolicySync(g *Gateway) *policySync {
	return &policySync{g: g, id: g.holder, floors: map[string]kvstore.PolicyEntry{}, floorSet: map[string]bool{}, failed: map[string]*loadFailure{},
		loading: map[string]chan struct{}{}, stored: map[string]uint64{}, status: map[string]admin.ModelServing{},
		copy: fleetCopy{modules: map[string]kvstore.FleetBlob{}}, kick: make(chan struct{}, 1), emptied: make(chan struct{}, 1)}
}

func (p *policySync) blobs() kvstore.Blobs     { return p.g.store.Blobs }
func (p *policySync) fleet() kvstore.Policies  { return p.g.store.Policies }
func (p *policySync) builtin() plugins.Version { return p.g.host.BuiltinVersion() }
func (p *policySync) isBuiltin(v string) bool  { return plugins.Version(v) == p.builtin() }
func (p *policySync) needBlob(v string) bool   { return !p.isBuiltin(v) }
func (p *policySync) entry(e kvstore.PolicyEntry) plugins.Entry {
	return plugins.Entry{Version: plugins.Version(e.Version), Config: compactJSON(e.Config)}
}

// PolicyLoaded stores an accepted module under its version.
func (p *policySync) PolicyLoaded(ctx context.Context, name string, wasm []byte) error {
	ver := plugins.VersionOf(name, wasm)
	v, sha := string(ver), ver.SHA256()
	if err := p.blobs().PutBlob(ctx, v, sha, wasm); err != nil {
		return err
	}
	p.mu.Lock()
	p.gen++
	p.stored[v] = p.gen // newer than any list being read now: that list cannot unload it
	p.copy.modules[v] = kvstore.FleetBlob{Name: v, SHA256: sha, Data: wasm}
	delete(p.failed, v)
	p.mu.Unlock()
	return nil
}

// StoredVersions lists the stored versions (blob names of the form name@sha256).
func (p *policySync) StoredVersions(ctx context.Context) ([]plugins.Version, error) {
	list, err := p.blobs().ListBlobs(ctx)
	if err != nil {
		return nil, err
	}
	var out []plugins.Version
	for _, b := range list {
		if plugins.IsVersion(b.Name) {
			out = append(out, plugins.Version(b.Name))
		}
	}
	return out, nil
}

// Activate builds (v, cfg) here first (so a config the guest's init rejects is refused before the fleet
// sees it), then pushes it on model's stack in the store, and follows the result.
func (p *policySync) Activate(ctx context.Context, model string, v plugins.Version, cfg []byte) error {
	p.opMu.Lock()
	defer p.opMu.Unlock()
	e := plugins.Entry{Version: v, Config: compactJSON(cfg)}
	cur, curCfg := p.g.host.Active(model)
	if err := p.g.host.Follow(model, e, &plugins.Entry{Version: cur, Config: compactJSON(curCfg)}); err != nil {
		return err
	}
	st, err := p.push(ctx, model, kvstore.PolicyEntry{Version: string(v), Config: e.Config})
	if err != nil {
		p.followStoreLocked(ctx) // undo the local build: serve what the store says
		return err
	}
	p.followLocked(model, st)
	return nil
}

// push pushes e on model's stack, seeding the stack first if the store lost it.
func (p *policySync) push(ctx context.Context, model string, e kvstore.PolicyEntry) ([]kvstore.PolicyEntry, error) {
	o := kvstore.ActivateOptions{NeedBlob: p.needBlob(e.Version)}
	st, err := p.fleet().Activate(ctx, model, e, o)
	if errors.Is(err, kvstore.ErrNoStack) {
		if err := p.seed(ctx, model); err != nil {
			return nil, err
		}
		st, err = p.fleet().Activate(ctx, model, e, o)
	}
	return st, err
}

// seed creates model's stack from the configuration's policy unless it exists. On a store without a
// fleet-state marker it re-seeds first (naming the epoch; the first re-seeder wins), so a stack is never
// written where a gateway's copy should come back.
func (p *policySync) seed(ctx context.Context, model string) error {
	f, err := p.fleet().ReadFleet(ctx)
	if err != nil {
		return err
	}
	if f.Epoch == "" {
		p.reseed(ctx, true)
	}
	p.mu.Lock()
	floor, ok := p.floors[model]
	p.mu.Unlock()
	if !ok {
		return fmt.Errorf("gateway: model %s has no configured policy", model)
	}
	_, err = p.fleet().SeedStack(ctx, model, floor, p.needBlob(floor.Version))
	return err
}

// Rollback pops model's stack in the store (one step for the whole fleet) and follows the result; it
// returns the version now active. kvstore.ErrNoPrevious at the configured policy.
func (p *policySync) Rollback(ctx context.Context, model string) (plugins.Version, error) {
	p.opMu.Lock()
	defer p.opMu.Unlock()
	st, err := p.fleet().Rollback(ctx, model, "")
	if errors.Is(err, kvstore.ErrNoStack) {
		if err := p.seed(ctx, model); err != nil {
			return "", err
		}
		st, err = p.fleet().Rollback(ctx, model, "")
	}
	if err != nil {
		return "", err
	}
	p.followLocked(model, st)
	return plugins.Version(st[len(st)-1].Version), nil
}

// rolledBackDisabled stores the host's rollback of a version it disabled (a runaway or failing policy):
// the store's stack is popped if it still has v on top, so every gateway follows and v can be unloaded.
func (p *policySync) rolledBackDisabled(ctx context.Context, v plugins.Version, models []string) {
	p.opMu.Lock()
	defer p.opMu.Unlock()
	for _, m := range models {
		st, err := p.fleet().Rollback(ctx, m, string(v))
		switch {
		case err == nil:
			p.followLocked(m, st)
		case errors.Is(err, kvstore.ErrStale):
		default:
			p.g.log.Warn("could not store the rollback of a disabled policy", "model", m, "policy", string(v), "error", err.Error())
		}
	}
}

// Unload removes v from the store (refused while some stack has it active, as the previous entry or as its
// floor), then follows the store and unloads v here.
func (p *policySync) Unload(ctx context.Context, v plugins.Version) error {
	p.opMu.Lock()
	defer p.opMu.Unlock()
	if err := p.fleet().Unload(ctx, string(v)); err != nil {
		return err
	}
	p.forget(string(v))
	p.followStoreLocked(ctx)
	if err := p.g.host.Unload(v); err != nil && !errors.Is(err, plugins.ErrUnknownVersion) {
		p.g.log.Warn("policy removed from the store but still in use here", slog.String("policy", string(v)), slog.String("error", err.Error()))
	}
	return nil
}

// forget drops what policySync remembers about version v (its blob is gone).
func (p *policySync) forget(v string) {
	p.mu.Lock()
	delete(p.stored, v)
	delete(p.failed, v) // a module uploaded again under the same version gets a new try
	delete(p.copy.modules, v)
	p.mu.Unlock()
}

// Fleet returns the fleet's view: each configured model's stack and every live gateway's report, with the
// gateways that do not serve the stack's top and why.
func (p *policySync) Fleet(ctx context.Context) (map[string]admin.FleetModel, error) {
	f, err := p.fleet().ReadFleet(ctx)
	if err != nil {
		return nil, err
	}
	reports, err := p.fleet().ListServing(ctx)
	if err != nil {
		return nil, err
	}
	byGW := map[string]servingReport{}
	for gw, raw := range reports {
		var r servingReport
		if json.Unmarshal(raw, &r) == nil {
			byGW[gw] = r
		}
	}
	// This gateway's own entry is what it serves now, not its last report: a report written by a
	// reconcile pass that ran before an activation or rollback answered here may still be the stored one.
	byGW[p.id] = servingReport{Gateway: p.id, Models: p.serving()}
	gws := make([]string, 0, len(byGW))
	for gw := range byGW {
		gws = append(gws, gw)
	}
	slices.Sort(gws)
	out := map[string]admin.FleetModel{}
	for _, m := range p.g.cfg.Models {
		fm := admin.FleetModel{Stack: []admin.FleetEntry{}, Gateways: map[string]admin.ModelServing{}, Disagree: []admin.Disagreement{}}
		st := f.Stacks[m.Name]
		for _, e := range st {
			fm.Stack = append(fm.Stack, admin.FleetEntry{Version: plugins.Version(e.Version), Config: json.RawMessage(compactJSON(e.Config))})
		}
		if len(st) > 0 {
			fm.Active = plugins.Version(st[len(st)-1].Version)
		}
		for _, gw := range gws {
			ms, ok := byGW[gw].Models[m.Name]
			if !ok {
				continue
			}
			fm.Gateways[gw] = ms
			if ms.Serving != string(fm.Active) || ms.Error != "" {
				why := ms.Error
				if why == "" {
					why = "serves another version than the store's active one"
				}
				fm.Disagree = append(fm.Disagree, admin.Disagreement{Gateway: gw, Serving: ms.Serving, Error: why})
			}
		}
		out[m.Name] = fm
	}
	return out, nil
}

// servingReport is what a gateway publishes about itself (kvstore.Policies.ReportServing).
type servingReport struct {
	Gateway string                        `json:"gateway"`
	Models  map[string]admin.ModelServing `json:"models"`
}

func compactJSON(b []byte) []byte {
	if len(b) == 0 || string(b) == "null" {
		return []byte("{}")
	}
	var out bytes.Buffer
	if json.Compact(&out, b) != nil {
		return []byte("{}")
	}
	return out.Bytes()
}

// start seeds each configured model's stack with the configuration's policy (unless the fleet has one),
// loads the stored modules and follows the store once, before the gateway serves.
func (p *policySync) start(ctx context.Context) error {
	for _, m := range p.g.cfg.Models {
		floor, err := p.g.configPolicy(ctx, m)
		if err != nil {
			return err
		}
		p.mu.Lock()
		p.floors[m.Name] = floor
		p.mu.Unlock()
		// Serve the configured policy until the store says otherwise (also when the store is unreachable).
		if err := p.g.host.Follow(m.Name, p.entry(floor), nil); err != nil {
			return fmt.Errorf("gateway: model %s: policy %s: %w", m.Name, floor.Version, err)
		}
	}
	p.loadAll(ctx)
	p.reconcile(ctx)
	return nil
}

// run follows the store until ctx ends: on every notice and every PolicyReconcileInterval it wakes the
// loader (which compiles new modules in the background) and reconciles.
func (p *policySync) run(ctx context.Context) {
	sub := p.blobs().Subscribe(ctx)
	t := time.NewTicker(PolicyReconcileInterval)
	defer t.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { p.runLoader(ctx) })
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.emptied:
		case _, ok := <-sub:
			if !ok {
				sub = nil
				if ctx.Err() != nil {
					return
				}
				continue
			}
		case <-t.C:
		}
		select {
		case p.kick <- struct{}{}:
		default:
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		p.reconcile(rctx)
		cancel()
		p.rounds.Add(1)
	}
}

// runLoader loads (compiles) every stored module not loaded yet, each time it is woken.
func (p *policySync) runLoader(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		p.loadAll(rctx)
		cancel()
		p.loads.Add(1)
	}
}

func (p *policySync) loaded(v string) bool {
	return p.isBuiltin(v) || slices.ContainsFunc(p.g.host.Versions(), func(i plugins.VersionInfo) bool { return string(i.Version) == v })
}

// ensureLoaded loads version v from the store into the host if it is not loaded yet. A version that failed
// is tried again only after its backoff; until then its recorded cause is returned.
func (p *policySync) ensureLoaded(ctx context.Context, v string) error {
	if p.loaded(v) {
		return nil
	}
	p.mu.Lock()
	if f := p.failed[v]; f != nil && time.Now().Before(f.next) {
		p.mu.Unlock()
		return f.err
	}
	// One load per version at a time: an activation that needs the module the loader is compiling waits for
	// that compilation instead of starting a second one.
	if ch, ok := p.loading[v]; ok {
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		if p.loaded(v) {
			return nil
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if f := p.failed[v]; f != nil {
			return f.err
		}
		return fmt.Errorf("gateway: policy %s not loaded", v)
	}
	ch := make(chan struct{})
	p.loading[v] = ch
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.loading, v)
		p.mu.Unlock()
		close(ch)
	}()
	err := p.load(ctx, v)
	if err != nil && ctx.Err() != nil {
		return err // cancelled: not the module's failure
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		delete(p.failed, v)
		return nil
	}
	f := p.failed[v]
	if f == nil {
		f = &loadFailure{}
		p.failed[v] = f
	}
	f.attempts++
	f.err = err
	f.next = time.Now().Add(min(loadRetryMax, loadRetryMin<<min(f.attempts-1, 10)))
	p.g.log.Warn("stored policy failed to load: retried with backoff", slog.String("policy", v),
		slog.Int("attempts", f.attempts), slog.Time("next_attempt", f.next), slog.String("error", err.Error()))
	return err
}

func (p *policySync) load(ctx context.Context, v string) error {
	sha, data, err := p.blobs().GetBlob(ctx, v)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.copy.modules[v] = kvstore.FleetBlob{Name: v, SHA256: sha, Data: data}
	p.mu.Unlock()
	_, _, err = p.g.host.Load(plugins.Version(v).Name(), data)
	return err
}

// loadAll loads every stored module not loaded yet.
func (p *policySync) loadAll(ctx context.Context) {
	list, err := p.blobs().ListBlobs(ctx)
	if err != nil {
		return
	}
	for _, b := range list {
		if plugins.IsVersion(b.Name) {
			if err := p.ensureLoaded(ctx, b.Name); err != nil && ctx.Err() == nil {
				p.g.log.Debug("stored policy not loaded", slog.String("policy", b.Name), slog.String("error", err.Error()))
			}
		}
	}
}

// reconcile brings this gateway in step with the store: re-seeds an empty store, seeds missing stacks,
// adopts activations written by older gateways, loads what the stacks need, follows them, unloads versions
// whose blob is gone, refreshes the copy and reports what it serves.
func (p *policySync) reconcile(ctx context.Context) {
	p.mu.Lock()
	p.gen++
	gen := p.gen
	p.mu.Unlock()
	f, err := p.fleet().ReadFleet(ctx)
	if err != nil {
		p.report(ctx)
		return
	}
	// A store without a marker but with modules or layout-1 values is not one that lost its state (an older
	// fleet's, or written since): nothing to wait for.
	if f.Epoch == "" && p.reseed(ctx, len(f.Blobs) > 0 || len(f.Legacy) > 0) {
		if f, err = p.fleet().ReadFleet(ctx); err != nil {
			return
		}
	}
	p.mu.Lock()
	lost := f.Epoch == "" && p.copy.epoch != "" // emptied, and the re-seed did not happen: keep what runs
	p.mu.Unlock()
	if lost || f.Epoch == "" { // no marker yet: the configured policies serve (reseed names the epoch)
		p.report(ctx)
		return
	}
	for _, m := range p.g.cfg.Models {
		st, ok := f.Stacks[m.Name]
		floor := p.floors[m.Name]
		if !p.floorSet[m.Name] { // once per start: this gateway's configuration sets the fleet's floor
			if st2, err := p.fleet().SetFloor(ctx, m.Name, floor, p.needBlob(floor.Version)); err == nil {
				p.floorSet[m.Name] = true
				if ok && !st[0].Equal(floor) {
					p.g.log.Warn("the configured policy (rollback floor) of the fleet's history changed to this gateway's",
						"model", m.Name, "was", st[0].Version, "now", floor.Version)
				}
				st, ok = st2, true
			}
		}
		if !ok {
			_, _ = p.fleet().SeedStack(ctx, m.Name, floor, p.needBlob(floor.Version)) // store errors: next pass
			continue
		}
		p.adopt(ctx, m.Name, st, f.Legacy[m.Name])
		// Compile what the stack's top needs before taking the lock (a compile takes up to seconds).
		top := st[len(st)-1].Version
		if err := p.ensureLoaded(ctx, top); err != nil {
			p.setStatus(m.Name, top, err)
		}
	}
	p.opMu.Lock()
	if f2, err := p.fleet().ReadFleet(ctx); err == nil { // again under opMu: no admin answer is undone
		f = f2
	}
	for _, m := range p.g.cfg.Models {
		if st, ok := f.Stacks[m.Name]; ok {
			p.followLocked(m.Name, st)
		}
	}
	p.opMu.Unlock()
	p.unloadGone(f.Blobs, gen)
	p.refreshCopy(ctx, f)
	p.report(ctx)
}

// adopt pushes a layout-1 active value an older gateway wrote (it differs from the stack's top) on the
// stack, once (kvstore/RATIONALE.md, "Fleet state": rolling upgrades).
func (p *policySync) adopt(ctx context.Context, model string, st []kvstore.PolicyEntry, legacy []byte) bool {
	if legacy == nil || bytes.Equal(legacy, kvstore.LegacyActiveValue(st[len(st)-1])) {
		return false
	}
	var av struct {
		Version string          `json:"version"`
		Config  json.RawMessage `json:"config"`
	}
	if json.Unmarshal(legacy, &av) != nil || av.Version == "" {
		return false
	}
	e := kvstore.PolicyEntry{Version: av.Version, Config: compactJSON(av.Config)}
	if e.Equal(st[len(st)-1]) {
		return false // the same activation, spelled differently
	}
	if _, err := p.fleet().Activate(ctx, model, e, kvstore.ActivateOptions{NeedBlob: p.needBlob(e.Version), IfLegacy: legacy}); err != nil {
		if !errors.Is(err, kvstore.ErrStale) {
			p.g.log.Warn("could not adopt an older gateway's activation", "model", model, "policy", e.Version, "error", err.Error())
		}
		return false
	}
	p.g.log.Info("adopted an older gateway's activation into the policy history", "model", model, "policy", e.Version)
	return true
}

// followLocked makes the host follow stack st of model (caller holds opMu) and records the outcome.
func (p *policySync) followLocked(model string, st []kvstore.PolicyEntry) {
	top := st[len(st)-1]
	var warm *plugins.Entry
	if n := len(st); n > 1 && p.loaded(st[n-2].Version) {
		w := p.entry(st[n-2])
		warm = &w
	}
	var err error
	if !p.loaded(top.Version) {
		p.mu.Lock()
		if f := p.failed[top.Version]; f != nil {
			err = f.err
		} else {
			err = errNotLoadedYet
		}
		p.mu.Unlock()
		p.kickLoader()
	} else {
		err = p.g.host.Follow(model, p.entry(top), warm)
	}
	p.setStatus(model, top.Version, err)
}

func (p *policySync) kickLoader() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// followStoreLocked re-reads the store and follows every configured model's stack (caller holds opMu).
func (p *policySync) followStoreLocked(ctx context.Context) {
	f, err := p.fleet().ReadFleet(ctx)
	if err != nil {
		return
	}
	for _, m := range p.g.cfg.Models {
		if st, ok := f.Stacks[m.Name]; ok {
			p.followLocked(m.Name, st)
		}
	}
}

// errNotLoadedYet: the stack's top is still being compiled here (the loader was woken).
var errNotLoadedYet = errors.New("gateway: policy not loaded here yet")

// setStatus records what model should serve here and why it does not (err nil: it does).
func (p *policySync) setStatus(model, want string, err error) {
	ms := admin.ModelServing{Want: want}
	switch {
	case errors.Is(err, errNotLoadedYet):
		ms.Error = "loading " + want + " (not compiled here yet)"
	case err != nil:
		ms.Error = "failed to load " + want + ": " + err.Error()
		p.mu.Lock()
		if f := p.failed[want]; f != nil {
			ms.Attempts = f.attempts
			ms.NextAttempt = f.next.UTC().Format(time.RFC3339Nano)
		}
		p.mu.Unlock()
		if !errors.Is(err, plugins.ErrUnknownVersion) && p.loaded(want) {
			ms.Error = "cannot activate " + want + ": " + err.Error()
		}
	}
	p.mu.Lock()
	p.status[model] = ms
	p.mu.Unlock()
}

// serving returns what this gateway serves per model, and what it should and why not.
func (p *policySync) serving() map[string]admin.ModelServing {
	out := map[string]admin.ModelServing{}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.g.cfg.Models {
		ms := p.status[m.Name]
		v, _ := p.g.host.Active(m.Name)
		ms.Serving = string(v)
		if ms.Want == "" {
			ms.Want = ms.Serving
		}
		out[m.Name] = ms
	}
	return out
}

func (p *policySync) report(ctx context.Context) {
	raw, _ := json.Marshal(servingReport{Gateway: p.id, Models: p.serving()})
	if err := p.fleet().ReportServing(ctx, p.id, raw, servingReportTTL); err != nil && ctx.Err() == nil {
		p.g.log.Debug("could not report the served policies", "error", err.Error())
	}
}

// unloadGone marks the listed versions as stored and unloads the versions seen stored before whose blob is
// no longer listed; gen is the pass's generation, taken before the list was read, so a version stored by an
// upload here while the list was read (marked with a later gen) is not judged by it. A version in use here
// stays (and stays marked), so it is retried at the next reconcile.
func (p *policySync) unloadGone(list []kvstore.BlobInfo, gen uint64) {
	listed := make(map[string]bool, len(list))
	p.mu.Lock()
	for _, b := range list {
		if plugins.IsVersion(b.Name) {
			listed[b.Name] = true
			if _, ok := p.stored[b.Name]; !ok {
				p.stored[b.Name] = gen
			}
		}
	}
	var gone []string
	for v, g := range p.stored {
		if !listed[v] && g < gen {
			gone = append(gone, v)
		}
	}
	for v := range p.failed {
		if !listed[v] {
			delete(p.failed, v)
		}
	}
	p.mu.Unlock()
	slices.Sort(gone)
	for _, v := range gone {
		err := p.g.host.Unload(plugins.Version(v))
		switch {
		case err == nil:
			p.g.log.Info("stored policy removed: unloaded", slog.String("policy", v))
		case errors.Is(err, plugins.ErrUnknownVersion):
		case errors.Is(err, plugins.ErrVersionInUse):
			p.g.log.Debug("stored policy removed but in use here: kept until it is not", slog.String("policy", v),
				slog.String("error", err.Error()))
			continue
		default:
			p.g.log.Warn("stored policy removed: cannot unload it", slog.String("policy", v), slog.String("error", err.Error()))
			continue
		}
		p.forget(v)
	}
}

// refreshCopy updates the read-only copy from a read that carries a marker: its stacks, and the modules
// listed (data this gateway has; a module it never fetched is fetched once).
func (p *policySync) refreshCopy(ctx context.Context, f kvstore.Fleet) {
	if f.Epoch == "" {
		return
	}
	var missing []string
	p.mu.Lock()
	p.copy.epoch = f.Epoch
	p.copy.stacks = f.Stacks
	listed := map[string]bool{}
	for _, b := range f.Blobs {
		listed[b.Name] = true
		if m, ok := p.copy.modules[b.Name]; !ok || m.SHA256 != b.SHA256 {
			missing = append(missing, b.Name)
		}
	}
	for name := range p.copy.modules {
		if !listed[name] {
			delete(p.copy.modules, name)
		}
	}
	p.mu.Unlock()
	for _, name := range missing {
		if sha, data, err := p.blobs().GetBlob(ctx, name); err == nil {
			p.mu.Lock()
			p.copy.modules[name] = kvstore.FleetBlob{Name: name, SHA256: sha, Data: data}
			p.mu.Unlock()
		}
	}
}

// reseed handles a store without a fleet-state marker (fresh, or restarted empty): a gateway holding a copy
// writes it back at once; one that never saw a marker waits reseedGrace (so the gateways with a copy go
// first) unless now is set (an admin operation needs a stack), then names an epoch with the configured
// policies' stacks. The first re-seeder under the new marker wins (one atomic step). It reports whether the
// store changed.
func (p *policySync) reseed(ctx context.Context, now bool) bool {
	p.mu.Lock()
	st := kvstore.FleetState{Stacks: map[string][]kvstore.PolicyEntry{}}
	hasCopy := p.copy.epoch != ""
	if hasCopy {
		for m, s := range p.copy.stacks {
			st.Stacks[m] = s
		}
		for _, m := range p.copy.modules {
			st.Blobs = append(st.Blobs, m)
		}
	} else if !now {
		if p.noMarker.IsZero() {
			p.noMarker = time.Now()
		}
		if time.Since(p.noMarker) < reseedGrace {
			p.mu.Unlock()
			return false
		}
	}
	for m, floor := range p.floors {
		if _, ok := st.Stacks[m]; !ok {
			st.Stacks[m] = []kvstore.PolicyEntry{floor}
		}
	}
	p.mu.Unlock()
	// The run-time endpoints come back in the same step (issue #12 item 3): this gateway's copy, if any.
	st.Endpoints = p.g.epSync.reseedCopy()
	p.mu.Lock()
	epoch := p.epochHint
	p.epochHint = ""
	p.mu.Unlock()
	if epoch == "" && p.g.store != nil && p.g.store.Epoch != nil {
		// The store's own epoch (RedisEpoch: read, or named by the first reader after a loss), so the
		// fleet-state marker names the same epoch whichever path re-seeds first: this read, or the guard's
		// recovery (storeEmptied).
		if e, err := p.g.store.Epoch.Epoch(ctx); err == nil {
			epoch = e
		}
	}
	if epoch == "" {
		var b [12]byte
		_, _ = rand.Read(b[:])
		epoch = hex.EncodeToString(b[:])
	}
	marker, won, err := p.fleet().Reseed(ctx, epoch, st)
	if err != nil {
		p.g.log.Warn("could not re-seed the store's fleet state", "error", err.Error())
		return false
	}
	p.mu.Lock()
	requarantine := hasCopy && p.quarantined != marker
	if requarantine {
		p.quarantined = marker
	}
	p.mu.Unlock()
	if requarantine {
		p.g.requarantineTPUSlices(ctx) // the store lost its TPU slices and leases with the rest
	}
	switch {
	case won && hasCopy:
		p.g.log.Warn("the store had lost its fleet state (restarted empty?): re-seeded it from this gateway's copy",
			"epoch", marker, "modules", len(st.Blobs), "models", len(st.Stacks))
	case won:
		p.g.log.Info("named the store's fleet-state epoch with the configured policies", "epoch", marker)
	}
	return true
}

// storeEmptied is the guard's "the store restarted empty" event (Gateway.storeRestartedEmpty) reaching
// the fleet state: the follower re-reads at once instead of at its next tick, finds no marker and re-seeds
// with epoch (the store's new epoch) as the marker. The read path's own check stays for a store whose
// fleet-state slot emptied without the guard seeing it (a Cluster master of {blobs} restarted alone).
func (p *policySync) storeEmptied(epoch string) {
	p.mu.Lock()
	p.epochHint = epoch
	p.mu.Unlock()
	select {
	case p.emptied <- struct{}{}:
	default:
	}
}

var descServing = prometheus.NewDesc("kvgate_policy_serving",
	"1 for the policy version this gateway serves for each model (its fleet's active one unless /readyz says why not).",
	[]string{"model", "version"}, nil)

// servingCollector exports kvgate_policy_serving from the host's active pointers.
type servingCollector struct{ p *policySync }

// Describe implements prometheus.Collector.
func (c servingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descServing }

// Collect implements prometheus.Collector.
func (c servingCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.p.g.cfg.Models {
		v, _ := c.p.g.host.Active(m.Name)
		ch <- prometheus.MustNewConstMetric(descServing, prometheus.GaugeValue, 1, m.Name, string(v))
	}
}
