package kvstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	scriptLeaseAcquire = script("lease_acquire")
	scriptLeaseRenew   = script("lease_renew")
)

// RedisBlobs is the Redis Blobs and Leases. Key layout (v1), base = "<Prefix>:v1:":
//
//	<base>{blobs}:index       HASH   blob name -> sha256 hex
//	<base>{blobs}:d:<name>    STRING blob data
//	<base>{blobs}:active      HASH   model -> active value
//	<base>changes             pub/sub channel: "blob:<name>" (put or deleted), "active:<model>"
//	<base>{lease:<name>}      HASH   holder, token; PEXPIRE = the lease's expiry (server clock)
//	<base>{lease:<name>}:fence STRING fencing-token counter (never expires)
type RedisBlobs struct {
	c    redis.UniversalClient
	base string
}

var (
	_ Blobs  = (*RedisBlobs)(nil)
	_ Leases = (*RedisBlobs)(nil)
)

// NewRedisBlobs returns the blob and lease store on client. It fails only for an invalid cfg.Prefix.
func NewRedisBlobs(client redis.UniversalClient, cfg RedisConfig) (*RedisBlobs, error) {
	base, err := cfg.base()
	if err != nil {
		return nil, err
	}
	return &RedisBlobs{c: client, base: base}, nil
}

func (r *RedisBlobs) k(s string) string { return r.base + "{blobs}:" + s }

// PutBlob implements Blobs (one MULTI/EXEC transaction, then PUBLISH).
func (r *RedisBlobs) PutBlob(ctx context.Context, name, sha256hex string, data []byte) error {
	if err := checkDigest(name, sha256hex, data); err != nil {
		return err
	}
	_, err := r.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, r.k("d:"+name), data, 0)
		p.HSet(ctx, r.k("index"), name, strings.ToLower(sha256hex))
		return nil
	})
	if err != nil {
		return fmt.Errorf("kvstore: redis put blob: %w", err)
	}
	if err := r.c.Publish(ctx, r.base+"changes", "blob:"+name).Err(); err != nil {
		return fmt.Errorf("kvstore: redis put blob: notify: %w", err)
	}
	return nil
}

// GetBlob implements Blobs (one MULTI/EXEC transaction).
func (r *RedisBlobs) GetBlob(ctx context.Context, name string) (string, []byte, error) {
	var sha *redis.StringCmd
	var data *redis.StringCmd
	_, err := r.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		sha = p.HGet(ctx, r.k("index"), name)
		data = p.Get(ctx, r.k("d:"+name))
		return nil
	})
	if errors.Is(err, redis.Nil) || (err == nil && (sha.Err() == redis.Nil || data.Err() == redis.Nil)) {
		return "", nil, fmt.Errorf("kvstore: blob %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return "", nil, fmt.Errorf("kvstore: redis get blob: %w", err)
	}
	b, _ := data.Bytes()
	return sha.Val(), b, nil
}

// ListBlobs implements Blobs (two round trips: the index, then the sizes).
func (r *RedisBlobs) ListBlobs(ctx context.Context) ([]BlobInfo, error) {
	idx, err := r.c.HGetAll(ctx, r.k("index")).Result()
	if err != nil {
		return nil, fmt.Errorf("kvstore: redis list blobs: %w", err)
	}
	out := make([]BlobInfo, 0, len(idx))
	for n, sha := range idx {
		out = append(out, BlobInfo{Name: n, SHA256: sha})
	}
	slices.SortFunc(out, func(a, b BlobInfo) int { return strings.Compare(a.Name, b.Name) })
	if len(out) == 0 {
		return out, nil
	}
	cmds := make([]*redis.IntCmd, len(out))
	_, err = r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, b := range out {
			cmds[i] = p.StrLen(ctx, r.k("d:"+b.Name))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("kvstore: redis list blobs: %w", err)
	}
	for i := range out {
		out[i].Size = int(cmds[i].Val())
	}
	return out, nil
}

