package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/gateway/internal/admin"
	"github.com/kvgate/kvgate/gateway/internal/endpoints"
	"github.com/kvgate/kvgate/gateway/internal/route"
	"github.com/kvgate/kvgate/kvstore"
)

// EndpointReconcileInterval is how often a gateway re-reads the store's endpoint set besides reacting to
// change notifications, and checks its draining endpoints.
const EndpointReconcileInterval = 500 * time.Millisecond

// drainSettle is how long a draining endpoint must have been out of routing (here, and by its drain
// start, on the fleet) before "no lease left" counts as drained: a request planned just before the
// change may still take a lease on it, and every gateway must have seen the change.
const drainSettle = 3 * EndpointReconcileInterval

// Record sources (kvstore.EndpointRecord.Source).
const (
	sourceConfig   = "config"
	sourceAdmin    = "admin"
	sourceSimulate = "simulate"
	sourceDNSPre   = "dns:"
)

// endpointSync makes this gateway run the store's endpoint set (kvstore.Endpoints, the one truth): an
// active record is probed, scraped, ingested (under the ingestion lease) and routed; a draining one is no
// longer routed, and once no lease on it is left anywhere (the store's in-flight count) its ingestion
// stops, its index entries are dropped and the record becomes drained, or goes when it was removed. It
// writes the config file's changes, the admin API's and DNS discovery's to the store, each as one write
// conditional on the revision it read, and keeps a read-only copy of the set for the re-seed after an empty
// restart (policySync.reseed). It implements admin.EndpointOps.
type endpointSync struct {
	g *Gateway

	opMu sync.Mutex // one apply at a time (reconcile, and each write's follow-up)

	mu      sync.Mutex
	running map[string]*runEP // what runs here, by endpoint ID
	notHere map[string]string // records this gateway cannot run, and why (unknown model, bad spec)
	copy    []kvstore.EndpointRecord
	hasCopy bool
	last    kvstore.EndpointSet
	// file is the config file's endpoints as last read (by ID); fileSource says which records are the
	// file's ("config") and which came with the start only ("simulate").
	file      map[string]fileEP
	reloadErr string
	// finished are the drains this gateway completed (ID → the record's DrainSince): a record still
	// draining in the store (its write pending) is not started again.
	finished map[string]int64
	kick     chan struct{}
}

type fileEP struct {
	model string
	ep    config.Endpoint
}

// runEP is one endpoint this gateway runs.
type runEP struct {
	model    config.Model
	ep       config.Endpoint
	state    string // the record's state as applied
	drainAt  time.Time
	stop     context.CancelFunc // ends its ingestion (nil without kv_events)
	ingested chan struct{}      // closed when its ingestion goroutine returned
}

func newEndpointSync(g *Gateway) *endpointSync {
	return &endpointSync{g: g, running: map[string]*runEP{}, notHere: map[string]string{}, finished: map[string]int64{},
		kick: make(chan struct{}, 1)}
}

func (s *endpointSync) store() kvstore.Endpoints { return s.g.store.Endpoints }

// identity is what makes a changed endpoint another engine: its index entries and ingestion start over.
func identity(e config.Endpoint) string {
	return fmt.Sprintf("%s|%s|%s|%s|%d", e.Engine, e.URL, e.KVEvents, e.KVReplay, e.Ranks())
}

func routeEndpoints(e config.Endpoint) []route.Endpoint {
	return route.Ranked(route.Endpoint{ID: e.ID, Engine: e.Engine, URL: e.URL,
		Limits: kvstore.Limits{MaxRequests: e.MaxInflightRequests, MaxTokens: e.MaxInflightTokens},
		Events: e.KVEvents != ""}, e.Ranks())
}

func (s *endpointSync) model(name string) (config.Model, bool) {
	for _, m := range s.g.cfg.Models {
		if m.Name == name {
			return m, true
		}
	}
	return config.Model{}, false
}

