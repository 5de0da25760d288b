package tpu

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/kvstore"
)

var (
	scriptRegister = luaScript("lib", "register")
	scriptHealth   = luaScript("lib", "health")
	scriptReserve  = luaScript("lib", "reserve")
	scriptRenew    = luaScript("lib", "renew")
	scriptRelease  = luaScript("lib", "release")
	scriptView     = luaScript("lib", "view")
)

// RedisOptions configure NewRedis.
type RedisOptions struct {
	// Prefix starts every key, as kvstore.RedisConfig.Prefix does (empty: kvstore.DefaultRedisPrefix).
	Prefix string
}

type redisBackend struct {
	c    redis.UniversalClient
	base string
}

// NewRedis returns an allocator on a Redis server or Cluster. Every mutation is one EVALSHA (go-redis falls
// back to EVAL on NOSCRIPT) over the pool's keys, which share the hash tag {tpu:<pool>}:
//
//	<prefix>:v1:{tpu:<pool>}:slices  HASH   slice ID -> slice JSON (spec plus geometry)
//	<prefix>:v1:{tpu:<pool>}:chips   HASH   slice ID -> per-chip owner token, 12 digits each, X-minor
//	<prefix>:v1:{tpu:<pool>}:health  HASH   slice ID -> per-worker '0' healthy / '1' unhealthy
//	<prefix>:v1:{tpu:<pool>}:leases  HASH   lease ID -> lease JSON
//	<prefix>:v1:{tpu:<pool>}:expiry  ZSET   lease ID by expiry (ms, Redis's clock)
//	<prefix>:v1:{tpu:<pool>}:fence   STRING fencing-token counter
//	<prefix>:v1:{tpu}:pools          SET    pool names (written before a pool's first registration)
func NewRedis(c redis.UniversalClient, o RedisOptions) (*Allocator, error) {
	p := o.Prefix
	if p == "" {
		p = kvstore.DefaultRedisPrefix
	}
	if strings.ContainsAny(p, "{}") {
		return nil, fmt.Errorf("tpu: redis prefix %q contains a hash-tag brace: %w", p, ErrInvalidArgument)
	}
	return newAllocator(&redisBackend{c: c, base: p + ":" + kvstore.LayoutVersion + ":"}), nil
}

func (b *redisBackend) keys(pool string) []string {
	k := b.base + "{tpu:" + pool + "}:"
	return []string{k + "slices", k + "chips", k + "health", k + "leases", k + "expiry", k + "fence"}
}

// run executes a script and splits its reply: reaped count, then the payload after 'ok', or the typed error.
func (b *redisBackend) run(ctx context.Context, s *redis.Script, pool string, args ...any) ([]any, int, error) {
	res, err := s.Run(ctx, b.c, b.keys(pool), args...).Slice()
	if err != nil {
		return nil, 0, fmt.Errorf("tpu: redis: %w", err)
	}
	if len(res) < 2 {
		return nil, 0, fmt.Errorf("tpu: redis: reply %v", res)
	}
	n, _ := res[0].(int64)
	if st, _ := res[1].(string); st == "err" && len(res) == 4 {
		code, _ := res[2].(string)
		msg, _ := res[3].(string)
		if e := codeErr(code); e != nil {
			return nil, int(n), fmt.Errorf("tpu: %s: %w", msg, e)
		}
		return nil, int(n), fmt.Errorf("tpu: redis: %s %s", code, msg)
	} else if st != "ok" {
		return nil, int(n), fmt.Errorf("tpu: redis: reply %v", res)
	}
	return res[2:], int(n), nil
}

func (b *redisBackend) register(ctx context.Context, pool string, r *sliceRec, h *holdRec) (bool, int, error) {
	j, err := json.Marshal(r)
	if err != nil {
		return false, 0, err
	}
	if err := b.c.SAdd(ctx, b.base+"{tpu}:pools", pool).Err(); err != nil {
		return false, 0, fmt.Errorf("tpu: redis: %w", err)
	}
	mask := []byte(strings.Repeat("0", len(r.Hosts)))
	var holder string
	var ttl int64
	if h != nil {
		for w, bad := range h.bad {
			if bad {
				mask[w] = '1'
			}
		}
		holder, ttl = h.holder, h.ttlMS
	}
	res, n, err := b.run(ctx, scriptRegister, pool, r.ID, string(j), r.shape.Chips(), string(mask), holder, ttl,
		leaseID(r.ID, Shape{N: r.N, D: r.D}, 0))
	if err != nil {
		return false, n, err
	}
	created := len(res) == 1 && res[0] == int64(1)
	return created, n, nil
}

func (b *redisBackend) setHealth(ctx context.Context, pool, slice, host string, healthy bool) (int, error) {
	h := "0"
	if healthy {
		h = "1"
	}
	_, n, err := b.run(ctx, scriptHealth, pool, slice, host, h)
	return n, err
}