// DeleteBlob implements Blobs (one MULTI/EXEC transaction, then PUBLISH on the channel PutBlob uses).
func (r *RedisBlobs) DeleteBlob(ctx context.Context, name string) error {
	if name == "" {
		return fmt.Errorf("kvstore: delete blob: empty name: %w", ErrInvalidArgument)
	}
	var n *redis.IntCmd
	_, err := r.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		n = p.HDel(ctx, r.k("index"), name)
		p.Del(ctx, r.k("d:"+name))
		return nil
	})
	if err != nil {
		return fmt.Errorf("kvstore: redis delete blob: %w", err)
	}
	if n.Val() == 0 {
		return fmt.Errorf("kvstore: delete blob %q: %w", name, ErrNotFound)
	}
	if err := r.c.Publish(ctx, r.base+"changes", "blob:"+name).Err(); err != nil {
		return fmt.Errorf("kvstore: redis delete blob: notify: %w", err)
	}
	return nil
}

// SetActive implements Blobs.
func (r *RedisBlobs) SetActive(ctx context.Context, model string, value []byte) error {
	if model == "" {
		return fmt.Errorf("kvstore: set active: empty model: %w", ErrInvalidArgument)
	}
	if err := r.c.HSet(ctx, r.k("active"), model, value).Err(); err != nil {
		return fmt.Errorf("kvstore: redis set active: %w", err)
	}
	if err := r.c.Publish(ctx, r.base+"changes", "active:"+model).Err(); err != nil {
		return fmt.Errorf("kvstore: redis set active: notify: %w", err)
	}
	return nil
}

// GetActive implements Blobs.
func (r *RedisBlobs) GetActive(ctx context.Context, model string) ([]byte, error) {
	v, err := r.c.HGet(ctx, r.k("active"), model).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("kvstore: active value of %q: %w", model, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("kvstore: redis get active: %w", err)
	}
	return v, nil
}

// ListActive implements Blobs (one HGETALL).
func (r *RedisBlobs) ListActive(ctx context.Context) (map[string][]byte, error) {
	all, err := r.c.HGetAll(ctx, r.k("active")).Result()
	if err != nil {
		return nil, fmt.Errorf("kvstore: redis list active: %w", err)
	}
	out := make(map[string][]byte, len(all))
	for model, v := range all {
		out[model] = []byte(v)
	}
	return out, nil
}

// Subscribe implements Blobs through Redis pub/sub (go-redis resubscribes after reconnecting; messages
// published while disconnected are lost).
func (r *RedisBlobs) Subscribe(ctx context.Context) <-chan string {
	ps := r.c.Subscribe(ctx, r.base+"changes")
	// Wait for the subscription to be confirmed, so changes made after Subscribe returns are seen.
	_, _ = ps.Receive(ctx)
	in := ps.Channel()
	out := make(chan string, 64)
	go func() {
		defer close(out)
		defer ps.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case m, ok := <-in:
				if !ok {
					return
				}
				select {
				case out <- m.Payload:
				default:
				}
			}
		}
	}()
	return out
}

func (r *RedisBlobs) leaseKey(name string) string { return r.base + "{lease:" + name + "}" }

// AcquireLease implements Leases (one EVALSHA).
func (r *RedisBlobs) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (int64, bool, error) {
	if err := checkLease("acquire lease", name, holder, ttl); err != nil {
		return 0, false, err
	}
	k := r.leaseKey(name)
	tok, err := scriptLeaseAcquire.Run(ctx, r.c, []string{k, k + ":fence"}, holder, msCeil(ttl)).Int64()
	if err != nil {
		return 0, false, fmt.Errorf("kvstore: redis acquire lease: %w", err)
	}
	return tok, tok > 0, nil
}

// RenewLease implements Leases (one EVALSHA).
func (r *RedisBlobs) RenewLease(ctx context.Context, name, holder string, token int64, ttl time.Duration) (bool, error) {
	if err := checkLease("renew lease", name, holder, ttl); err != nil {
		return false, err
	}
	n, err := scriptLeaseRenew.Run(ctx, r.c, []string{r.leaseKey(name)}, holder, strconv.FormatInt(token, 10), msCeil(ttl)).Int64()
	if err != nil {
		return false, fmt.Errorf("kvstore: redis renew lease: %w", err)
	}
	return n == 1, nil
}

// ReleaseLease implements Leases (one EVALSHA).
func (r *RedisBlobs) ReleaseLease(ctx context.Context, name, holder string, token int64) error {
	err := scriptLeaseRenew.Run(ctx, r.c, []string{r.leaseKey(name)}, holder, strconv.FormatInt(token, 10), "release").Err()
	if err != nil {
		return fmt.Errorf("kvstore: redis release lease: %w", err)
	}
	return nil
}
