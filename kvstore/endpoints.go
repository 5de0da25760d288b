package kvstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// States of a run-time endpoint (EndpointRecord.State).
const (
	// EndpointActive: the endpoint is routed to.
	EndpointActive = "active"
	// EndpointDraining: no new requests; in-flight ones and their leases finish, then it becomes drained
	// (or its record is deleted when Remove is set).
	EndpointDraining = "draining"
	// EndpointDrained: out of the fleet (no routing, probes, ingestion or index entries); the record stays so
	// that it can be made active again.
	EndpointDrained = "drained"
)

// ErrNotSeeded is returned by WriteEndpoints while the store holds no endpoint set (fresh, or restarted
// empty): the set must be seeded first (SeedEndpoints, or Policies.Reseed with FleetState.Endpoints), so a
// write never stands in for the fleet's whole set.
var ErrNotSeeded = errors.New("kvstore: endpoint set not seeded")

// EndpointRecord is one run-time endpoint of the fleet as the store holds it.
type EndpointRecord struct {
	// ID is the endpoint ID (unique across models; no newline).
	ID string `json:"id"`
	// Model is the served model name.
	Model string `json:"model"`
	// Spec is the endpoint's configuration as a JSON object with the config file's keys
	// (gateway/config.Endpoint); opaque to the store.
	Spec json.RawMessage `json:"spec"`
	// State is EndpointActive, EndpointDraining or EndpointDrained.
	State string `json:"state"`
	// Remove makes a draining endpoint's record go away once it is drained (a removal, not a drain).
	Remove bool `json:"remove,omitempty"`
	// Source says who manages the record: "config" (a gateway's file), "admin" (the admin API),
	// "dns:<name>" (discovery) or "simulate".
	Source string `json:"source,omitempty"`
	// DrainSince is when draining started, Unix milliseconds on the writer's clock (0 unless draining).
	DrainSince int64 `json:"drain_since_ms,omitempty"`
}

// EndpointSet is one consistent read of the fleet's run-time endpoints.
type EndpointSet struct {
	// Marker is the fleet-state marker (Fleet.Epoch; "" when the store has none: fresh or restarted empty).
	Marker string
	// Rev counts the set's writes (1 after seeding); 0 means not seeded.
	Rev uint64
	// Records are the endpoints, sorted by ID.
	Records []EndpointRecord
}

// Get returns the record with id.
func (s EndpointSet) Get(id string) (EndpointRecord, bool) {
	for _, r := range s.Records {
		if r.ID == id {
			return r, true
		}
	}
	return EndpointRecord{}, false
}

// Endpoints is the fleet's run-time endpoint set, the one truth every gateway follows (as Policies is for
// policies). Each write is one atomic step (a Lua script on Redis, under the store's mutex in memory),
// conditional on the revision the writer read, so a change computed from one read is applied whole or
// refused (ErrStale) and re-computed. Every change notifies "endpoints" on Blobs.Subscribe.
type Endpoints interface {
	// ReadEndpoints returns the marker, the revision and every record at once.
	ReadEndpoints(ctx context.Context) (EndpointSet, error)
	// SeedEndpoints writes recs as the whole set (revision 1) unless a set is stored; it returns the stored
	// set and whether this call seeded it (the first seeder wins).
	SeedEndpoints(ctx context.Context, recs []EndpointRecord) (EndpointSet, bool, error)
	// WriteEndpoints puts recs (created, or replaced by ID) and deletes the records named in del (absent
	// ones are ignored), in one step, only when the stored revision is ifRev; it returns the set after the
	// write (revision ifRev+1). Errors: ErrStale (another write came first: nothing written), ErrNotSeeded,
	// ErrInvalidArgument (a record without ID, model or a known state; an ID in both put and del).
	WriteEndpoints(ctx context.Context, ifRev uint64, put []EndpointRecord, del []string) (EndpointSet, error)
}

func checkRecords(op string, recs []EndpointRecord, del []string) error {
	seen := map[string]bool{}
	for _, r := range recs {
		if r.ID == "" || r.Model == "" || strings.ContainsAny(r.ID, "\n\r") {
			return fmt.Errorf("kvstore: %s: endpoint %q model %q: %w", op, r.ID, r.Model, ErrInvalidArgument)
		}
		switch r.State {
		case EndpointActive, EndpointDraining, EndpointDrained:
		default:
			return fmt.Errorf("kvstore: %s: endpoint %s: state %q: %w", op, r.ID, r.State, ErrInvalidArgument)
		}
		if len(r.Spec) > 0 && !json.Valid(r.Spec) {
			return fmt.Errorf("kvstore: %s: endpoint %s: spec is not JSON: %w", op, r.ID, ErrInvalidArgument)
		}
		if seen[r.ID] {
			return fmt.Errorf("kvstore: %s: endpoint %s twice: %w", op, r.ID, ErrInvalidArgument)
		}
		seen[r.ID] = true
	}
	for _, id := range del {
		if id == "" || seen[id] {
			return fmt.Errorf("kvstore: %s: delete %q: %w", op, id, ErrInvalidArgument)
		}
	}
	return nil
}

func cloneRecord(r EndpointRecord) EndpointRecord {
	r.Spec = slices.Clone(r.Spec)
	return r
}

func sortRecords(recs []EndpointRecord) {
	slices.SortFunc(recs, func(a, b EndpointRecord) int { return strings.Compare(a.ID, b.ID) })
}

// The memory twin.

var _ Endpoints = (*MemoryBlobs)(nil)

func (m *MemoryBlobs) endpointSetLocked() EndpointSet {
	s := EndpointSet{Marker: m.epoch, Rev: m.epRev, Records: make([]EndpointRecord, 0, len(m.eps))}
	for _, r := range m.eps {
		s.Records = append(s.Records, cloneRecord(r))
	}
	sortRecords(s.Records)
	return s
}

// ReadEndpoints implements Endpoints.
func (m *MemoryBlobs) ReadEndpoints(context.Context) (EndpointSet, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.endpointSetLocked(), nil
}

// SeedEndpoints implements Endpoints.
func (m *MemoryBlobs) SeedEndpoints(_ context.Context, recs []EndpointRecord) (EndpointSet, bool, error) {
	if err := checkRecords("seed endpoints", recs, nil); err != nil {
		return EndpointSet{}, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.epRev != 0 {
		return m.endpointSetLocked(), false, nil
	}
	m.seedEndpointsLocked(recs)
	return m.endpointSetLocked(), true, nil
}

func (m *MemoryBlobs) seedEndpointsLocked(recs []EndpointRecord) {
	m.eps = map[string]EndpointRecord{}
	for _, r := range recs {
		m.eps[r.ID] = cloneRecord(r)
	}
	m.epRev = 1
	m.notify("endpoints")
}

// WriteEndpoints implements Endpoints.
func (m *MemoryBlobs) WriteEndpoints(_ context.Context, ifRev uint64, put []EndpointRecord, del []string) (EndpointSet, error) {
	if err := checkRecords("write endpoints", put, del); err != nil {
		return EndpointSet{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.epRev == 0 {
		return EndpointSet{}, fmt.Errorf("kvstore: write endpoints: %w", ErrNotSeeded)
	}
	if m.epRev != ifRev {
		return EndpointSet{}, fmt.Errorf("kvstore: write endpoints at revision %d (stored %d): %w", ifRev, m.epRev, ErrStale)
	}
	for _, r := range put {
		m.eps[r.ID] = cloneRecord(r)
	}
	for _, id := range del {
		delete(m.eps, id)
	}
	m.epRev++
	m.notify("endpoints")
	return m.endpointSetLocked(), nil
}