func decodeLeaseSlice(res []any) (*leaseRec, *sliceRec, error) {
	if len(res) != 2 {
		return nil, nil, fmt.Errorf("tpu: redis: lease reply of %d elements", len(res))
	}
	lj, _ := res[0].(string)
	sj, _ := res[1].(string)
	var l leaseRec
	var r sliceRec
	if err := json.Unmarshal([]byte(lj), &l); err != nil {
		return nil, nil, fmt.Errorf("tpu: redis: lease %q: %w", lj, err)
	}
	if err := json.Unmarshal([]byte(sj), &r); err != nil {
		return nil, nil, fmt.Errorf("tpu: redis: slice %q: %w", sj, err)
	}
	return &l, &r, r.finish()
}

func (b *redisBackend) reserve(ctx context.Context, pool string, q *request) (*leaseRec, *sliceRec, int, error) {
	j, err := json.Marshal(q)
	if err != nil {
		return nil, nil, 0, err
	}
	res, n, err := b.run(ctx, scriptReserve, pool, string(j))
	if err != nil {
		return nil, nil, n, err
	}
	l, r, err := decodeLeaseSlice(res)
	return l, r, n, err
}

func (b *redisBackend) renew(ctx context.Context, pool, id string, token, ttlMS int64) (*leaseRec, *sliceRec, int, error) {
	res, n, err := b.run(ctx, scriptRenew, pool, id, strconv.FormatInt(token, 10), ttlMS)
	if err != nil {
		return nil, nil, n, err
	}
	l, r, err := decodeLeaseSlice(res)
	return l, r, n, err
}

func (b *redisBackend) release(ctx context.Context, pool, id string, token int64) (bool, int, error) {
	res, n, err := b.run(ctx, scriptRelease, pool, id, strconv.FormatInt(token, 10))
	if err != nil {
		return false, n, err
	}
	v, _ := res[0].(int64)
	return v == 1, n, nil
}

func pairs(v any) ([][2]string, error) {
	a, ok := v.([]any)
	if !ok || len(a)%2 != 0 {
		return nil, fmt.Errorf("tpu: redis: HGETALL reply %T", v)
	}
	out := make([][2]string, 0, len(a)/2)
	for i := 0; i < len(a); i += 2 {
		k, _ := a[i].(string)
		s, _ := a[i+1].(string)
		out = append(out, [2]string{k, s})
	}
	return out, nil
}

func (b *redisBackend) snapshot(ctx context.Context, pool string) (*poolState, int, error) {
	res, n, err := b.run(ctx, scriptView, pool)
	if err != nil {
		return nil, n, err
	}
	if len(res) != 4 {
		return nil, n, fmt.Errorf("tpu: redis: view reply of %d elements", len(res))
	}
	p := newPoolState()
	var hs [4][][2]string
	for i := range 4 {
		if hs[i], err = pairs(res[i]); err != nil {
			return nil, n, err
		}
	}
	for _, kv := range hs[0] {
		var r sliceRec
		if err := json.Unmarshal([]byte(kv[1]), &r); err != nil {
			return nil, n, fmt.Errorf("tpu: redis: slice %s: %w", kv[0], err)
		}
		if err := r.finish(); err != nil {
			return nil, n, err
		}
		p.slices[kv[0]] = &r
	}
	for _, kv := range hs[1] {
		s := kv[1]
		own := make([]int64, len(s)/12)
		for i := range own {
			own[i], _ = strconv.ParseInt(s[i*12:i*12+12], 10, 64)
		}
		p.owners[kv[0]] = own
	}
	for _, kv := range hs[2] {
		bad := make([]bool, len(kv[1]))
		for i := range bad {
			bad[i] = kv[1][i] == '1'
		}
		p.bad[kv[0]] = bad
	}
	for _, kv := range hs[3] {
		var l leaseRec
		if err := json.Unmarshal([]byte(kv[1]), &l); err != nil {
			return nil, n, fmt.Errorf("tpu: redis: lease %s: %w", kv[0], err)
		}
		p.leases[kv[0]] = &l
	}
	for id, r := range p.slices {
		if len(p.owners[id]) != r.shape.Chips() || len(p.bad[id]) != len(r.Hosts) {
			return nil, n, fmt.Errorf("tpu: redis: slice %s: chip or health state has the wrong length", id)
		}
	}
	return p, n, nil
}

func (b *redisBackend) pools(ctx context.Context) ([]string, error) {
	p, err := b.c.SMembers(ctx, b.base+"{tpu}:pools").Result()
	if err != nil {
		return nil, fmt.Errorf("tpu: redis: %w", err)
	}
	return p, nil
}

//go:embed scripts/*.lua
var scriptFS embed.FS

// luaScript is kvstore.LuaScript over this package's scripts directory (names without ".lua").
func luaScript(names ...string) *redis.Script {
	paths := make([]string, len(names))
	for i, n := range names {
		paths[i] = "scripts/" + n + ".lua"
	}
	return kvstore.LuaScript(scriptFS, paths...)
}
