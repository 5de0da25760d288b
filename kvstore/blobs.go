package kvstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// BlobInfo describes one stored blob.
type BlobInfo struct {
	Name   string
	SHA256 string // lowercase hex
	Size   int    // bytes
}

// Blobs is a small shared store for policy modules and their activation, so every gateway on one store
// sees the same policies: named blobs pinned by SHA-256, one "active" value per model (for example a JSON
// document naming the policy version and its config), and change notifications.
//
// Notifications are hints: a message "blob:<name>" (put or deleted) or "active:<model>" after each change;
// receivers re-read what the hint names. Their order is not guaranteed (on Redis Cluster a PUBLISH goes to
// any node and crosses the cluster bus). A slow receiver may miss some (the channel buffers 64 on memory;
// Redis pub/sub has its own buffer), and Redis pub/sub delivers nothing while disconnected, so receivers
// should also re-read periodically.
type Blobs interface {
	// PutBlob stores data under name; sha256hex must be the hex SHA-256 of data (ErrDigestMismatch).
	// Putting an existing name replaces it.
	PutBlob(ctx context.Context, name, sha256hex string, data []byte) error
	// GetBlob returns the blob's digest and data, or ErrNotFound.
	GetBlob(ctx context.Context, name string) (sha256hex string, data []byte, err error)
	// ListBlobs returns every blob's name, digest and size, sorted by name.
	ListBlobs(ctx context.Context) ([]BlobInfo, error)
	// DeleteBlob removes the blob stored under name and notifies "blob:<name>", like PutBlob, so the other
	// receivers re-read and find it gone. It returns ErrNotFound (and notifies nothing) when no blob has that
	// name, ErrInvalidArgument for an empty name. Active values are not checked: a caller that must not
	// delete a blob some model's active value names checks that first (the gateway's admin API does).
	DeleteBlob(ctx context.Context, name string) error
	// SetActive stores value as model's active policy value.
	SetActive(ctx context.Context, model string, value []byte) error
	// GetActive returns model's active value, or ErrNotFound.
	GetActive(ctx context.Context, model string) ([]byte, error)
	// ListActive returns every model's active value, by model (empty, not nil, when none is stored).
	ListActive(ctx context.Context) (map[string][]byte, error)
	// Subscribe returns a channel of change notifications, closed when ctx is done.
	Subscribe(ctx context.Context) <-chan string
}

// Leases are named, expiring, fenced leases: one holder at a time (for example the one gateway that
// ingests an endpoint's KV events). Every acquisition hands out a fencing token larger than any before it
// for that name, so a stale holder's writes can be told apart. Expiry is on the store's clock.
type Leases interface {
	// AcquireLease takes name for holder for ttl. It returns ok=false (and no error) when another holder
	// has it; when holder already has it, the lease is extended and its token returned again.
	AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (token int64, ok bool, err error)
	// RenewLease extends holder's lease by ttl from now; ok=false when the lease is no longer holder's
	// with that token (expired, released, or taken by another).
	RenewLease(ctx context.Context, name, holder string, token int64, ttl time.Duration) (ok bool, err error)
	// ReleaseLease gives the lease up if holder still has it with token; otherwise it does nothing.
	ReleaseLease(ctx context.Context, name, holder string, token int64) error
}

