package kvstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ShardedRedisReservations is the Redis Reservations sharded by endpoint (issue #14 item 3): each endpoint's
// counters and leases have their own hash tag, so on a Redis Cluster the reservations of different endpoints
// run on different masters:
//
//	<base>{res:<endpoint>}:inflight  HASH   r:<endpoint> -> requests, t:<endpoint> -> tokens in flight
//	<base>{res:<endpoint>}:leases    ZSET   lease number scored by expiry ms
//	<base>{res:<endpoint>}:ld        HASH   lease number -> "<requests> <tokens> <endpoint>"
//	<base>{res:<endpoint>}:seq       STRING lease number counter
//
// The scripts are RedisReservations' (they take an endpoint's four keys), so the limit check and the grant of
// one endpoint are still one atomic step: never two leases on one endpoint's last slot. Reserve tries the
// ranked candidates in order, one script (one round trip, one slot) per candidate tried, until one grants;
// a lease ID is "<number>@<endpoint>", unique across endpoints. InFlight pipelines one read script per
// endpoint: one round trip (go-redis sends each node its share). Not compatible with RedisReservations'
// single-tag layout: see kvstore/RATIONALE.md, "Reservations on Redis Cluster", for the rolling upgrade.
type ShardedRedisReservations struct {
	c    redis.UniversalClient
	base string
}

var _ Reservations = (*ShardedRedisReservations)(nil)

// NewShardedRedisReservations returns sharded reservations on client. It fails only for an invalid
// cfg.Prefix.
func NewShardedRedisReservations(client redis.UniversalClient, cfg RedisConfig) (*ShardedRedisReservations, error) {
	base, err := cfg.base()
	if err != nil {
		return nil, err
	}
	return &ShardedRedisReservations{c: client, base: base}, nil
}

// keys returns ep's four keys; ErrInvalidArgument for an endpoint ID that would break the hash tag.
func (r *ShardedRedisReservations) keys(ep EndpointID) ([]string, error) {
	if ep == "" || strings.ContainsAny(string(ep), "{}") {
		return nil, fmt.Errorf("kvstore: endpoint ID %q for sharded reservations: %w", ep, ErrInvalidArgument)
	}
	p := r.base + "{res:" + string(ep) + "}:"
	return []string{p + "inflight", p + "leases", p + "ld", p + "seq"}, nil
}

// Reserve implements Reservations: one EVALSHA per candidate tried, in rank order.
func (r *ShardedRedisReservations) Reserve(ctx context.Context, ranked []Candidate, cost Cost, ttl time.Duration) (Lease, error) {
	return r.reserveIn(ctx, ranked, cost, ttl, 0, 0)
}

// reserveIn is Reserve granting only while the candidate's server time is in [from, to) (ms; 0 =
// unbounded), else errWindow.
func (r *ShardedRedisReservations) reserveIn(ctx context.Context, ranked []Candidate, cost Cost, ttl time.Duration, from, to int64) (Lease, error) {
	if err := checkReserve(cost, ttl); err != nil {
		return Lease{}, err
	}
	for _, c := range ranked {
		if c.Endpoint == "" {
			continue
		}
		keys, err := r.keys(c.Endpoint)
		if err != nil {
			return Lease{}, err
		}
		res, err := scriptResReserve.Run(ctx, r.c, keys, msCeil(ttl), cost.Requests, cost.Tokens, from, to,
			string(c.Endpoint), c.Limits.MaxRequests, c.Limits.MaxTokens).Slice()
		if err != nil {
			return Lease{}, fmt.Errorf("kvstore: redis reserve: %w", err)
		}
		id, exp, _, ok, err := reserveReply(res)
		if err != nil {
			return Lease{}, err
		}
		if !ok {
			continue // full: the next candidate's slot
		}
		return Lease{ID: id + "@" + string(c.Endpoint), Endpoint: c.Endpoint, Cost: cost, Expires: time.UnixMilli(exp)}, nil
	}
	return Lease{}, ErrNoCapacity
}

// split returns a lease's endpoint keys and its number on that endpoint.
func (r *ShardedRedisReservations) split(l Lease) ([]string, string, error) {
	i := strings.IndexByte(l.ID, '@') // the number has none; an endpoint ID may
	if i < 0 {
		return nil, "", fmt.Errorf("kvstore: lease ID %q is not a sharded reservation's: %w", l.ID, ErrLeaseNotLive)
	}
	ep := l.Endpoint
	if ep == "" {
		ep = EndpointID(l.ID[i+1:])
	}
	keys, err := r.keys(ep)
	return keys, l.ID[:i], err
}

// Renew implements Reservations (one EVALSHA on the lease's endpoint).
func (r *ShardedRedisReservations) Renew(ctx context.Context, l Lease, ttl time.Duration) (Lease, error) {
	if ttl <= 0 {
		return Lease{}, fmt.Errorf("kvstore: renew: ttl %v: %w", ttl, ErrInvalidArgument)
	}
	keys, n, err := r.split(l)
	if err != nil {
		return Lease{}, err
	}
	return renewOn(ctx, r.c, keys, n, l, ttl)
}

// Release implements Reservations (one EVALSHA on the lease's endpoint; idempotent).
func (r *ShardedRedisReservations) Release(ctx context.Context, l Lease) error {
	if l.ID == "" {
		return nil
	}
	keys, n, err := r.split(l)
	if err != nil {
		return nil // not a lease of this layout: nothing here to release
	}
	if err := scriptResRelease.Run(ctx, r.c, keys, n).Err(); err != nil {
		return fmt.Errorf("kvstore: redis release: %w", err)
	}
	return nil
}

// InFlight implements Reservations, without a script when it can: one pipeline of TIME and, per endpoint,
// its earliest lease expiry (ZRANGE 0 0 WITHSCORES) and an HMGET of its counters, exact when no lease has
// expired yet (as RedisReservations.InFlight; on a Cluster, where TIME comes from any master, no lease within
// clusterClockSkew of its expiry; go-redis sends each master its endpoints' reads, one round trip).
// Otherwise one pipeline of a read script (reap, then read) per endpoint.
func (r *ShardedRedisReservations) InFlight(ctx context.Context, eps []EndpointID) (map[EndpointID]Cost, error) {
	out := make(map[EndpointID]Cost, len(eps))
	if len(eps) == 0 {
		return out, nil
	}
	if ok, err := r.inFlightPlain(ctx, eps, out); ok || err != nil {
		return out, err
	}
	clear(out)
	run := func() ([]*redis.Cmd, error) {
		p := r.c.Pipeline()
		cmds := make([]*redis.Cmd, len(eps))
		for i, ep := range eps {
			keys, err := r.keys(ep)
			if err != nil {
				return nil, err
			}
			cmds[i] = scriptResInFlight.EvalSha(ctx, p, keys, string(ep))
		}
		_, err := p.Exec(ctx)
		return cmds, err
	}
	cmds, err := run()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		if err = scriptResInFlight.Load(ctx, r.c).Err(); err == nil {
			cmds, err = run()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kvstore: redis in-flight: %w", err)
	}
	for i, ep := range eps {
		res, err := cmds[i].Int64Slice()
		if err != nil || len(res) != 2 {
			return nil, fmt.Errorf("kvstore: redis in-flight of %q: %v %v", ep, res, err)
		}
		if c := (Cost{Requests: res[0], Tokens: res[1]}); c != (Cost{}) {
			out[ep] = c
		}
	}
	return out, nil
}

// inFlightPlain is InFlight without scripts: ok false (nothing wrong) when a lease has expired
// unreaped, so only a script can say what still counts.
func (r *ShardedRedisReservations) inFlightPlain(ctx context.Context, eps []EndpointID, out map[EndpointID]Cost) (bool, error) {
	p := r.c.Pipeline()
	tm := p.Time(ctx)
	firsts := make([]*redis.ZSliceCmd, len(eps))
	vals := make([]*redis.SliceCmd, len(eps))
	for i, ep := range eps {
		keys, err := r.keys(ep)
		if err != nil {
			return false, err
		}
		firsts[i] = p.ZRangeWithScores(ctx, keys[1], 0, 0)
		vals[i] = p.HMGet(ctx, keys[0], "r:"+string(ep), "t:"+string(ep))
	}
	if err := execRound(ctx, r.c, p); err != nil { // with Match's first read, in a SharedRound
		if redis.HasErrorPrefix(err, "WRONGTYPE") {
			return false, nil
		}
		return false, fmt.Errorf("kvstore: redis in-flight: %w", err)
	}
	now := tm.Val().UnixMilli() + plainReadMargin(r.c)
	for i, ep := range eps {
		if fs := firsts[i].Val(); len(fs) > 0 && int64(fs[0].Score) <= now {
			return false, nil
		}
		v := vals[i].Val()
		var c Cost
		var ok1, ok2 bool
		c.Requests, ok1 = hashInt(v[0])
		c.Tokens, ok2 = hashInt(v[1])
		if !ok1 || !ok2 {
			return false, fmt.Errorf("kvstore: redis in-flight: malformed counter of %q", ep)
		}
		if c != (Cost{}) {
			out[ep] = c
		}
	}
	return true, nil
}
