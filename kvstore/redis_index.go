package kvstore

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// LayoutVersion is the version of the Redis key layout; it is part of every key name ("<prefix>:v1:...").
// Change it whenever the layout or the block-key definition changes, so old and new gateways never read
// each other's keys.
const LayoutVersion = "v1"

// DefaultRedisPrefix is RedisConfig.Prefix's default.
const DefaultRedisPrefix = "kvg"

// RedisConfig configures the Redis backends.
type RedisConfig struct {
	// Prefix starts every key name, before the layout version: "<Prefix>:v1:...". It must not contain '{'
	// or '}'. Empty means DefaultRedisPrefix.
	Prefix string
	// MaxEntriesPerEndpoint bounds the blocks one (model, endpoint) holds on a tier (its reverse SET);
	// an Add past it drops random ones of the endpoint's blocks (SPOP) down to the bound, in the same script.
	// Speculative and unconfirmed holds are bounded by their TTLs instead. 0: no bound.
	MaxEntriesPerEndpoint int
}

func (c RedisConfig) base() (string, error) {
	p := c.Prefix
	if p == "" {
		p = DefaultRedisPrefix
	}
	if strings.ContainsAny(p, "{}") {
		return "", fmt.Errorf("kvstore: redis prefix %q contains a hash-tag brace: %w", p, ErrInvalidArgument)
	}
	return p + ":" + LayoutVersion + ":", nil
}

var (
	//go:embed scripts/index_lib.lua
	luaIndexLib string
	//go:embed scripts/index_match.lua
	luaIndexMatch string
	//go:embed scripts/index_add.lua
	luaIndexAdd string
	//go:embed scripts/index_remove.lua
	luaIndexRemove string
	//go:embed scripts/index_record.lua
	luaIndexRecord string
	//go:embed scripts/index_clear.lua
	luaIndexClear string
	//go:embed scripts/index_clear_confirmed.lua
	luaIndexClearConfirmed string
	//go:embed scripts/index_demote.lua
	luaIndexDemote string

	scriptIndexMatch  = redis.NewScript(luaIndexLib + luaIndexMatch)
	scriptIndexAdd    = redis.NewScript(luaIndexLib + luaIndexAdd)
	scriptIndexRemove = redis.NewScript(luaIndexLib + luaIndexRemove)
	scriptIndexRecord = redis.NewScript(luaIndexLib + luaIndexRecord)
	scriptIndexClear  = redis.NewScript(luaIndexLib + luaIndexClear)

	scriptIndexClearConfirmed = redis.NewScript(luaIndexLib + luaIndexClearConfirmed)
	scriptIndexDemote         = redis.NewScript(luaIndexLib + luaIndexDemote)
)

// RedisIndex is the Redis Index. Every call is one Lua script (one round trip), and all keys of one model
// share the hash tag {model}, so on Redis Cluster a request's match and writes touch a single hash slot.
//
// Key layout (v1), with base = "<Prefix>:v1:":
//
//	<base>{<model>}:b:<block key, 16 hex digits>  STRING records "<endpoint>\t<v>\n", v = expiresMs*4 + tier
//	                                                      bits (1 GPU, 2 CPU); expiresMs > now: live speculative
//	<base>{<model>}:e:<endpoint>                   SET   block IDs (hex) the endpoint holds on a tier
//	<base>{<model>}:s:<endpoint>                   ZSET  block IDs with speculative holds, scored by expiry ms
//	<base>{<model>}:f:<scope>                      STRING newest fencing token of an ingestion lease scope (Fencer)
//
// Speculative expiry uses the Redis server's clock (TIME). See kvstore/RATIONALE.md.
type RedisIndex struct {
	c    redis.UniversalClient
	base string
	// single is set for a client of one server (not *redis.ClusterClient or *redis.Ring): Match then
	// pipelines MGET and TIME instead of running a script.
	single bool
	epCap  int // RedisConfig.MaxEntriesPerEndpoint
}

var _ Index = (*RedisIndex)(nil)

