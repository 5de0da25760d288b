package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/plugins"
)

// PolicyReconcileInterval is how often a gateway re-reads the store's policies besides reacting to change
// notifications (which a disconnected subscriber misses).
const PolicyReconcileInterval = 500 * time.Millisecond

// activeValue is a model's active policy as stored (kvstore.Blobs SetActive): the same on every gateway.
type activeValue struct {
	Version string          `json:"version"`
	Config  json.RawMessage `json:"config"`
}

// policySync keeps the local policy host in step with the store: uploads are stored as blobs named by their
// version (name@sha256), activations and rollbacks as the model's active value; every gateway applies what
// the store holds on notifications and every PolicyReconcileInterval. It implements admin.Sync.
//
// Unloading (admin DELETE) removes the version's blob; every gateway unloads a version it has seen stored
// once its blob is gone (on a notice or the next reconcile). A version still in use here (active, or kept
// warm for a rollback) stays until it no longer is and is retried at every reconcile. Only versions seen in
// the store are unloaded that way: a module just loaded by an upload here, whose blob is not written yet, is
// left alone.
//
// Compiling a module (the Go-built default is ~2.6 MB: 0.16–4.7 s on a loaded 2-core machine) runs in its own
// goroutine, started by the blob's notice, so applying an active value never waits behind the compilation of
// another module: an activation of an already-compiled version swaps within one notice.
type policySync struct {
	g       *Gateway
	mu      sync.Mutex
	applied map[string][]byte        // model → last active value applied
	failed  map[string]bool          // blob versions that failed to load here (not retried)
	loading map[string]chan struct{} // blob versions being loaded, closed when done
	stored  map[string]uint64        // versions seen in the store → gen when first seen; unloaded once gone
	gen     uint64                   // counts loadAll passes and stores, so a list is never older than a mark it judges
	kick    chan struct{}            // wakes the loader
}

func newPolicySync(g *Gateway) *policySync {
	return &policySync{g: g, applied: map[string][]byte{}, failed: map[string]bool{},
		loading: map[string]chan struct{}{}, stored: map[string]uint64{}, kick: make(chan struct{}, 1)}
}

func (p *policySync) blobs() kvstore.Blobs { return p.g.store.Blobs }

// PolicyLoaded stores an accepted module under its version.
func (p *policySync) PolicyLoaded(ctx context.Context, name string, wasm []byte) error {
	sum := sha256.Sum256(wasm)
	sha := hex.EncodeToString(sum[:])
	if err := p.blobs().PutBlob(ctx, name+"@"+sha, sha, wasm); err != nil {
		return err
	}
	p.mu.Lock()
	p.gen++
	p.stored[name+"@"+sha] = p.gen // newer than any list being read now: that list cannot unload it
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
		if strings.Contains(b.Name, "@") {
			out = append(out, plugins.Version(b.Name))
		}
	}
	return out, nil
}

// StoredActiveFor returns the models, sorted, whose stored active value names v.
func (p *policySync) StoredActiveFor(ctx context.Context, v plugins.Version) ([]string, error) {
	all, err := p.blobs().ListActive(ctx)
	if err != nil {
		return nil, err
	}
	var models []string
	for model, raw := range all {
		var av activeValue
		if json.Unmarshal(raw, &av) == nil && av.Version == string(v) {
			models = append(models, model)
		}
	}
	slices.Sort(models)
	return models, nil
}

// PolicyUnloaded deletes v's blob (the other gateways unload v when they see it gone), then unloads v here
// again in case the loader brought it back from the blob between the admin API's unload and the deletion.
func (p *policySync) PolicyUnloaded(ctx context.Context, v plugins.Version) error {
	if err := p.blobs().DeleteBlob(ctx, string(v)); err != nil && !errors.Is(err, kvstore.ErrNotFound) {
		return err
	}
	p.forget(string(v))
	if err := p.g.host.Unload(v); err != nil && !errors.Is(err, plugins.ErrUnknownVersion) {
		p.g.log.Warn("policy reloaded while it was unloaded", slog.String("policy", string(v)), slog.String("error", err.Error()))
	}
	return nil
}

// forget drops what policySync remembers about version v (its blob is gone).
func (p *policySync) forget(v string) {
	p.mu.Lock()
	delete(p.stored, v)
	delete(p.failed, v) // a module uploaded again under the same version gets a new try
	p.mu.Unlock()
}

// PolicyActivated stores model's active version and config.
func (p *policySync) PolicyActivated(ctx context.Context, model string, v plugins.Version, cfg []byte) error {
	val, err := json.Marshal(activeValue{Version: string(v), Config: json.RawMessage(compactJSON(cfg))})
	if err != nil {
		return err
	}
	if err := p.blobs().SetActive(ctx, model, val); err != nil {
		return err
	}
	p.mu.Lock()
	p.applied[model] = val
	p.mu.Unlock()
	return nil
}

