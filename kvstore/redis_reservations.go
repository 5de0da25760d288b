package kvstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The reservation scripts: the shared library (scripts/res_reap.lua: clock, drop, reap) and the call's own file.
var (
	scriptResReserve  = script("res_reap", "res_reserve")
	scriptResRenew    = script("res_reap", "res_renew")
	scriptResRelease  = script("res_reap", "res_release")
	scriptResInFlight = script("res_reap", "res_inflight")
	scriptResMarker   = script("res_marker")
)

// errWindow is the reserve script's answer outside the server-time window it was given (the
// reservation-layout switch, LayoutRedisReservations): nothing was granted; now is the server's time (ms).
type errWindow struct{ now int64 }

func (e errWindow) Error() string {
	return fmt.Sprintf("kvstore: reservation layout switched (server time %d ms)", e.now)
}

// reserveReply parses the reserve script's reply: the lease ID, its expiry and the candidate number
// (from 1); ok false when every candidate was full; errWindow outside the window.
func reserveReply(res []any) (id string, exp, cand int64, ok bool, err error) {
	switch len(res) {
	case 0:
		return "", 0, 0, false, nil
	case 2:
		if w, _ := res[0].(string); w == "window" {
			now, _ := res[1].(int64)
			return "", 0, 0, false, errWindow{now: now}
		}
	case 3:
		id, ok1 := res[0].(string)
		exp, ok2 := res[1].(int64)
		cand, ok3 := res[2].(int64)
		if ok1 && ok2 && ok3 {
			return id, exp, cand, true, nil
		}
	}
	return "", 0, 0, false, fmt.Errorf("kvstore: redis reserve: unexpected reply %v", res)
}

// RedisReservations is the Redis Reservations: every call is one Lua script (InFlight a plain pipeline
// when it can), and leases expire on Redis's clock (TIME) whatever the gateways' clocks say. Expired leases
// are dropped where they would count: by a Reserve whose limit check fails (then the candidate is checked
// again), by Renew and by the in-flight script; a Release drops only its own lease (kvstore/RATIONALE.md,
// "What a reservation costs Redis"). All its keys share the hash tag {res} (one slot, one Redis Cluster
// master):
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
	return r.reserveIn(ctx, ranked, cost, ttl, 0, 0)
}

// reserveIn is Reserve granting only while the server's time is in [from, to) (ms; 0 = unbounded), else
// errWindow.
func (r *RedisReservations) reserveIn(ctx context.Context, ranked []Candidate, cost Cost, ttl time.Duration, from, to int64) (Lease, error) {
	if err := checkReserve(cost, ttl); err != nil {
		return Lease{}, err
	}
	args := make([]any, 0, 5+3*len(ranked))
	args = append(args, msCeil(ttl), cost.Requests, cost.Tokens, from, to)
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
	id, exp, i, ok, err := reserveReply(res)
	if err != nil {
		return Lease{}, err
	}
	if !ok {
		return Lease{}, ErrNoCapacity
	}
	i-- // the script numbers candidates from 1
	if i < 0 || int(i) >= n {
		return Lease{}, fmt.Errorf("kvstore: redis reserve: candidate %d of %d", i+1, n)
	}
	ep := EndpointID(args[5+3*i].(string))
	return Lease{ID: id, Endpoint: ep, Cost: cost, Expires: time.UnixMilli(exp)}, nil
}

// Renew implements Reservations (one EVALSHA).
func (r *RedisReservations) Renew(ctx context.Context, l Lease, ttl time.Duration) (Lease, error) {
	if ttl <= 0 {
		return Lease{}, fmt.Errorf("kvstore: renew: ttl %v: %w", ttl, ErrInvalidArgument)
	}
	return renewOn(ctx, r.c, r.keys, l.ID, l, ttl)
}

// renewOn runs the renew script on keys for the lease stored as id (l.ID, or its part within an
// endpoint's shard) and returns l with the new expiry; ErrLeaseNotLive when the store no longer holds it.
func renewOn(ctx context.Context, c redis.UniversalClient, keys []string, id string, l Lease, ttl time.Duration) (Lease, error) {
	exp, err := scriptResRenew.Run(ctx, c, keys, id, msCeil(ttl)).Int64()
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

// clusterClockSkew is how much earlier than its expiry a lease counts as possibly expired for a plain
// in-flight read on a Redis Cluster, where TIME comes from any master (their clocks differ by their NTP
// skew) rather than the one holding the leases (kvstore/RATIONALE.md, "In-flight reads on a Cluster").
const clusterClockSkew = time.Second

// plainReadMargin returns the margin a plain in-flight read needs between server time and the earliest
// lease expiry on client c: 0 on one server (TIME is the lease master's own clock), clusterClockSkew on a
// Cluster or Ring.
func plainReadMargin(c redis.UniversalClient) int64 {
	switch c.(type) {
	case *redis.ClusterClient, *redis.Ring:
		return clusterClockSkew.Milliseconds()
	}
	return 0
}

// InFlight implements Reservations without a script when it can: one pipeline of the earliest lease expiry
// (ZRANGE 0 0 WITHSCORES), TIME and an HMGET of the endpoints' counters, exact when no lease has expired
// yet (the counters then hold only live leases). Otherwise the script reaps expired leases first (it reaps
// at most 256 per call; what it leaves is a slice for the next call). Every request reads this, and the
// script cost as much Redis time as a Reserve. On a Redis Cluster TIME may come from another master, so
// the plain read needs the earliest expiry clusterClockSkew beyond it (leases are renewed every TTL/3, so it
// usually is by seconds); a lease within that of its expiry sends the read to the script.
func (r *RedisReservations) InFlight(ctx context.Context, eps []EndpointID) (map[EndpointID]Cost, error) {
	out := make(map[EndpointID]Cost, len(eps))
	if len(eps) == 0 {
		return out, nil
	}
	fields := make([]string, 0, 2*len(eps))
	for _, ep := range eps {
		fields = append(fields, "r:"+string(ep), "t:"+string(ep))
	}
	p := r.c.Pipeline()
	first := p.ZRangeWithScores(ctx, r.keys[1], 0, 0)
	tm := p.Time(ctx)
	vals := p.HMGet(ctx, r.keys[0], fields...)
	if err := execRound(ctx, r.c, p); err == nil { // with Match's first read, in a SharedRound
		fs := first.Val()
		if len(fs) == 0 || int64(fs[0].Score) > tm.Val().UnixMilli()+plainReadMargin(r.c) {
			for i, ep := range eps {
				var c Cost
				var ok1, ok2 bool
				c.Requests, ok1 = hashInt(vals.Val()[2*i])
				c.Tokens, ok2 = hashInt(vals.Val()[2*i+1])
				if !ok1 || !ok2 {
					return nil, fmt.Errorf("kvstore: redis in-flight: malformed counter of %q", ep)
				}
				if c != (Cost{}) {
					out[ep] = c
				}
			}
			return out, nil
		}
	} else if !redis.HasErrorPrefix(err, "WRONGTYPE") {
		return nil, fmt.Errorf("kvstore: redis in-flight: %w", err)
	}
	return r.inFlightScript(ctx, eps)
}

// hashInt parses an HMGET value: nil (no field) is 0.
func hashInt(v any) (int64, bool) {
	switch x := v.(type) {
	case nil:
		return 0, true
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		return n, err == nil
	}
	return 0, false
}

// inFlightScript is InFlight through the script (one EVALSHA: reap, then read).
func (r *RedisReservations) inFlightScript(ctx context.Context, eps []EndpointID) (map[EndpointID]Cost, error) {
	out := make(map[EndpointID]Cost, len(eps))
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