// NewRedisIndex returns a Redis index on client (a *redis.Client, *redis.ClusterClient or any
// UniversalClient). It fails only for an invalid cfg.Prefix; it does not contact Redis.
func NewRedisIndex(client redis.UniversalClient, cfg RedisConfig) (*RedisIndex, error) {
	base, err := cfg.base()
	if err != nil {
		return nil, err
	}
	single := true
	switch client.(type) {
	case *redis.ClusterClient, *redis.Ring:
		single = false
	}
	return &RedisIndex{c: client, base: base, single: single, epCap: max(cfg.MaxEntriesPerEndpoint, 0)}, nil
}

// modelPrefix returns "<base>{<model>}:".
func (r *RedisIndex) modelPrefix(model string) string {
	return r.base + "{" + model + "}:"
}

// BlockKeyName returns the Redis key name of one block of model (for tests and operators).
func (r *RedisIndex) BlockKeyName(model string, k BlockKey) string {
	return r.modelPrefix(model) + "b:" + blockID(k)
}

func blockID(k BlockKey) string {
	var b [16]byte
	const hexd = "0123456789abcdef"
	for i := 15; i >= 0; i-- {
		b[i] = hexd[k&0xf]
		k >>= 4
	}
	return string(b[:])
}

// blockKeys returns head followed by the block key names of keys, and the block IDs as script arguments
// after pre.
func (r *RedisIndex) blockKeys(model string, head []string, keys []BlockKey, pre ...any) ([]string, []any) {
	mp := r.modelPrefix(model) + "b:"
	names := make([]string, 0, len(head)+len(keys))
	names = append(names, head...)
	args := make([]any, 0, len(pre)+len(keys))
	args = append(args, pre...)
	for _, k := range keys {
		id := blockID(k)
		names = append(names, mp+id)
		args = append(args, id)
	}
	return names, args
}

// matchChunk is the most block keys one MGET of Match asks for.
const matchChunk = 4000

// Match implements Index in one round trip, the runs computed here from the blocks' values. On one server
// it pipelines MGET (chunks of 4,000 keys) and TIME; on Redis Cluster, where TIME would go to a random
// node, one EVALSHA reads the clock and MGETs the blocks on the model's master (it stops after the first
// chunk that ends in a missing block).
func (r *RedisIndex) Match(ctx context.Context, model string, keys []BlockKey) ([]EndpointMatch, error) {
	if len(keys) == 0 || model == "" {
		return nil, nil
	}
	names, _ := r.blockKeys(model, nil, keys)
	if r.single {
		return r.matchPipelined(ctx, names)
	}
	res, err := scriptIndexMatch.Run(ctx, r.c, names).Slice()
	if err != nil {
		return nil, fmt.Errorf("kvstore: redis match: %w", err)
	}
	if len(res) != 2 {
		return nil, fmt.Errorf("kvstore: redis match: reply of %d elements", len(res))
	}
	now, ok1 := res[0].(int64)
	vals, ok2 := res[1].([]any)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("kvstore: redis match: unexpected reply types %T %T", res[0], res[1])
	}
	return matchRuns(now, vals)
}

// matchPipelined is Match on one server: MGETs and TIME in one pipeline (no script: the values cross no
// Lua boundary, which costs about as much Redis CPU as the MGET itself). The clock is read right after the
// blocks, in the same single-threaded server; only speculative expiry depends on it.
func (r *RedisIndex) matchPipelined(ctx context.Context, names []string) ([]EndpointMatch, error) {
	p := r.c.Pipeline()
	gets := make([]*redis.SliceCmd, 0, (len(names)+matchChunk-1)/matchChunk)
	for i := 0; i < len(names); i += matchChunk {
		gets = append(gets, p.MGet(ctx, names[i:min(i+matchChunk, len(names))]...))
	}
	tm := p.Time(ctx)
	if _, err := p.Exec(ctx); err != nil {
		return nil, fmt.Errorf("kvstore: redis match: %w", err)
	}
	now := tm.Val().UnixMilli()
	vals := gets[0].Val()
	for _, g := range gets[1:] {
		if len(vals) > 0 && vals[len(vals)-1] == nil {
			break // the runs end before this chunk
		}
		vals = append(vals, g.Val()...)
	}
	return matchRuns(now, vals)
}

