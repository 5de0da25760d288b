package kvstore

import (
	"context"
	"errors"
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
	// SharedRecordMaxTTL: a Record with a ttl up to this is kept out of the block keys, in the memory of
	// every gateway on the same Redis and prefix (one PUBLISH on <Prefix>:v1:records; redis_records.go).
	// Longer ones are written into Redis. 0 means DefaultSharedRecordMaxTTL; negative: every Record is
	// written into Redis (the layout-v1 behaviour of earlier releases).
	SharedRecordMaxTTL time.Duration
	// IndexLayout selects the index's key layout (RATIONALE.md, "Redis layout 2"): 1 is layout 1 only (what
	// releases before layout 2 run), 2 is layout 2 only, and 0 follows the store's index-layout marker
	// (<Prefix>:v1:index-layout): until it says 2 (FinishLayoutUpgrade) the index is in the upgrade window —
	// Match reads layout 1 and every write goes to both layouts, so gateways of an older release and this
	// one find each other's entries — and from then on layout 2 only.
	IndexLayout int
}

func (c RedisConfig) base() (string, error) {
	p := c.Prefix
	if p == "" {
		p = DefaultRedisPrefix
	}
	if strings.ContainsAny(p, "{}") {
		return "", fmt.Errorf("kvstore: redis prefix %q contains a hash-tag brace: %w", p, ErrInvalidArgument)
	}
	if c.IndexLayout < 0 || c.IndexLayout > 2 {
		return "", fmt.Errorf("kvstore: redis index layout %d (want 0, 1 or 2): %w", c.IndexLayout, ErrInvalidArgument)
	}
	return p + ":" + LayoutVersion + ":", nil
}

// The v1 index scripts: scripts/index_lib.lua followed by each script's own file.
var (
	scriptIndexMatch          = script("index_lib", "index_match")
	scriptIndexAdd            = script("index_lib", "index_add")
	scriptIndexRemove         = script("index_lib", "index_remove")
	scriptIndexRecord         = script("index_lib", "index_record")
	scriptIndexClear          = script("index_lib", "index_clear")
	scriptIndexClearConfirmed = script("index_lib", "index_clear_confirmed")
	scriptIndexDemote         = script("index_lib", "index_demote")
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
	// bus keeps speculative records of up to recMax out of Redis (nil: SharedRecordMaxTTL < 0).
	bus    *recordBus
	recMax time.Duration
	v2State
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
	r := &RedisIndex{c: client, base: base, single: single, epCap: max(cfg.MaxEntriesPerEndpoint, 0)}
	r.base2 = strings.TrimSuffix(base, LayoutVersion+":") + "v2:"
	r.layout = cfg.IndexLayout
	if cfg.SharedRecordMaxTTL >= 0 {
		r.recMax = cfg.SharedRecordMaxTTL
		if r.recMax == 0 {
			r.recMax = DefaultSharedRecordMaxTTL
		}
		r.bus = newRecordBus(base + "records")
	}
	return r, nil
}

