package kvstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrEpochChanged is the error of a new connection to a Redis that no longer holds the epoch the gateway's
// leases were taken in (it restarted empty, or the marker was removed): RedisEpoch's connection check. It is
// ErrUnavailable to callers (RedisUnavailable), so Guarded recovers onto the new epoch.
var ErrEpochChanged = errors.New("kvstore: redis store epoch changed (restarted without its data)")

// epochScript sets the marker to ARGV[1] unless it exists, and returns the marker: the first gateway to ask
// after a store (re)starts empty names the new epoch, every other gateway reads the same value.
var epochScript = script("epoch")

// RedisEpoch is the Redis store's epoch marker (Guarded's Remote): a random value at
// "<prefix>:v1:{res}:epoch" that a restart without persistence (or a FLUSHALL) removes. It shares the
// reservations' hash tag {res}, so on a Redis Cluster it lives, and disappears, with the counters it vouches
// for; and the configured prefix, so two fleets on one Redis (two prefixes) have their own epochs.
//
// On a standalone Redis, OpenStore also makes it check every new connection (go-redis OnConnect, after the
// client's AUTH/SELECT handshake): while an expected epoch is set (Expect), a connection whose marker is not
// that epoch is refused with ErrEpochChanged. A Redis that restarts empty can only be reached through new
// connections, and go-redis retries a failed command on a new one without telling its caller: without the
// check, reservations in the moments before the periodic epoch check would see an empty store. On a Cluster
// the marker lives on one master only, so connections are not checked (the periodic check notices later).
type RedisEpoch struct {
	c       redis.UniversalClient
	key     string
	timeout time.Duration
	expect  atomic.Pointer[func() (string, bool)]
}

// NewRedisEpoch returns the epoch marker of the store with cfg's prefix on client. It fails only for an
// invalid prefix.
func NewRedisEpoch(client redis.UniversalClient, cfg RedisConfig) (*RedisEpoch, error) {
	base, err := cfg.base()
	if err != nil {
		return nil, err
	}
	return &RedisEpoch{c: client, key: base + "{res}:epoch", timeout: 2 * time.Second}, nil
}

// Key is the marker's key name.
func (e *RedisEpoch) Key() string { return e.key }

// Epoch returns the store's epoch marker, creating it when missing (one EVALSHA).
func (e *RedisEpoch) Epoch(ctx context.Context) (string, error) {
	var b [12]byte
	_, _ = rand.Read(b[:])
	v, err := epochScript.Run(ctx, e.c, []string{e.key}, hex.EncodeToString(b[:])).Text()
	if err != nil {
		return "", fmt.Errorf("kvstore: redis epoch: %w", err)
	}
	return v, nil
}

// Ping reports whether Redis answers.
func (e *RedisEpoch) Ping(ctx context.Context) error {
	if err := e.c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("kvstore: redis ping: %w", err)
	}
	return nil
}

// Expect sets the function the connection check asks for the epoch to require: it returns the epoch and
// whether to enforce it (false while nothing is required: the store is down or recovering, which reads the
// new epoch itself). Guarded.ExpectedEpoch is the one to pass. nil stops checking.
func (e *RedisEpoch) Expect(f func() (string, bool)) {
	if f == nil {
		e.expect.Store(nil)
		return
	}
	e.expect.Store(&f)
}

// checkConn is the OnConnect check of a new connection (see RedisEpoch).
func (e *RedisEpoch) checkConn(ctx context.Context, cn *redis.Conn) error {
	f := e.expect.Load()
	if f == nil {
		return nil
	}
	want, enforce := (*f)()
	if !enforce {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	got, err := cn.Get(ctx, e.key).Result()
	if errors.Is(err, redis.Nil) {
		got, err = "", nil
	}
	if err != nil {
		return fmt.Errorf("kvstore: redis epoch check: %w", err)
	}
	if got != want {
		return Unavailable(fmt.Errorf("%w: marker %q, expected %q", ErrEpochChanged, got, want))
	}
	return nil
}