// matchRuns computes the prefix runs from the blocks' values (string, or nil for a missing block) in
// prompt order, at server time now (ms).
func matchRuns(now int64, vals []any) ([]EndpointMatch, error) {
	var out []EndpointMatch
	var alive []bool
	nalive := 0
	for i, raw := range vals {
		s, _ := raw.(string)
		if s == "" {
			break
		}
		var seen [64]bool // per run index (runs beyond 64 are tracked by the slow path below)
		var seenMore map[int]bool
		for len(s) > 0 {
			nl := strings.IndexByte(s, '\n')
			tab := strings.IndexByte(s, '\t')
			if nl < 0 || tab < 0 || tab > nl {
				return nil, fmt.Errorf("kvstore: redis match: malformed block value")
			}
			ep, num := s[:tab], s[tab+1:nl]
			s = s[nl+1:]
			v, err := strconv.ParseInt(num, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("kvstore: redis match: malformed block value: %w", err)
			}
			tiers := v & 3
			gpu := tiers&1 != 0 || v>>2 > now
			cpu := tiers&2 != 0
			if !gpu && !cpu {
				continue
			}
			ri := -1
			for j := range out {
				if string(out[j].Endpoint) == ep {
					ri = j
					break
				}
			}
			if i == 0 {
				if ri >= 0 {
					continue // duplicate record; first wins
				}
				out = append(out, EndpointMatch{Endpoint: EndpointID(ep)})
				alive = append(alive, true)
				nalive++
				ri = len(out) - 1
			} else if ri < 0 || !alive[ri] {
				continue
			}
			if ri < len(seen) {
				if seen[ri] {
					continue
				}
				seen[ri] = true
			} else {
				if seenMore == nil {
					seenMore = map[int]bool{}
				}
				if seenMore[ri] {
					continue
				}
				seenMore[ri] = true
			}
			if gpu {
				out[ri].GPUBlocks++
			} else {
				out[ri].CPUBlocks++
			}
		}
		for j := range out {
			held := (j < len(seen) && seen[j]) || seenMore[j]
			if alive[j] && !held {
				alive[j] = false
				nalive--
			}
		}
		if nalive == 0 {
			break
		}
	}
	return out, nil
}

// Add implements Index (one EVALSHA).
func (r *RedisIndex) Add(ctx context.Context, model string, ep EndpointID, tier Tier, keys []BlockKey) error {
	return r.addRemove(ctx, nil, "add", scriptIndexAdd, model, ep, tier, keys)
}

// Remove implements Index (one EVALSHA).
func (r *RedisIndex) Remove(ctx context.Context, model string, ep EndpointID, tier Tier, keys []BlockKey) error {
	return r.addRemove(ctx, nil, "remove", scriptIndexRemove, model, ep, tier, keys)
}

// addRemove is Add (s = scriptIndexAdd) or Remove, fenced by f unless nil.
func (r *RedisIndex) addRemove(ctx context.Context, f *Fence, op string, s *redis.Script, model string, ep EndpointID, tier Tier, keys []BlockKey) error {
	if err := checkNames(op, model, ep); err != nil {
		return err
	}
	if err := checkTier(op, tier); err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}
	names, args := r.blockKeys(model, []string{r.modelPrefix(model) + "e:" + string(ep)}, keys, string(ep), int(tier))
	if s == scriptIndexAdd {
		args = append(args, r.epCap) // the endpoint's cap (index_add.lua), before the fence's argument
	}
	s, names, args = r.fencedCall(model, f, s, names, args)
	if err := s.Run(ctx, r.c, names, args...).Err(); err != nil {
		return redisErr(op, err)
	}
	return nil
}

