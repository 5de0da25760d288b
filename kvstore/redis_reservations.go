package kvstore

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed scripts/res_reap.lua
	luaResReap string
	//go:embed scripts/res_reserve.lua
	luaResReserve string
	//go:embed scripts/res_renew.lua
	luaResRenew string
	//go:embed scripts/res_release.lua
	luaResRelease string
	//go:embed scripts/res_inflight.lua
	luaResInFlight string

	scriptResReserve  = redis.NewScript(luaResReap + luaResReserve)
	scriptResRenew    = redis.NewScript(luaResReap + luaResRenew)
	scriptResRelease  = redis.NewScript(luaResReap + luaResRelease)
	scriptResInFlight = redis.NewScript(luaResReap + luaResInFlight)
)

// RedisReservations is the Redis Reservations: every call is one Lua script that first reads the server
// clock (TIME) and drops expired leases, so leases expire on Redis's clock whatever the gateways' clocks
// say. All its keys share the hash tag {res} (one slot, one Redis Cluster master):
//
//	<base>{res}:inflight  HASH  r:<endpoint> -> requests, t:<endpoint> -> tokens in flight
//	<base>{res}:leases    ZSET  lease ID scored by expiry ms
//	<base>{res}:ld        HASH  lease ID -> "<requests> <tokens> <endpoint>"
//	<base>{res}:seq       STRING lease ID counter
type RedisReservations struct {
	c    redis.UniversalClient
	keys []string
}

var _ Reservations = (*RedisReservations)(nil)

// NewRedisReservations returns reservations on client. It fails only for an invalid cfg.Prefix.
func NewRedisReservations(client redis.UniversalClient, cfg RedisConfig) (*RedisReservations, error) {
	base, err := cfg.base()
	if err != nil {
		return nil, err
	}
	p := base + "{res}:"
	return &RedisReservations{c: client, keys: []string{p + "inflight", p + "leases", p + "ld", p + "seq"}}, nil
}

func msCeil(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// Reserve implements Reservations (one EVALSHA).
func (r *RedisReservations) Reserve(ctx context.Context, ranked []Candidate, cost Cost, ttl time.Duration) (Lease, error) {
	if err := checkReserve(cost, ttl); err != nil {
		return Lease{}, err
	}
	args := make([]any, 0, 3+3*len(ranked))
	args = append(args, msCeil(ttl), cost.Requests, cost.Tokens)
	n := 0
	for _, c := range ranked {
		if c.Endpoint == "" {
			continue
		}
		args = append(args, string(c.Endpoint), c.Limits.MaxRequests, c.Limits.MaxTokens)
		n++
	}
	if n == 0 {
		return Lease{}, ErrNoCapacity
	}
	res, err := scriptResReserve.Run(ctx, r.c, r.keys, args...).Slice()
	if err != nil {
		return Lease{}, fmt.Errorf("kvstore: redis reserve: %w", err)
	}
	if len(res) == 0 {
		return Lease{}, ErrNoCapacity
	}
	if len(res) != 3 {
		return Lease{}, fmt.Errorf("kvstore: redis reserve: reply of %d elements", len(res))
	}
	id, ok1 := res[0].(string)
	exp, ok2 := res[1].(int64)
	i, ok3 := res[2].(int64)
	i-- // the script numbers candidates from 1
	if !ok1 || !ok2 || !ok3 || i < 0 || int(i) >= n {
		return Lease{}, fmt.Errorf("kvstore: redis reserve: unexpected reply %v", res)
	}
	ep := EndpointID(args[3+3*i].(string))
	return Lease{ID: id, Endpoint: ep, Cost: cost, Expires: time.UnixMilli(exp)}, nil
}

// Renew implements Reservations (one EVALSHA).
func (r *RedisReservations) Renew(ctx context.Context, l Lease, ttl time.Duration) (Lease, error) {
	if ttl <= 0 {
		return Lease{}, fmt.Errorf("kvstore: renew: ttl %v: %w", ttl, ErrInvalidArgument)
	}
	exp, err := scriptResRenew.Run(ctx, r.c, r.keys, l.ID, msCeil(ttl)).Int64()
	if err != nil {
		return Lease{}, fmt.Errorf("kvstore: redis renew: %w", err)
	}
	if exp < 0 {
		return Lease{}, fmt.Errorf("kvstore: renew %s: %w", l.ID, ErrLeaseNotLive)
	}
	l.Expires = time.UnixMilli(exp)
	return l, nil
}

// Release implements Reservations (one EVALSHA; idempotent).
func (r *RedisReservations) Release(ctx context.Context, l Lease) error {
	if l.ID == "" {
		return nil
	}
	if err := scriptResRelease.Run(ctx, r.c, r.keys, l.ID).Err(); err != nil {
		return fmt.Errorf("kvstore: redis release: %w", err)
	}
	return nil
}

// InFlight implements Reservations (one EVALSHA); endpoints with nothing in flight are omitted.
func (r *RedisReservations) InFlight(ctx context.Context, eps []EndpointID) (map[EndpointID]Cost, error) {
	out := make(map[EndpointID]Cost, len(eps))
	if len(eps) == 0 {
		return out, nil
	}
	args := make([]any, len(eps))
	for i, ep := range eps {
		args[i] = string(ep)
	}
	res, err := scriptResInFlight.Run(ctx, r.c, r.keys, args...).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("kvstore: redis in-flight: %w", err)
	}
	if len(res) != 2*len(eps) {
		return nil, fmt.Errorf("kvstore: redis in-flight: reply of %d numbers for %d endpoints", len(res), len(eps))
	}
	for i, ep := range eps {
		if c := (Cost{Requests: res[2*i], Tokens: res[2*i+1]}); c != (Cost{}) {
			out[ep] = c
		}
	}
	return out, nil
}