// startConfigured registers the configuration's endpoints (already in the endpoint set and the routing
// lists) as running, starts their ingestion, and remembers the file's endpoints (file: the file's own
// parse; nil: every configured endpoint is the file's).
func (s *endpointSync) startConfigured(file *config.Config) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.file = map[string]fileEP{}
	src := s.g.cfg
	if file != nil {
		src = file
	}
	for _, m := range src.Models {
		for _, e := range m.Endpoints {
			s.file[e.ID] = fileEP{model: m.Name, ep: e}
		}
	}
	for _, m := range s.g.cfg.Models {
		for _, e := range m.Endpoints {
			r := &runEP{model: m, ep: e, state: kvstore.EndpointActive}
			s.running[e.ID] = r
			s.startIngestLocked(r)
		}
	}
}

// configRecords are the records this gateway seeds a store without an endpoint set with: its
// configuration's endpoints.
func (s *endpointSync) configRecords() []kvstore.EndpointRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []kvstore.EndpointRecord
	for _, m := range s.g.cfg.Models {
		for _, e := range m.Endpoints {
			src := sourceConfig
			if _, ok := s.file[e.ID]; !ok {
				src = sourceSimulate
			}
			out = append(out, kvstore.EndpointRecord{ID: e.ID, Model: m.Name, Spec: config.EndpointJSON(e),
				State: kvstore.EndpointActive, Source: src})
		}
	}
	return out
}