// Close stops the index's subscription to the shared speculative records and its reading of the store's
// index-layout marker (the client stays open). The index still answers afterwards, without the other
// gateways' records.
func (r *RedisIndex) Close() error {
	r.stopMarker()
	if r.bus == nil {
		return nil
	}
	return r.bus.close()
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

// matchProbe is how many blocks after block 0 Match reads on one server when it has no memo of the
// prompt's block 0, before it reads the rest (only if a run goes on to the last of them).
const matchProbe = 16

// Match implements Index. On one server it reads only the blocks up to the end of the longest run (and
// the block that ends it): a prompt whose block 0 nobody holds costs one GET; otherwise, with no memo of
// the prompt's block 0, the next 16 blocks, then the rest only if a run goes on to the 16th; with a memo
// (the longest run this index's last Match of the same block 0 found) block 0 up to that run's end and
// the block after it in the first round trip. On Redis Cluster, where TIME would go to a random node, one
// EVALSHA reads the clock, block 0, then the rest in chunks on the model's master, stopping after the
// first chunk that ends in a missing block.
func (r *RedisIndex) Match(ctx context.Context, model string, keys []BlockKey) ([]EndpointMatch, error) {
	if len(keys) == 0 || model == "" {
		return nil, nil
	}
	if r.layoutNow(ctx) == modeV2 {
		return r.matchV2(ctx, model, keys)
	}
	var local []string // the shared speculative records' live holds, per key, as block-value records
	var localAt func(now int64) []string
	if r.bus != nil {
		r.bus.start(r.c)
		localAt = func(now int64) []string { return r.bus.cache.live(model, keys, now) }
		local = localAt(0) // only to know whether block 0 has a hold; encoded again at the server's time
	}
	names, _ := r.blockKeys(model, nil, keys)
	var now int64
	var vals []any
	var err error
	if r.single {
		if local == nil {
			localAt = nil
		}
		now, vals, err = r.matchPipelined(ctx, model, keys[0], names, localAt)
	} else {
		now, vals, err = r.matchScript(ctx, names, local != nil)
	}
	if err != nil {
		return nil, err
	}
	if local != nil {
		local = localAt(now)
	}
	if local != nil {
		for len(vals) < len(keys) {
			vals = append(vals, nil)
		}
		for i, l := range local {
			if l != "" {
				s, _ := vals[i].(string)
				vals[i] = l + s // first: a live hold counts as GPU whatever the tiers say
			}
		}
	}
	out, err := matchRuns(now, vals)
	if err == nil && r.single {
		longest := 0
		for _, m := range out {
			longest = max(longest, m.GPUBlocks+m.CPUBlocks)
		}
		r.v1SetRun(model, keys[0], longest)
	}
	return out, err
}

// matchScript is Match's read on Redis Cluster: one EVALSHA on the model's master (ARGV[1] "all": read on
// past a missing block 0, which a shared record holds).
func (r *RedisIndex) matchScript(ctx context.Context, names []string, all bool) (int64, []any, error) {
	var args []any
	if all {
		args = []any{"all"}
	}
	res, err := scriptIndexMatch.Run(ctx, r.c, names, args...).Slice()
	if err != nil {
		return 0, nil, fmt.Errorf("kvstore: redis match: %w", err)
	}
	if len(res) != 2 {
		return 0, nil, fmt.Errorf("kvstore: redis match: reply of %d elements", len(res))
	}
	now, ok1 := res[0].(int64)
	vals, ok2 := res[1].([]any)
	if !ok1 || !ok2 {
		return 0, nil, fmt.Errorf("kvstore: redis match: unexpected reply types %T %T", res[0], res[1])
	}
	return now, vals, nil
}

// matchPipelined is Match's read on one server, without a script (the values cross no Lua boundary, which
// costs about as much Redis CPU as the MGET itself), in windows of blocks from block 0 (Match says which),
// each window one round trip, until no run goes on past the last block read (localAt, unless nil, gives
// the shared records' holds at a server time, which continue runs too). TIME is pipelined with the first
// window that may find a hold: not with a lone GET of block 0 (a miss is one command); then the clock is
// read a round trip after block 0, which only speculative expiry depends on (holds in Redis last ≥ 30 s).
// It returns the server time (ms; 0 when the clock was not needed: block 0 not held) and the blocks'
// values (string or nil) in prompt order, cut off after the window in which every run ended.
func (r *RedisIndex) matchPipelined(ctx context.Context, model string, k0 BlockKey, names []string, localAt func(int64) []string) (int64, []any, error) {
	n := len(names)
	hi := 1
	if run := r.v1RunOf(model, k0); run > 0 {
		hi = min(n, run+1)
	}
	var now int64
	timed := false
	var vals []any
	windows := 0
	read := func(lo, hi int, withTime bool) error {
		p := r.c.Pipeline()
		var tm *redis.TimeCmd
		if withTime {
			tm = p.Time(ctx)
		}
		var first *redis.StringCmd
		var gets []*redis.SliceCmd
		if hi-lo == 1 && lo == 0 {
			first = p.Get(ctx, names[0])
		} else {
			for i := lo; i < hi; i += matchChunk {
				gets = append(gets, p.MGet(ctx, names[i:min(i+matchChunk, hi)]...))
			}
		}
		if err := execRound(ctx, r.c, p); err != nil && !errors.Is(err, redis.Nil) { // the first, in a SharedRound
			return fmt.Errorf("kvstore: redis match: %w", err)
		}
		if tm != nil {
			if err := tm.Err(); err != nil {
				return fmt.Errorf("kvstore: redis match: %w", err)
			}
			now, timed = tm.Val().UnixMilli(), true
		}
		if first != nil {
			switch err := first.Err(); {
			case err == nil:
				vals = append(vals, first.Val())
			case errors.Is(err, redis.Nil):
				vals = append(vals, nil)
			default:
				return fmt.Errorf("kvstore: redis match: %w", err)
			}
		}
		for _, g := range gets {
			if err := g.Err(); err != nil {
				return fmt.Errorf("kvstore: redis match: %w", err)
			}
			vals = append(vals, g.Val()...)
		}
		return nil
	}
	// goesOn tells whether a run may go on past the blocks read: held through the last of them (before the
	// clock is read: every block read has a value or a shared record).
	goesOn := func() (bool, error) {
		if len(vals) >= n {
			return false, nil
		}
		var local []string
		if localAt != nil {
			local = localAt(now)
		}
		merged := vals
		if local != nil {
			merged = make([]any, len(vals))
			for i, v := range vals {
				s, _ := v.(string)
				merged[i] = local[i] + s
			}
		}
		if !timed {
			for _, v := range merged {
				if s, _ := v.(string); s == "" {
					return false, nil
				}
			}
			return true, nil
		}
		runs, err := matchRuns(now, merged)
		if err != nil {
			return false, err
		}
		for _, m := range runs {
			if m.GPUBlocks+m.CPUBlocks == len(vals) {
				return true, nil
			}
		}
		return false, nil
	}
	if err := read(0, hi, hi > 1 || n == 1 || localAt != nil); err != nil {
		return 0, nil, err
	}
	if hi > 1 {
		windows++
	}
	for {
		more, err := goesOn()
		if err != nil {
			return 0, nil, err
		}
		if !more {
			break
		}
		lo, hi := len(vals), n
		if windows == 0 {
			hi = min(n, lo+matchProbe)
		}
		if err := read(lo, hi, !timed); err != nil {
			return 0, nil, err
		}
		windows++
	}
	return now, vals, nil
}

// v1MaxRuns bounds the block-0 keys whose longest run Match remembers on layout 1 (emptied when full).
const v1MaxRuns = 1 << 16

// v1RunOf returns the longest run this index's last layout-1 Match of block 0 key k0 under model found
// (0: none remembered). Only a guess of how far to read in the first round trip.
func (r *RedisIndex) v1RunOf(model string, k0 BlockKey) int {
	r.emu.Lock()
	defer r.emu.Unlock()
	return r.runs1[recKey{model, k0}]
}

func (r *RedisIndex) v1SetRun(model string, k0 BlockKey, run int) {
	r.emu.Lock()
	defer r.emu.Unlock()
	rk := recKey{model, k0}
	if run == 0 {
		delete(r.runs1, rk)
		return
	}
	if r.runs1 == nil || len(r.runs1) >= v1MaxRuns {
		r.runs1 = map[recKey]int{}
	}
	r.runs1[rk] = run
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

// Add implements Index (one EVALSHA per writeSlice keys, pipelined in one round trip).
func (r *RedisIndex) Add(ctx context.Context, model string, ep EndpointID, tier Tier, keys []BlockKey) error {
	return r.addRemove(ctx, nil, "add", false, model, ep, tier, keys)
}

// Remove implements Index (one EVALSHA per writeSlice keys, pipelined in one round trip).
func (r *RedisIndex) Remove(ctx context.Context, model string, ep EndpointID, tier Tier, keys []BlockKey) error {
	return r.addRemove(ctx, nil, "remove", true, model, ep, tier, keys)
}

// addRemove is Add or Remove (remove set), fenced by f unless nil: one Update through apply.
func (r *RedisIndex) addRemove(ctx context.Context, f *Fence, op string, remove bool, model string, ep EndpointID, tier Tier, keys []BlockKey) error {
	if err := checkNames(op, model, ep); err != nil {
		return err
	}
	if err := checkTier(op, tier); err != nil {
		return err
	}
	return r.apply(ctx, f, op, model, []Update{{Endpoint: ep, Tier: tier, Remove: remove, Keys: keys}})
}

// Bounded work: no script this index runs visits more than this many blocks, so no Redis call runs longer
// than a few milliseconds whatever the input (issue 14; RATIONALE.md, "Bounded Redis calls"). Writes of
// more keys are split into several scripts pipelined in one round trip; clears, demotions and the
// per-endpoint cap work in slices of this size, one round trip each, until done.
const (
	writeSlice = 256
	clearSlice = 64
)

// scriptCall is one EVALSHA of a pipeline.
type scriptCall struct {
	s    *redis.Script
	keys []string
	args []any
}

// runScripts runs calls in one pipeline; on NOSCRIPT (a Redis restart or SCRIPT FLUSH) it loads the
// scripts and sends the whole pipeline again, which is safe because every write here is idempotent in
// sequence.
func (r *RedisIndex) runScripts(ctx context.Context, calls []scriptCall) error {
	if len(calls) == 1 {
		c := calls[0]
		return c.s.Run(ctx, r.c, c.keys, c.args...).Err()
	}
	send := func() error {
		p := r.c.Pipeline()
		for _, c := range calls {
			c.s.EvalSha(ctx, p, c.keys, c.args...)
		}
		_, err := p.Exec(ctx)
		return err
	}
	err := send()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		loaded := map[*redis.Script]bool{}
		for _, c := range calls {
			if loaded[c.s] {
				continue
			}
			loaded[c.s] = true
			if lerr := c.s.Load(ctx, r.c).Err(); lerr != nil {
				return fmt.Errorf("load script: %w", lerr)
			}
		}
		err = send()
	}
	return err
}

// Record implements Index. A ttl up to RedisConfig.SharedRecordMaxTTL is kept in this gateway's memory and
// published to the others (one PUBLISH; redis_records.go); a longer one is written into the block keys (one
// EVALSHA per writeSlice keys, pipelined), its TTL rounded up to whole milliseconds.
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
	if r.bus != nil && ttl <= r.recMax {
		// Kept out of Redis: in this gateway's memory now, in the others' once the PUBLISH reaches them.
		r.bus.start(r.c)
		r.bus.cache.record(model, ep, keys, r.bus.cache.now().Add(ttl))
		if err := r.c.Publish(ctx, r.bus.channel, encodeRecordMsg('R', r.bus.sender, ttl, model, ep, keys)).Err(); err != nil {
			return fmt.Errorf("kvstore: redis record: publish: %w", err)
		}
		return nil
	}
	ms := (ttl + time.Millisecond - 1) / time.Millisecond
	mode := r.layoutNow(ctx)
	if mode != modeV1 {
		if err := r.recordV2(ctx, model, ep, keys, int64(ms)); err != nil || mode == modeV2 {
			return err
		}
	}
	mp := r.modelPrefix(model)
	var calls []scriptCall
	for i := 0; i < len(keys); i += writeSlice {
		names, args := r.blockKeys(model, []string{mp + "s:" + string(ep)}, keys[i:min(i+writeSlice, len(keys))], string(ep), strconv.FormatInt(int64(ms), 10), mp+"b:")
		calls = append(calls, scriptCall{scriptIndexRecord, names, args})
	}
	if err := r.runScripts(ctx, calls); err != nil {
		return fmt.Errorf("kvstore: redis record: %w", err)
	}
	return nil
}