func checkDigest(name, sha256hex string, data []byte) error {
	if name == "" {
		return fmt.Errorf("kvstore: put blob: empty name: %w", ErrInvalidArgument)
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != strings.ToLower(sha256hex) {
		return fmt.Errorf("kvstore: put blob %s: data has sha256 %s, not %s: %w", name, got, sha256hex, ErrDigestMismatch)
	}
	return nil
}

func checkLease(op, name, holder string, ttl time.Duration) error {
	if name == "" || holder == "" {
		return fmt.Errorf("kvstore: %s: empty lease name or holder: %w", op, ErrInvalidArgument)
	}
	if ttl <= 0 {
		return fmt.Errorf("kvstore: %s: ttl %v: %w", op, ttl, ErrInvalidArgument)
	}
	return nil
}

// MemoryBlobs is the in-memory Blobs and Leases. Safe for concurrent use.
type MemoryBlobs struct {
	now func() time.Time

	mu     sync.Mutex
	blobs  map[string]memBlob
	active map[string][]byte
	subs   map[chan string]struct{}
	leases map[string]memNamedLease
	fence  map[string]int64
	// Policies (policies.go)
	stacks  map[string][]PolicyEntry
	epoch   string
	serving map[string]memReport
	// Endpoints (endpoints.go): the run-time endpoint set and its revision (0: not seeded).
	eps   map[string]EndpointRecord
	epRev uint64
}

type memBlob struct {
	sha  string
	data []byte
}

type memNamedLease struct {
	holder  string
	token   int64
	expires time.Time
}

var (
	_ Blobs  = (*MemoryBlobs)(nil)
	_ Leases = (*MemoryBlobs)(nil)
)

// NewMemoryBlobs returns an empty memory blob and lease store on clock now (nil means time.Now).
func NewMemoryBlobs(now func() time.Time) *MemoryBlobs {
	if now == nil {
		now = time.Now
	}
	return &MemoryBlobs{now: now, blobs: map[string]memBlob{}, active: map[string][]byte{},
		subs: map[chan string]struct{}{}, leases: map[string]memNamedLease{}, fence: map[string]int64{},
		stacks: map[string][]PolicyEntry{}, serving: map[string]memReport{}}
}

func (m *MemoryBlobs) notify(msg string) {
	for ch := range m.subs {
		select {
		case ch <- msg:
		default: // slow receiver: drop (documented on Blobs)
		}
	}
}

// PutBlob implements Blobs.
func (m *MemoryBlobs) PutBlob(_ context.Context, name, sha256hex string, data []byte) error {
	if err := checkDigest(name, sha256hex, data); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.blobs[name] = memBlob{sha: strings.ToLower(sha256hex), data: slices.Clone(data)}
	m.notify("blob:" + name)
	return nil
}

// GetBlob implements Blobs.
func (m *MemoryBlobs) GetBlob(_ context.Context, name string) (string, []byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.blobs[name]
	if !ok {
		return "", nil, fmt.Errorf("kvstore: blob %q: %w", name, ErrNotFound)
	}
	return b.sha, slices.Clone(b.data), nil
}

// ListBlobs implements Blobs.
func (m *MemoryBlobs) ListBlobs(context.Context) ([]BlobInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]BlobInfo, 0, len(m.blobs))
	for n, b := range m.blobs {
		out = append(out, BlobInfo{Name: n, SHA256: b.sha, Size: len(b.data)})
	}
	slices.SortFunc(out, func(a, b BlobInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// DeleteBlob implements Blobs.
func (m *MemoryBlobs) DeleteBlob(_ context.Context, name string) error {
	if name == "" {
		return fmt.Errorf("kvstore: delete blob: empty name: %w", ErrInvalidArgument)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.blobs[name]; !ok {
		return fmt.Errorf("kvstore: delete blob %q: %w", name, ErrNotFound)
	}
	delete(m.blobs, name)
	m.notify("blob:" + name)
	return nil
}

// SetActive implements Blobs.
func (m *MemoryBlobs) SetActive(_ context.Context, model string, value []byte) error {
	if model == "" {
		return fmt.Errorf("kvstore: set active: empty model: %w", ErrInvalidArgument)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.active[model] = slices.Clone(value)
	m.notify("active:" + model)
	return nil
}

// GetActive implements Blobs.
func (m *MemoryBlobs) GetActive(_ context.Context, model string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.active[model]
	if !ok {
		return nil, fmt.Errorf("kvstore: active value of %q: %w", model, ErrNotFound)
	}
	return slices.Clone(v), nil
}

// ListActive implements Blobs.
func (m *MemoryBlobs) ListActive(context.Context) (map[string][]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string][]byte, len(m.active))
	for model, v := range m.active {
		out[model] = slices.Clone(v)
	}
	return out, nil
}

// Subscribe implements Blobs.
func (m *MemoryBlobs) Subscribe(ctx context.Context) <-chan string {
	ch := make(chan string, 64)
	m.mu.Lock()
	m.subs[ch] = struct{}{}
	m.mu.Unlock()
	go func() {
		<-ctx.Done()
		m.mu.Lock()
		delete(m.subs, ch)
		close(ch)
		m.mu.Unlock()
	}()
	return ch
}

// AcquireLease implements Leases.
func (m *MemoryBlobs) AcquireLease(_ context.Context, name, holder string, ttl time.Duration) (int64, bool, error) {
	if err := checkLease("acquire lease", name, holder, ttl); err != nil {
		return 0, false, err
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.leases[name]
	if ok && now.Before(l.expires) {
		if l.holder != holder {
			return 0, false, nil
		}
		l.expires = now.Add(ttl)
		m.leases[name] = l
		return l.token, true, nil
	}
	m.fence[name]++
	l = memNamedLease{holder: holder, token: m.fence[name], expires: now.Add(ttl)}
	m.leases[name] = l
	return l.token, true, nil
}

// RenewLease implements Leases.
func (m *MemoryBlobs) RenewLease(_ context.Context, name, holder string, token int64, ttl time.Duration) (bool, error) {
	if err := checkLease("renew lease", name, holder, ttl); err != nil {
		return false, err
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.leases[name]
	if !ok || !now.Before(l.expires) || l.holder != holder || l.token != token {
		return false, nil
	}
	l.expires = now.Add(ttl)
	m.leases[name] = l
	return true, nil
}

// ReleaseLease implements Leases.
func (m *MemoryBlobs) ReleaseLease(_ context.Context, name, holder string, token int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if l, ok := m.leases[name]; ok && l.holder == holder && l.token == token {
		delete(m.leases, name)
	}
	return nil
}