// Record implements Index (one EVALSHA). TTLs are rounded up to whole milliseconds.
func (r *RedisIndex) Record(ctx context.Context, model string, ep EndpointID, keys []BlockKey, ttl time.Duration) error {
	if err := checkNames("record", model, ep); err != nil {
		return err
	}
	if ttl <= 0 {
		return fmt.Errorf("kvstore: record: ttl %v: %w", ttl, ErrInvalidArgument)
	}
	if len(keys) == 0 {
		return nil
	}
	ms := (ttl + time.Millisecond - 1) / time.Millisecond
	mp := r.modelPrefix(model)
	names, args := r.blockKeys(model, []string{mp + "s:" + string(ep)}, keys, string(ep), strconv.FormatInt(int64(ms), 10), mp+"b:")
	if err := scriptIndexRecord.Run(ctx, r.c, names, args...).Err(); err != nil {
		return fmt.Errorf("kvstore: redis record: %w", err)
	}
	return nil
}

// ClearEndpoint implements Index (one EVALSHA, visiting only ep's own blocks through its reverse set and
// speculative ZSET; no keyspace scan).
func (r *RedisIndex) ClearEndpoint(ctx context.Context, model string, ep EndpointID) error {
	return r.clearEndpoint(ctx, nil, model, ep)
}

func (r *RedisIndex) clearEndpoint(ctx context.Context, f *Fence, model string, ep EndpointID) error {
	if err := checkNames("clear endpoint", model, ep); err != nil {
		return err
	}
	mp := r.modelPrefix(model)
	s, names, args := r.fencedCall(model, f, scriptIndexClear, []string{mp + "e:" + string(ep), mp + "s:" + string(ep)}, []any{string(ep), mp + "b:"})
	if err := s.Run(ctx, r.c, names, args...).Err(); err != nil {
		return redisErr("clear endpoint", err)
	}
	return nil
}

// ClearConfirmed implements Index (one EVALSHA, visiting only the blocks on ep's reverse set; its
// speculative ZSET and live speculative holds stay).
func (r *RedisIndex) ClearConfirmed(ctx context.Context, model string, ep EndpointID) error {
	return r.clearConfirmed(ctx, nil, model, ep)
}

func (r *RedisIndex) clearConfirmed(ctx context.Context, f *Fence, model string, ep EndpointID) error {
	if err := checkNames("clear confirmed", model, ep); err != nil {
		return err
	}
	mp := r.modelPrefix(model)
	s, names, args := r.fencedCall(model, f, scriptIndexClearConfirmed, []string{mp + "e:" + string(ep)}, []any{string(ep), mp + "b:"})
	if err := s.Run(ctx, r.c, names, args...).Err(); err != nil {
		return redisErr("clear confirmed", err)
	}
	return nil
}

// Demote implements Demoter (one EVALSHA, visiting only the blocks on ep's reverse set). TTLs are rounded up
// to whole milliseconds; expiry is on the Redis server's clock, like Record's.
func (r *RedisIndex) Demote(ctx context.Context, model string, ep EndpointID, ttl time.Duration) error {
	return r.demote(ctx, nil, model, ep, ttl)
}

func (r *RedisIndex) demote(ctx context.Context, f *Fence, model string, ep EndpointID, ttl time.Duration) error {
	if err := checkNames("demote", model, ep); err != nil {
		return err
	}
	if ttl <= 0 {
		return fmt.Errorf("kvstore: demote: ttl %v: %w", ttl, ErrInvalidArgument)
	}
	ms := (ttl + time.Millisecond - 1) / time.Millisecond
	mp := r.modelPrefix(model)
	s, names, args := r.fencedCall(model, f, scriptIndexDemote, []string{mp + "e:" + string(ep), mp + "s:" + string(ep)},
		[]any{string(ep), strconv.FormatInt(int64(ms), 10), mp + "b:"})
	if err := s.Run(ctx, r.c, names, args...).Err(); err != nil {
		return redisErr("demote", err)
	}
	return nil
}