// sliced runs a slice script (it visits at most clearSlice blocks and returns how many members it left)
// until nothing is left, one round trip per slice. Writers that keep adding while it runs (a gateway's
// speculative Record during a ClearEndpoint) cannot keep it going for ever: it stops after the slices the
// first answer called for, plus 16.
func (r *RedisIndex) sliced(ctx context.Context, op string, s *redis.Script, keys []string, args []any) error {
	limit := int64(-1)
	for n := int64(0); ; n++ {
		left, err := s.Run(ctx, r.c, keys, args...).Int64()
		if err != nil {
			return redisErr(op, err)
		}
		if limit < 0 {
			limit = left/clearSlice + 16
		}
		if left == 0 || n >= limit {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("kvstore: redis %s: %w", op, err)
		}
	}
}

// ClearEndpoint implements Index, in slices of clearSlice blocks (one EVALSHA each), visiting only ep's own
// blocks through its reverse set and speculative ZSET (no keyspace scan). Not atomic as a whole: a Match
// meanwhile may see part of ep's entries gone.
func (r *RedisIndex) ClearEndpoint(ctx context.Context, model string, ep EndpointID) error {
	return r.clearEndpoint(ctx, nil, model, ep)
}

func (r *RedisIndex) clearEndpoint(ctx context.Context, f *Fence, model string, ep EndpointID) error {
	if err := checkNames("clear endpoint", model, ep); err != nil {
		return err
	}
	mode := r.layoutNow(ctx)
	if mode != modeV2 {
		mp := r.modelPrefix(model)
		s, names, args := r.fencedCall(model, f, scriptIndexClear, []string{mp + "e:" + string(ep), mp + "s:" + string(ep)}, []any{string(ep), mp + "b:", clearSlice})
		if err := r.sliced(ctx, "clear endpoint", s, names, args); err != nil {
			return err
		}
	}
	if mode != modeV1 {
		if err := r.clearEndpointV2(ctx, f, model, ep); err != nil {
			return err
		}
	}
	if r.bus != nil { // the shared speculative records of ep go too, here and in the other gateways
		r.bus.cache.clearEndpoint(model, ep)
		if err := r.c.Publish(ctx, r.bus.channel, encodeRecordMsg('C', r.bus.sender, 0, model, ep, nil)).Err(); err != nil {
			return fmt.Errorf("kvstore: redis clear endpoint: publish: %w", err)
		}
	}
	return nil
}

