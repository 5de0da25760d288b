package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/kvstore"
)

// storeEpochKey names the Redis value that marks a store's epoch. It shares the reservations' hash tag {res},
// so on a Redis Cluster it lives, and disappears, with the reservation counters it vouches for.
const storeEpochKey = kvstore.DefaultRedisPrefix + ":" + kvstore.LayoutVersion + ":{res}:epoch"

// epochScript sets the marker to ARGV[1] unless it exists, and returns the marker: the first gateway to ask
// after a store (re)starts empty names the new epoch, every other gateway reads the same value.
var epochScript = redis.NewScript(`redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])`)

// redisEpoch implements route.Epocher on a Redis store: the epoch is a random marker value that a Redis
// restart without persistence (or a FLUSHALL) removes.
type redisEpoch struct{ c redis.UniversalClient }

// Epoch returns the store's epoch marker, creating it when missing.
func (e redisEpoch) Epoch(ctx context.Context) (string, error) {
	var b [12]byte
	_, _ = rand.Read(b[:])
	v, err := epochScript.Run(ctx, e.c, []string{storeEpochKey}, hex.EncodeToString(b[:])).Text()
	if err != nil {
		return "", fmt.Errorf("gateway: store epoch: %w", err)
	}
	return v, nil
}