// PolicyRolledBack stores what the local rollback made active, so every gateway converges on it.
func (p *policySync) PolicyRolledBack(ctx context.Context, model string) error {
	v, cfg := p.g.host.Active(model)
	return p.PolicyActivated(ctx, model, v, cfg)
}

func compactJSON(b []byte) []byte {
	if len(b) == 0 {
		return []byte("{}")
	}
	var out bytes.Buffer
	if json.Compact(&out, b) != nil {
		return []byte("{}")
	}
	return out.Bytes()
}

// run follows the store until ctx ends: on every notice and every PolicyReconcileInterval it wakes the
// loader (which compiles new modules in the background) and applies the active values.
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
		p.applyActive(rctx)
		cancel()
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
	}
}

// ensureLoaded loads version v from the store into the host if it is not loaded yet.
func (p *policySync) ensureLoaded(ctx context.Context, v string) error {
	if plugins.Version(v) == p.g.host.BuiltinVersion() || slices.ContainsFunc(p.g.host.Versions(),
		func(i plugins.VersionInfo) bool { return string(i.Version) == v }) {
		return nil
	}
	p.mu.Lock()
	bad := p.failed[v]
	p.mu.Unlock()
	if bad {
		return errors.New("failed to load earlier")
	}
	// One load per version at a time: an activation that needs the module the loader is compiling waits for
	// that compilation instead of starting a second one.
	p.mu.Lock()
	if ch, ok := p.loading[v]; ok {
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		return p.ensureLoaded(ctx, v)
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
	_, data, err := p.blobs().GetBlob(ctx, v)
	if err != nil {
		return err
	}
	name, _, _ := strings.Cut(v, "@")
	if _, _, err := p.g.host.Load(name, data); err != nil {
		p.mu.Lock()
		p.failed[v] = true
		p.mu.Unlock()
		return err
	}
	return nil
}

// reconcile applies the store's state: loads every stored module not loaded yet (so an activation that
// follows needs no compile), then each model's active value. At start; afterwards run splits the two.
func (p *policySync) reconcile(ctx context.Context) {
	p.loadAll(ctx)
	p.applyActive(ctx)
}

// loadAll unloads the versions whose blob is gone and loads every stored module not loaded yet.
func (p *policySync) loadAll(ctx context.Context) {
	p.mu.Lock()
	p.gen++
	gen := p.gen
	p.mu.Unlock()
	if list, err := p.blobs().ListBlobs(ctx); err == nil {
		p.unloadGone(list, gen)
		for _, b := range list {
			if strings.Contains(b.Name, "@") {
				if err := p.ensureLoaded(ctx, b.Name); err != nil && ctx.Err() == nil {
					p.g.log.Debug("stored policy not loaded", slog.String("policy", b.Name), slog.String("error", err.Error()))
				}
			}
		}
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
		if strings.Contains(b.Name, "@") {
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
		p.mu.Lock()
		delete(p.stored, v)
		p.mu.Unlock()
	}
}

// applyActive applies each model's active value from the store (loading its module first if needed).
func (p *policySync) applyActive(ctx context.Context) {
	for _, m := range p.g.cfg.Models {
		raw, err := p.blobs().GetActive(ctx, m.Name)
		if err != nil {
			continue // ErrNotFound: the config's policy stays; store errors: retried next tick
		}
		p.mu.Lock()
		same := bytes.Equal(p.applied[m.Name], raw)
		p.mu.Unlock()
		if same {
			continue
		}
		var av activeValue
		if err := json.Unmarshal(raw, &av); err != nil {
			p.g.log.Warn("bad active policy value in store", slog.String("model", m.Name), slog.String("error", err.Error()))
			continue
		}
		cfg := compactJSON(av.Config)
		curV, curCfg := p.g.host.Active(m.Name)
		if string(curV) != av.Version || !bytes.Equal(compactJSON(curCfg), cfg) {
			if err := p.ensureLoaded(ctx, av.Version); err != nil {
				p.g.log.Warn("cannot load the stored active policy", slog.String("model", m.Name),
					slog.String("policy", av.Version), slog.String("error", err.Error()))
				continue
			}
			if err := p.g.host.Activate(m.Name, plugins.Version(av.Version), cfg); err != nil {
				p.g.log.Warn("cannot activate the stored active policy", slog.String("model", m.Name),
					slog.String("policy", av.Version), slog.String("error", err.Error()))
				continue
			}
		}
		p.mu.Lock()
		p.applied[m.Name] = raw
		p.mu.Unlock()
	}
}