// ClearConfirmed implements Index, in slices of clearSlice blocks (one EVALSHA each), visiting the blocks on
// ep's reverse set, then the holds of its speculative ZSET that last longer than ClearKeepsHoldsWithin;
// live holds within that bound (and their ZSET members) stay.
func (r *RedisIndex) ClearConfirmed(ctx context.Context, model string, ep EndpointID) error {
	return r.clearConfirmed(ctx, nil, model, ep)
}

func (r *RedisIndex) clearConfirmed(ctx context.Context, f *Fence, model string, ep EndpointID) error {
	if err := checkNames("clear confirmed", model, ep); err != nil {
		return err
	}
	mode := r.layoutNow(ctx)
	if mode != modeV2 {
		mp := r.modelPrefix(model)
		s, names, args := r.fencedCall(model, f, scriptIndexClearConfirmed, []string{mp + "e:" + string(ep), mp + "s:" + string(ep)},
			[]any{string(ep), mp + "b:", clearSlice, ClearKeepsHoldsWithin.Milliseconds()})
		if err := r.sliced(ctx, "clear confirmed", s, names, args); err != nil {
			return err
		}
	}
	if mode == modeV1 {
		return nil
	}
	return r.slicedV2(ctx, "clear confirmed", f, model, ep, scriptIndex2ClearConfirmed, ClearKeepsHoldsWithin.Milliseconds())
}

// Demote implements Demoter, in slices of clearSlice blocks (one EVALSHA each), visiting only the blocks on
// ep's reverse set. TTLs are rounded up to whole milliseconds; expiry is on the Redis server's clock, like
// Record's.
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
	mode := r.layoutNow(ctx)
	if mode != modeV2 {
		mp := r.modelPrefix(model)
		s, names, args := r.fencedCall(model, f, scriptIndexDemote, []string{mp + "e:" + string(ep), mp + "s:" + string(ep)},
			[]any{string(ep), strconv.FormatInt(int64(ms), 10), mp + "b:", clearSlice})
		if err := r.sliced(ctx, "demote", s, names, args); err != nil {
			return err
		}
	}
	if mode == modeV1 {
		return nil
	}
	return r.slicedV2(ctx, "demote", f, model, ep, scriptIndex2Demote, int64(ms))
}