// reseedCopy is the endpoint set to write back when the store lost its fleet state (nil: this gateway
// never read one).
func (s *endpointSync) reseedCopy() []kvstore.EndpointRecord {
	if s == nil { // the policy re-seed ran before the endpoint follower started
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.hasCopy {
		return nil
	}
	return slices.Clone(s.copy)
}

// run follows the store until ctx ends (notifications and every EndpointReconcileInterval).
func (s *endpointSync) run(ctx context.Context) {
	sub := s.g.store.Blobs.Subscribe(ctx)
	t := time.NewTicker(EndpointReconcileInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-sub:
			if !ok {
				sub = nil
				if ctx.Err() != nil {
					return
				}
				continue
			}
			if m != "endpoints" && m != "fleet:reseeded" {
				continue
			}
		case <-s.kick:
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		s.reconcile(rctx)
		cancel()
	}
}

// read returns the store's endpoint set, seeded: a store without a fleet-state marker is given one first
// when now is set (policySync.reseed; else ok=false: wait for the re-seed, keep what runs), and an unseeded
// set is seeded with this gateway's copy, else its configuration (the first seeder wins).
func (s *endpointSync) read(ctx context.Context, now bool) (kvstore.EndpointSet, bool, error) {
	set, err := s.store().ReadEndpoints(ctx)
	if err != nil {
		return set, false, err
	}
	if set.Marker == "" {
		if !now {
			return set, false, nil
		}
		s.g.policySync.reseed(ctx, true)
		if set, err = s.store().ReadEndpoints(ctx); err != nil {
			return set, false, err
		}
		if set.Marker == "" {
			return set, false, errors.New("gateway: the store has no fleet-state marker yet")
		}
	}
	if set.Rev == 0 {
		recs := s.reseedCopy()
		why := "this gateway's copy"
		if recs == nil {
			recs, why = s.configRecords(), "this gateway's configuration"
		}
		var won bool
		if set, won, err = s.store().SeedEndpoints(ctx, recs); err != nil {
			return set, false, err
		}
		if won {
			s.g.log.Info("seeded the fleet's endpoint set", slog.String("from", why), slog.Int("endpoints", len(recs)))
		}
	}
	return set, true, nil
}

// reconcile reads the store and runs what it says; then finishes the drains that are due.
func (s *endpointSync) reconcile(ctx context.Context) {
	set, ok, err := s.read(ctx, false)
	if err != nil || !ok {
		return
	}
	s.apply(set)
	s.finishDrains(ctx, set)
}

// apply makes this gateway run set.
func (s *endpointSync) apply(set kvstore.EndpointSet) {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	s.mu.Lock()
	if set.Rev < s.last.Rev && set.Marker == s.last.Marker {
		s.mu.Unlock()
		return // an older read than one already applied
	}
	s.last, s.copy, s.hasCopy = set, set.Records, true
	notHere := map[string]string{}
	seen := map[string]bool{}
	var stops []*runEP
	changed := false
	for _, rec := range set.Records {
		seen[rec.ID] = true
		cur := s.running[rec.ID]
		if since, ok := s.finished[rec.ID]; ok && (rec.State != kvstore.EndpointDraining || rec.DrainSince != since) {
			delete(s.finished, rec.ID)
		}
		if _, done := s.finished[rec.ID]; rec.State == kvstore.EndpointDrained || done {
			if cur != nil {
				stops = append(stops, cur)
				delete(s.running, rec.ID)
				changed = true
			}
			continue
		}
		m, ok := s.model(rec.Model)
		if !ok {
			notHere[rec.ID] = fmt.Sprintf("model %q is not in this gateway's configuration", rec.Model)
			continue
		}
		e, err := config.ParseEndpoint(rec.Spec)
		if err == nil && e.ID != rec.ID {
			err = fmt.Errorf("spec names endpoint %q", e.ID)
		}
		if err != nil {
			notHere[rec.ID] = "invalid endpoint: " + err.Error()
			continue
		}
		if cur != nil && (identity(cur.ep) != identity(e) || cur.model.Name != m.Name) {
			s.g.log.Info("endpoint changed engine: its ingestion and index entries start over", slog.String("endpoint_id", e.ID),
				slog.String("url", e.URL))
			stops = append(stops, cur)
			delete(s.running, rec.ID)
			cur = nil
		}
		if cur == nil {
			cur = &runEP{model: m, ep: e, state: rec.State}
			s.running[rec.ID] = cur
			s.g.eps.Add(endpoints.Endpoint{ID: e.ID, Model: m.Name, Engine: e.Engine, URL: e.URL, DataParallelSize: e.Ranks()})
			s.g.tokens.setMode(e)
			s.startIngestLocked(cur)
			changed = true
			s.g.log.Info("endpoint added", slog.String("endpoint_id", e.ID), slog.String("model", m.Name),
				slog.String("url", e.URL), slog.String("state", rec.State), slog.String("source", rec.Source))
		} else if !bytes.Equal(config.EndpointJSON(cur.ep), config.EndpointJSON(e)) {
			cur.ep = e
			s.g.tokens.setMode(e)
			changed = true
		}
		if cur.state != rec.State {
			if rec.State == kvstore.EndpointDraining {
				cur.drainAt = time.Now()
				s.g.log.Info("endpoint draining: no new requests", slog.String("endpoint_id", e.ID), slog.Bool("remove", rec.Remove))
			} else {
				s.g.log.Info("endpoint active again", slog.String("endpoint_id", e.ID))
			}
			cur.state = rec.State
			changed = true
		}
	}
	for id := range s.finished {
		if !seen[id] {
			delete(s.finished, id)
		}
	}
	for id, r := range s.running {
		if !seen[id] {
			stops = append(stops, r)
			delete(s.running, id)
			changed = true
		}
	}
	s.notHere = notHere
	if changed {
		s.publishRoutesLocked()
	}
	s.mu.Unlock()
	for _, r := range stops {
		s.stopLocal(r)
	}
}

// publishRoutesLocked gives every model its routing list: its active endpoints (caller holds s.mu).
func (s *endpointSync) publishRoutesLocked() {
	ids := make([]string, 0, len(s.running))
	for id := range s.running {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, m := range s.g.cfg.Models {
		sm, ok := s.g.models[m.Name]
		if !ok || sm.Model.Live == nil {
			continue
		}
		var list []route.Endpoint
		for _, id := range ids {
			if r := s.running[id]; r.model.Name == m.Name && r.state == kvstore.EndpointActive {
				list = append(list, routeEndpoints(r.ep)...)
			}
		}
		sm.Model.Live.Store(list)
	}
}

// startIngestLocked starts r's KV-event ingestion (under the store lease), if it has kv_events.
func (s *endpointSync) startIngestLocked(r *runEP) {
	if r.ep.KVEvents == "" || s.g.ingCtx == nil {
		return
	}
	ctx, cancel := context.WithCancel(s.g.ingCtx) // drain's handOverIngestion ends it too
	done := make(chan struct{})
	r.stop, r.ingested = cancel, done
	m, e := r.model, r.ep
	s.g.ingWG.Go(func() {
		defer close(done)
		s.g.runIngestion(ctx, m, e)
	})
}

// stopLocal ends what this gateway runs of r: probes, ingestion (its lease released), token-ID mode; then
// drops r's index entries (each data-parallel rank's), after this gateway's own ingestion of it ended.
func (s *endpointSync) stopLocal(r *runEP) {
	s.g.eps.Remove(r.ep.ID)
	m := s.g.metrics // the scraped-state gauges would keep the last value of an endpoint no longer probed
	for _, v := range []*prometheus.GaugeVec{m.EndpointWaiting, m.EndpointRunning, m.EndpointKVCacheUsage, m.EndpointHealthy, m.Front.EndpointEjected} {
		v.DeleteLabelValues(r.ep.ID)
	}
	if r.stop != nil {
		r.stop()
		select {
		case <-r.ingested:
		case <-time.After(5 * time.Second):
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, id := range route.RankIDs(r.ep.ID, r.ep.Ranks()) {
		if err := s.g.index.ClearEndpoint(ctx, r.model.Name, id); err != nil {
			s.g.log.Warn("could not drop a removed endpoint's index entries", slog.String("endpoint_id", string(id)),
				slog.String("error", err.Error()))
		}
	}
	s.g.log.Info("endpoint stopped: probes, KV-event ingestion and index entries dropped", slog.String("endpoint_id", r.ep.ID))
}

// finishDrains completes every draining record whose leases have all ended (the store's in-flight count,
// every gateway's) at least drainSettle after it left routing, or whose drain timed out: this gateway
// stops it, and writes it drained (or deletes a removal's record).
func (s *endpointSync) finishDrains(ctx context.Context, set kvstore.EndpointSet) {
	now := time.Now()
	for _, rec := range set.Records {
		if rec.State != kvstore.EndpointDraining {
			continue
		}
		since := time.UnixMilli(rec.DrainSince)
		s.mu.Lock()
		r := s.running[rec.ID]
		if r != nil && r.drainAt.After(since) {
			since = r.drainAt
		}
		ranks := 1
		if r != nil {
			ranks = r.ep.Ranks()
		} else if e, err := config.ParseEndpoint(rec.Spec); err == nil {
			ranks = e.Ranks()
		}
		s.mu.Unlock()
		timedOut := rec.DrainSince > 0 && now.Sub(time.UnixMilli(rec.DrainSince)) > s.g.cfg.EndpointDrainTimeout
		if !timedOut {
			if now.Sub(since) < drainSettle {
				continue
			}
			ids := route.RankIDs(rec.ID, ranks)
			infl, err := s.g.res.InFlight(ctx, ids)
			if err != nil {
				continue
			}
			busy := false
			for _, id := range ids {
				busy = busy || infl[id].Requests > 0
			}
			if busy {
				continue
			}
		}
		s.mu.Lock()
		s.finished[rec.ID] = rec.DrainSince
		if r != nil && s.running[rec.ID] == r {
			delete(s.running, rec.ID)
			s.publishRoutesLocked()
		} else {
			r = nil
		}
		s.mu.Unlock()
		if r != nil {
			s.stopLocal(r)
		}
		_, err := s.change(ctx, false, func(cur kvstore.EndpointSet) ([]kvstore.EndpointRecord, []string, error) {
			c, ok := cur.Get(rec.ID)
			if !ok || c.State != kvstore.EndpointDraining || c.DrainSince != rec.DrainSince {
				return nil, nil, nil // finished by another gateway, or changed since
			}
			if c.Remove {
				return nil, []string{c.ID}, nil
			}
			c.State, c.DrainSince = kvstore.EndpointDrained, 0
			return []kvstore.EndpointRecord{c}, nil, nil
		})
		if err == nil {
			s.g.log.Info("endpoint drained", slog.String("endpoint_id", rec.ID), slog.Bool("removed", rec.Remove),
				slog.Bool("timed_out", timedOut), slog.Float64("drain_seconds", now.Sub(time.UnixMilli(rec.DrainSince)).Seconds()))
		}
	}
}

// change applies fn's edit of the store's endpoint set as one write conditional on the revision fn saw,
// re-reading and re-computing on a conflict, then follows the result here. fn returns nothing to write
// when the set already says what it wants. now: name the fleet-state epoch if the store has none (an
// operator's request), instead of waiting for the re-seed.
func (s *endpointSync) change(ctx context.Context, now bool,
	fn func(kvstore.EndpointSet) (put []kvstore.EndpointRecord, del []string, err error)) (kvstore.EndpointSet, error) {
	for attempt := 0; ; attempt++ {
		set, ok, err := s.read(ctx, now)
		if err != nil {
			return set, err
		}
		if !ok {
			return set, errors.New("gateway: the store lost its fleet state and is not re-seeded yet")
		}
		put, del, err := fn(set)
		if err != nil {
			return set, err
		}
		if len(put) == 0 && len(del) == 0 {
			s.apply(set)
			return set, nil
		}
		nset, err := s.store().WriteEndpoints(ctx, set.Rev, put, del)
		if errors.Is(err, kvstore.ErrStale) && attempt < 20 && ctx.Err() == nil {
			continue
		}
		if err != nil {
			return set, err
		}
		s.apply(nset)
		return nset, nil
	}
}

// drainRecord returns r set draining since now (remove: its record goes once drained).
func drainRecord(r kvstore.EndpointRecord, remove bool) kvstore.EndpointRecord {
	if r.State != kvstore.EndpointDraining {
		r.DrainSince = time.Now().UnixMilli()
	}
	r.State = kvstore.EndpointDraining
	r.Remove = r.Remove || remove
	return r
}

// applyFile writes the difference between the file's endpoints as last read (old) and now (nw) to the
// store: added and changed endpoints are put (active), removed ones drain and go. Records the store holds
// for another reason (the admin API, DNS) are not touched, nor those the old and new file agree on, so a
// reload never undoes an operator's change it did not make itself.
func (s *endpointSync) applyFile(ctx context.Context, old, nw map[string]fileEP) error {
	_, err := s.change(ctx, true, func(set kvstore.EndpointSet) ([]kvstore.EndpointRecord, []string, error) {
		var put []kvstore.EndpointRecord
		for id, f := range nw {
			o, had := old[id]
			if had && o.model == f.model && bytes.Equal(config.EndpointJSON(o.ep), config.EndpointJSON(f.ep)) {
				continue
			}
			spec := config.EndpointJSON(f.ep)
			if c, ok := set.Get(id); ok && c.Model == f.model && c.State == kvstore.EndpointActive && bytes.Equal(c.Spec, spec) {
				continue
			}
			put = append(put, kvstore.EndpointRecord{ID: id, Model: f.model, Spec: spec, State: kvstore.EndpointActive, Source: sourceConfig})
		}
		for id := range old {
			if _, still := nw[id]; still {
				continue
			}
			if c, ok := set.Get(id); ok && !(c.State == kvstore.EndpointDraining && c.Remove) {
				put = append(put, drainRecord(c, true))
			}
		}
		return put, nil, nil
	})
	return err
}

// Reload re-reads the config file and writes its endpoint changes to the store (SIGHUP, the file watcher).
// Keys other than the endpoints need a restart.
func (g *Gateway) Reload(ctx context.Context) error {
	if g.configPath == "" {
		return errors.New("gateway: no config file to reload")
	}
	return g.epSync.reloadFile(ctx, g.configPath)
}

func (s *endpointSync) reloadFile(ctx context.Context, path string) error {
	cfg, err := config.Load(path)
	s.mu.Lock()
	if err != nil {
		s.reloadErr = err.Error()
		s.mu.Unlock()
		s.g.log.Error("config reload failed: the endpoints stay as they are", slog.String("error", err.Error()))
		return err
	}
	old := s.file
	s.mu.Unlock()
	nw := map[string]fileEP{}
	for _, m := range cfg.Models {
		if _, ok := s.model(m.Name); !ok {
			s.g.log.Warn("config reload: a model added to the file needs a restart; its endpoints are ignored", slog.String("model", m.Name))
			continue
		}
		for _, e := range m.Endpoints {
			nw[e.ID] = fileEP{model: m.Name, ep: e}
		}
	}
	if err := s.applyFile(ctx, old, nw); err != nil {
		s.mu.Lock()
		s.reloadErr = "writing the endpoints to the store: " + err.Error()
		s.mu.Unlock()
		s.g.log.Error("config reload: the store did not take the endpoint changes", slog.String("error", err.Error()))
		return err
	}
	s.mu.Lock()
	s.file, s.reloadErr = nw, ""
	s.mu.Unlock()
	s.g.log.Info("config reloaded: endpoint changes written to the store", slog.Int("endpoints_in_file", len(nw)))
	return nil
}

// mismatch lists how the config file disagrees with the store's set (sorted; empty: it agrees).
func (s *endpointSync) mismatch() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []string{}
	if s.last.Rev == 0 {
		return out
	}
	for id, f := range s.file {
		c, ok := s.last.Get(id)
		switch {
		case !ok:
			out = append(out, id+": in this gateway's config file, not in the store")
		case c.State != kvstore.EndpointActive:
			out = append(out, id+": in this gateway's config file, "+c.State+" in the store")
		case c.Model != f.model || !bytes.Equal(c.Spec, config.EndpointJSON(f.ep)):
			out = append(out, id+": configured differently in the store ("+string(c.Spec)+")")
		}
	}
	for _, c := range s.last.Records {
		if _, ok := s.file[c.ID]; !ok && c.Source == sourceConfig && c.State == kvstore.EndpointActive {
			out = append(out, c.ID+": in the store (from a config file), not in this gateway's")
		}
	}
	slices.Sort(out)
	return out
}

// ready is the /readyz "endpoints" detail.
func (s *endpointSync) ready() map[string]any {
	mm := s.mismatch()
	s.mu.Lock()
	defer s.mu.Unlock()
	d := map[string]any{"revision": s.last.Rev, "config_mismatch": mm}
	if s.reloadErr != "" {
		d["reload_error"] = s.reloadErr
	}
	if len(s.notHere) > 0 {
		d["not_running_here"] = s.notHere
	}
	var draining []string
	for id, r := range s.running {
		if r.state == kvstore.EndpointDraining {
			draining = append(draining, id)
		}
	}
	slices.Sort(draining)
	if draining != nil {
		d["draining"] = draining
	}
	return d
}

// The admin API (admin.EndpointOps).

func (s *endpointSync) view(rec kvstore.EndpointRecord) admin.EndpointView {
	v := admin.EndpointView{ID: rec.ID, Model: rec.Model, Endpoint: json.RawMessage(rec.Spec), State: rec.State,
		Removing: rec.Remove && rec.State == kvstore.EndpointDraining, Source: rec.Source}
	if rec.DrainSince > 0 && rec.State == kvstore.EndpointDraining {
		v.DrainSince = time.UnixMilli(rec.DrainSince).UTC().Format(time.RFC3339Nano)
	}
	s.mu.Lock()
	r, running := s.running[rec.ID]
	routed := running && r.state == kvstore.EndpointActive // apply writes r.state under s.mu
	why := s.notHere[rec.ID]
	s.mu.Unlock()
	here := &admin.EndpointHere{Error: why}
	if running {
		here.Healthy = s.g.eps.Load(rec.ID).Healthy
		here.Routed = routed
		s.g.ingMu.Lock()
		_, here.Ingesting = s.g.ingesters[rec.ID]
		s.g.ingMu.Unlock()
	}
	v.Here = here
	return v
}

// ListEndpoints implements admin.EndpointOps.
func (s *endpointSync) ListEndpoints(ctx context.Context) (admin.EndpointList, error) {
	set, ok, err := s.read(ctx, false)
	if err != nil {
		return admin.EndpointList{}, err
	}
	if ok {
		s.apply(set)
	}
	l := admin.EndpointList{Revision: set.Rev, Endpoints: []admin.EndpointView{}, ConfigMismatch: s.mismatch()}
	for _, r := range set.Records {
		l.Endpoints = append(l.Endpoints, s.view(r))
	}
	return l, nil
}

// PutEndpoint implements admin.EndpointOps.
func (s *endpointSync) PutEndpoint(ctx context.Context, model string, e config.Endpoint) (admin.EndpointView, bool, error) {
	if _, ok := s.model(model); !ok {
		return admin.EndpointView{}, false, fmt.Errorf("%w: %q", admin.ErrUnknownModel, model)
	}
	created := false
	spec := config.EndpointJSON(e)
	set, err := s.change(ctx, true, func(set kvstore.EndpointSet) ([]kvstore.EndpointRecord, []string, error) {
		c, ok := set.Get(e.ID)
		created = !ok
		if ok && c.Model != model {
			return nil, nil, fmt.Errorf("%w: endpoint %s serves model %s", admin.ErrEndpointConflict, e.ID, c.Model)
		}
		if ok && c.State == kvstore.EndpointActive && bytes.Equal(c.Spec, spec) {
			return nil, nil, nil
		}
		src := sourceAdmin
		if ok && c.Source != "" {
			src = c.Source
		}
		return []kvstore.EndpointRecord{{ID: e.ID, Model: model, Spec: spec, State: kvstore.EndpointActive, Source: src}}, nil, nil
	})
	if err != nil {
		return admin.EndpointView{}, false, err
	}
	rec, _ := set.Get(e.ID)
	return s.view(rec), created, nil
}

func (s *endpointSync) drain(ctx context.Context, id string, remove bool) (admin.EndpointView, error) {
	set, err := s.change(ctx, true, func(set kvstore.EndpointSet) ([]kvstore.EndpointRecord, []string, error) {
		c, ok := set.Get(id)
		if !ok {
			return nil, nil, fmt.Errorf("%w: %q", admin.ErrEndpointNotFound, id)
		}
		switch {
		case c.State == kvstore.EndpointDrained && remove:
			return nil, []string{id}, nil // nothing left to drain
		case c.State == kvstore.EndpointDrained, c.State == kvstore.EndpointDraining && (c.Remove || !remove):
			return nil, nil, nil
		}
		return []kvstore.EndpointRecord{drainRecord(c, remove)}, nil, nil
	})
	if err != nil {
		return admin.EndpointView{}, err
	}
	rec, ok := set.Get(id)
	if !ok { // a drained endpoint's record, deleted at once
		return admin.EndpointView{ID: id, State: kvstore.EndpointDrained}, nil
	}
	return s.view(rec), nil
}

// DrainEndpoint implements admin.EndpointOps.
func (s *endpointSync) DrainEndpoint(ctx context.Context, id string) (admin.EndpointView, error) {
	return s.drain(ctx, id, false)
}

// DeleteEndpoint implements admin.EndpointOps.
func (s *endpointSync) DeleteEndpoint(ctx context.Context, id string) (admin.EndpointView, error) {
	return s.drain(ctx, id, true)
}
