package kvstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Layout 2 of the Redis index (RATIONALE.md, "Redis layout 2"). With base2 = "<Prefix>:v2:":
//
//	<base2>{<fff>:<model>}:h:<endpoint>  HASH  the endpoint's blocks of prompt family fff (3 hex digits):
//	                                           field <8-byte block key, big-endian> = 1 byte of tier bits,
//	                                           written by the endpoint's ingester with plain HSET/HDEL;
//	                                           field <8-byte key>"s" = a hold's expiry (server ms, decimal),
//	                                           written by scripts (Record above SharedRecordMaxTTL, Demote)
//	                                           field "~s" = "1": the holds marker, set by those scripts
//	                                           (Match reads hold fields only where it is set); field "~":
//	                                           the wide field (v2WideAt)
//	<base2>{<model>}:eps                 SET   endpoints with entries under model (read by Match, cached 1 s)
//	<base2>{<model>}:fh:<endpoint>       SET   families (3 hex) where the endpoint has a HASH (for clears)
//	<base2>{<model>}:n:<endpoint>        STRING the endpoint's confirmed entries (for the per-endpoint cap)
//
// The fence of an ingestion scope stays layout 1's key (<Prefix>:v1:{<model>}:f:<scope>, the model slot),
// so gateways of both layouts share fences during a rolling upgrade.

const (
	// indexLayoutMarker is the store's index-layout marker, "<Prefix>:v1:index-layout": "2" once the
	// operator has finished a rolling upgrade (see RedisConfig.IndexLayout).
	indexLayoutMarker = "index-layout"
	// v2ReadChunk is the most blocks one HMGET of Match reads (two fields each).
	v2ReadChunk = 512
	// v2ProbeBlocks is how many blocks after block 0 Match reads of a holder it did not expect, before it
	// reads the rest of the prompt (only if the holder's run goes on to the last of them).
	v2ProbeBlocks = 16
	// v2WriteChunk is the most fields one HSET or HDEL of a write carries.
	v2WriteChunk = 256
	// v2ScanCount is the HSCAN COUNT of one clear or demote slice.
	v2ScanCount = 128
	// v2FamilyBatch is how many families one round trip of a clear or demote works on.
	v2FamilyBatch = 32
	// v2WideAt: a family HASH reaching this many fields gets the wide field (v2WideField = v2WideValue),
	// whose value is longer than Redis's hash-max-listpack-value (64 bytes), so the HASH leaves the compact
	// listpack encoding, whose lookups are linear in its size, for a hash table (RATIONALE.md, "Redis layout
	// 2": measured).
	v2WideAt    = 32
	v2WideField = "~"
	// v2HoldsField marks a family HASH in which a script has written a hold field (Record above
	// SharedRecordMaxTTL, Demote): Match reads the hold fields of a HASH only when it carries it.
	v2HoldsField = "~s"
)

// v2WideValue is v2WideField's value: 65 bytes.
var v2WideValue = strings.Repeat("-", 65)

var (
	// The wide field's name and value are the scripts' too (index2_lib.lua: wide).
	scriptIndex2Record         = script("index2_lib", "index2_record")
	scriptIndex2Demote         = script("index2_lib", "index2_demote")
	scriptIndex2ClearConfirmed = script("index2_lib", "index2_clear_confirmed")
	scriptIndex2Evict          = script("index2_evict")
	index2Scripts              = []*redis.Script{scriptIndex2Record, scriptIndex2Demote, scriptIndex2ClearConfirmed, scriptIndex2Evict}
)

// index layouts in effect (RedisIndex.layoutNow).
const (
	modeV1   = 1 // layout 1 only
	modeV2   = 2 // layout 2 only
	modeDual = 3 // upgrade window: Match reads layout 1, writes go to both
)

// layoutNow returns the layout in effect: the configured one, or (IndexLayout 0) the store marker's, read
// at the first call and then once a second by a goroutine (stopped by Close).
func (r *RedisIndex) layoutNow(ctx context.Context) int {
	switch r.layout {
	case 1:
		return modeV1
	case 2:
		return modeV2
	}
	r.lmu.Lock()
	m := r.lmode
	if m == 0 && !r.lstarted {
		r.lstarted = true
		r.lstop = make(chan struct{})
		r.lmu.Unlock()
		r.readMarker(ctx)
		go r.followMarker(r.lstop)
		r.lmu.Lock()
		m = r.lmode
	}
	r.lmu.Unlock()
	if m == 0 {
		return modeDual // marker not read yet: the safe side of the upgrade
	}
	return m
}

// followMarker reads the store's index-layout marker every second until stop is closed or the marker says 2.
func (r *RedisIndex) followMarker(stop chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r.readMarker(ctx)
		cancel()
		r.lmu.Lock()
		done := r.lmode == modeV2
		r.lmu.Unlock()
		if done {
			return
		}
	}
}

func (r *RedisIndex) readMarker(ctx context.Context) {
	v, err := r.c.Get(ctx, r.base+indexLayoutMarker).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return // keep what was in effect; read again in a second
	}
	r.lmu.Lock()
	defer r.lmu.Unlock()
	if v == "2" {
		r.lmode = modeV2
	} else if r.lmode != modeV2 { // never back: the marker is only raised
		r.lmode = modeDual
	}
}

// stopMarker stops followMarker (Close).
func (r *RedisIndex) stopMarker() {
	r.lmu.Lock()
	defer r.lmu.Unlock()
	if r.lstop != nil {
		close(r.lstop)
		r.lstop = nil
	}
}

// Layout returns the index layout in effect: 1, 2, or 0 for the upgrade window (layout 1 read, both
// written). With RedisConfig.IndexLayout 0 it follows the store's marker (read at most a second ago).
func (r *RedisIndex) Layout(ctx context.Context) int {
	if m := r.layoutNow(ctx); m != modeDual {
		return m
	}
	return 0
}

// IndexLayoutKeyName returns the store's index-layout marker key ("<Prefix>:v1:index-layout").
func (r *RedisIndex) IndexLayoutKeyName() string { return r.base + indexLayoutMarker }

// FinishLayoutUpgrade sets the store's index-layout marker to 2: gateways following it (IndexLayout 0)
// read and write layout 2 only from their next check (within a second). Run it once no gateway of a
// release before layout 2 uses the store (RATIONALE.md, "Rolling upgrade to layout 2").
func (r *RedisIndex) FinishLayoutUpgrade(ctx context.Context) error {
	if err := r.c.Set(ctx, r.base+indexLayoutMarker, "2", 0).Err(); err != nil {
		return fmt.Errorf("kvstore: redis finish layout upgrade: %w", err)
	}
	r.lmu.Lock()
	r.lmode = modeV2
	r.lmu.Unlock()
	return nil
}

func familyHex(f Family) string {
	const hexd = "0123456789abcdef"
	return string([]byte{hexd[f>>8&0xf], hexd[f>>4&0xf], hexd[f&0xf]})
}

// v2Hash returns the name of ep's family HASH for family f under model.
func (r *RedisIndex) v2Hash(model string, f Family, ep EndpointID) string {
	return r.base2 + "{" + familyHex(f) + ":" + model + "}:h:" + string(ep)
}

func (r *RedisIndex) v2HashHex(model, fhex string, ep EndpointID) string {
	return r.base2 + "{" + fhex + ":" + model + "}:h:" + string(ep)
}

// v2Model returns a layout-2 key in model's own slot (the slot of the layout-1 fence keys).
func (r *RedisIndex) v2Model(model, name string) string { return r.base2 + "{" + model + "}:" + name }

// FamilyHashName returns the layout-2 HASH of ep's blocks of family f under model (for tests and operators).
func (r *RedisIndex) FamilyHashName(model string, f Family, ep EndpointID) string {
	return r.v2Hash(model, f, ep)
}

func keyField(k BlockKey) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(k))
	return string(b[:])
}

func holdField(k BlockKey) string {
	var b [9]byte
	binary.BigEndian.PutUint64(b[:], uint64(k))
	b[8] = 's'
	return string(b[:])
}

// v2Eps is Match's cache of a model's endpoint registry.
type v2Eps struct {
	eps []EndpointID
	at  time.Time
}

// v2Endpoints returns the endpoints with entries under model: the registry SET, read again when the copy
// is older than a second, plus those this index wrote since.
func (r *RedisIndex) v2Endpoints(ctx context.Context, model string) ([]EndpointID, error) {
	r.emu.Lock()
	c, ok := r.eps[model]
	r.emu.Unlock()
	if ok && time.Since(c.at) < time.Second {
		return c.eps, nil
	}
	ms, err := r.c.SMembers(ctx, r.v2Model(model, "eps")).Result()
	if err != nil {
		return nil, fmt.Errorf("kvstore: redis match: %w", err)
	}
	eps := make([]EndpointID, len(ms))
	for i, m := range ms {
		eps[i] = EndpointID(m)
	}
	r.emu.Lock()
	if r.eps == nil {
		r.eps = map[string]v2Eps{}
	}
	r.eps[model] = v2Eps{eps, time.Now()}
	r.emu.Unlock()
	return eps, nil
}

// noteEndpoint adds ep to the cached registry of model (this index just wrote it to the store).
func (r *RedisIndex) noteEndpoint(model string, ep EndpointID) {
	r.emu.Lock()
	defer r.emu.Unlock()
	c, ok := r.eps[model]
	if !ok {
		return
	}
	for _, e := range c.eps {
		if e == ep {
			return
		}
	}
	c.eps = append(append([]EndpointID(nil), c.eps...), ep)
	r.eps[model] = c
}

func (r *RedisIndex) forgetEndpoint(model string, ep EndpointID) {
	r.emu.Lock()
	defer r.emu.Unlock()
	delete(r.eps, model)
}

// matchV2 is Match on layout 2: all reads in the slot of keys[0]'s family, and of each holder only the
// blocks up to the end of its run (plus the block that ends it). Round 1 pipelines TIME and, per candidate
// (registered endpoints and the shared records' holders of block 0), one HMGET of the HASH's holds marker
// and block 0's two fields; for a candidate expected to hold block 0 (this index's last Match of the same
// block 0 found it: v2Hints, or a live shared record of it) the same HMGET also reads the next blocks up to
// the end of the run it had then (or the shared records' run), and the block after it: their tier fields,
// and their hold fields when the HASH had holds then. A later round reads on only for a holder whose run
// is still going at the end of what was read: v2ProbeBlocks more blocks of a holder read only at block 0,
// then the rest of the prompt. So an unseen prompt costs one key lookup per candidate; a prompt whose
// runs end where they ended last time one round trip; and a new prompt behind a known system prompt reads
// each holder's system prompt and one block more, not the whole prompt.
func (r *RedisIndex) matchV2(ctx context.Context, model string, keys []BlockKey) ([]EndpointMatch, error) {
	fam := FamilyOf(keys[0])
	eps, err := r.v2Endpoints(ctx, model)
	if err != nil {
		return nil, err
	}
	var bus [][]EndpointID // the shared records' live holders per key
	if r.bus != nil {
		r.bus.start(r.c)
		bus = r.bus.cache.liveHolders(model, keys)
	}
	busHolds := func(i int, ep EndpointID) bool {
		if bus == nil {
			return false
		}
		for _, e := range bus[i] {
			if e == ep {
				return true
			}
		}
		return false
	}
	busRun := func(ep EndpointID) int { // blocks from block 0 the shared records hold for ep
		i := 0
		for i < len(keys) && busHolds(i, ep) {
			i++
		}
		return i
	}
	cands := eps
	if bus != nil && len(bus[0]) > 0 { // holders known only from the shared records are read too
		cands = append([]EndpointID(nil), eps...)
		for _, ep := range bus[0] {
			if !slices.Contains(cands, ep) {
				cands = append(cands, ep)
			}
		}
	}
	if len(cands) == 0 {
		return nil, nil
	}
	hints := r.v2HintsOf(model, keys[0])
	n := len(keys)
	type run struct {
		ep      EndpointID
		hk      string
		marked  bool // the HASH carries the holds marker
		read    int  // blocks [0, read) are known: tier fields, and hold fields when marked
		end     int  // the run's end within [0, read): the first block not held, or read
		windows int  // reads past block 0 so far
		tiers   []byte
		live    []bool
		cmds    []*redis.SliceCmd
		lo, hi  int  // the window being read: blocks [lo, hi)
		holdsQ  bool // its hold fields are read
		hold0   any  // block 0's hold field, kept to be judged when round 1 did not read the clock
	}
	// hmget queues HMGETs of fields (split every 2*v2ReadChunk fields) on hk.
	hmget := func(p redis.Pipeliner, hk string, fields []string) []*redis.SliceCmd {
		var cmds []*redis.SliceCmd
		for i := 0; i < len(fields); i += 2 * v2ReadChunk {
			cmds = append(cmds, p.HMGet(ctx, hk, fields[i:min(i+2*v2ReadChunk, len(fields))]...))
		}
		return cmds
	}
	// window appends the fields of blocks [lo, hi): per block its tier field, and its hold field if holds.
	window := func(fields []string, lo, hi int, holds bool) []string {
		for _, k := range keys[lo:hi] {
			fields = append(fields, keyField(k))
			if holds {
				fields = append(fields, holdField(k))
			}
		}
		return fields
	}
	// fill reads the values of window(lo, hi, holds) from vals into rn.
	fill := func(rn *run, vals []any, lo, hi int, holds bool, now int64) {
		o := 0
		for i := lo; i < hi; i++ {
			if o < len(vals) {
				if s, ok := vals[o].(string); ok && len(s) == 1 {
					rn.tiers[i] = s[0] & 3
				}
			}
			o++
			if holds {
				if o < len(vals) {
					if s, ok := vals[o].(string); ok {
						if exp, err := strconv.ParseInt(s, 10, 64); err == nil && exp > now {
							rn.live[i] = true
						}
					}
				}
				o++
			}
		}
	}
	// ends sets rn.end: the first block of [0, rn.read) that rn.ep does not hold, or rn.read.
	ends := func(rn *run) {
		rn.end = rn.read
		for i := 0; i < rn.read; i++ {
			if rn.tiers[i]&3 == 0 && !rn.live[i] && !busHolds(i, rn.ep) {
				rn.end = i
				return
			}
		}
	}
	vals := func(cmds []*redis.SliceCmd) []any {
		if len(cmds) == 1 {
			return cmds[0].Val()
		}
		var vs []any
		for _, c := range cmds {
			vs = append(vs, c.Val()...)
		}
		return vs
	}
	// Round 1. TIME only when a hold may be judged here: not for a lone block 0 of a longer prompt (a miss
	// is then HMGETs only; a hold of block 0 is judged at the next round's clock, a round trip later).
	p := r.c.Pipeline()
	runs := make([]*run, len(cands))
	timed := n == 1
	for j, ep := range cands {
		h := hints[ep]
		rn := &run{ep: ep, hk: r.v2Hash(model, fam, ep), lo: 1, hi: 1}
		fields := []string{v2HoldsField, keyField(keys[0]), holdField(keys[0])}
		if want := max(h.run, busRun(ep)); want > 0 && n > 1 {
			rn.hi, rn.holdsQ = min(n, want+1), h.holds
			fields = window(fields, 1, rn.hi, rn.holdsQ)
			timed = true
		}
		rn.cmds = hmget(p, rn.hk, fields)
		runs[j] = rn
	}
	var tm *redis.TimeCmd
	if timed {
		tm = p.Time(ctx)
	}
	if err := execRound(ctx, r.c, p); err != nil { // with the in-flight read, in a SharedRound
		return nil, fmt.Errorf("kvstore: redis match: %w", err)
	}
	var now int64 // 0 until the clock is read: every hold counts as live meanwhile
	if tm != nil {
		now = tm.Val().UnixMilli()
	}
	var held []*run
	for _, rn := range runs {
		vs := vals(rn.cmds)
		rn.cmds = nil
		if len(vs) < 3 {
			continue
		}
		rn.marked = vs[0] != nil
		t, live := parseV2(vs, 1, now)
		if t == 0 && !live && !busHolds(0, rn.ep) {
			continue
		}
		rn.tiers, rn.live = make([]byte, n), make([]bool, n)
		rn.tiers[0], rn.live[0], rn.hold0 = t, live, vs[2]
		rn.read = 1
		if rn.hi > 1 {
			rn.windows = 1
			if rn.holdsQ || !rn.marked { // else the hold fields of the window are missing: read again
				fill(rn, vs[3:], 1, rn.hi, rn.holdsQ, now)
				rn.read = rn.hi
			}
		}
		ends(rn)
		held = append(held, rn)
	}
	if len(held) == 0 {
		r.v2SetHints(model, keys[0], nil)
		return nil, nil
	}
	// Later rounds: only holders whose run reaches the end of what was read, and only while it goes on.
	for {
		var p redis.Pipeliner
		for _, rn := range held {
			if rn.end < rn.read || rn.read == n {
				continue
			}
			if p == nil {
				p = r.c.Pipeline()
			}
			rn.lo, rn.hi, rn.holdsQ = rn.read, n, rn.marked
			if rn.windows == 0 {
				rn.hi = min(n, rn.read+v2ProbeBlocks)
			}
			rn.cmds = hmget(p, rn.hk, window(nil, rn.lo, rn.hi, rn.holdsQ))
		}
		if p == nil {
			break
		}
		var tm *redis.TimeCmd
		if !timed {
			tm = p.Time(ctx)
		}
		if _, err := p.Exec(ctx); err != nil {
			return nil, fmt.Errorf("kvstore: redis match: %w", err)
		}
		if tm != nil {
			now, timed = tm.Val().UnixMilli(), true
			for _, rn := range held { // block 0's hold, judged now
				_, rn.live[0] = parseV2([]any{nil, rn.hold0}, 0, now)
				if rn.cmds == nil {
					ends(rn)
				}
			}
		}
		for _, rn := range held {
			if rn.cmds != nil {
				fill(rn, vals(rn.cmds), rn.lo, rn.hi, rn.holdsQ, now)
				rn.cmds, rn.read = nil, rn.hi
				rn.windows++
				ends(rn)
			}
		}
	}
	out := make([]EndpointMatch, 0, len(held))
	next := make(map[EndpointID]v2Hint, len(held))
	for _, rn := range held {
		if rn.end == 0 {
			continue // block 0 had only an expired hold
		}
		next[rn.ep] = v2Hint{holds: rn.marked, run: rn.end}
		m := EndpointMatch{Endpoint: rn.ep}
		for i := 0; i < rn.end; i++ {
			if rn.tiers[i]&1 != 0 || rn.live[i] || busHolds(i, rn.ep) {
				m.GPUBlocks++
			} else {
				m.CPUBlocks++
			}
		}
		out = append(out, m)
	}
	r.v2SetHints(model, keys[0], next)
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// v2Hint is what Match remembers of a holder of a prompt's block 0 (v2HintsOf).
type v2Hint struct {
	holds bool // its family HASH carried the holds marker
	run   int  // its run then: blocks from block 0
}

// v2MaxHints bounds the block-0 keys whose holders Match remembers (the memo is emptied when full).
const v2MaxHints = 1 << 16

// v2HintsOf returns the holders of block 0 key k0 under model at this index's last Match of it (nil: none
// remembered). Only a guess of what to read in one round trip: Match reads block 0 of every candidate all
// the same.
func (r *RedisIndex) v2HintsOf(model string, k0 BlockKey) map[EndpointID]v2Hint {
	r.emu.Lock()
	defer r.emu.Unlock()
	return r.hints[recKey{model, k0}]
}

func (r *RedisIndex) v2SetHints(model string, k0 BlockKey, h map[EndpointID]v2Hint) {
	r.emu.Lock()
	defer r.emu.Unlock()
	rk := recKey{model, k0}
	if len(h) == 0 {
		delete(r.hints, rk)
		return
	}
	if r.hints == nil || len(r.hints) >= v2MaxHints {
		r.hints = map[recKey]map[EndpointID]v2Hint{}
	}
	r.hints[rk] = h
}

// parseV2 reads one block's (tier field, hold field) pair of an HMGET reply at vals[o:o+2].
func parseV2(vals []any, o int, now int64) (tiers byte, live bool) {
	if s, ok := vals[o].(string); ok && len(s) == 1 {
		tiers = s[0] & 3
	}
	if s, ok := vals[o+1].(string); ok {
		if exp, err := strconv.ParseInt(s, 10, 64); err == nil && exp > now {
			live = true
		}
	}
	return tiers, live
}

// round runs one read pipeline, then one write pipeline built from what was read (writes returns how many
// commands it queued; 0 sends nothing), fenced by f unless nil. On one server the fence key is WATCHed and
// read with the reads, and the writes are one MULTI/EXEC: a RaiseFence in between makes EXEC fail and the
// round is checked again, so a stale holder's writes are refused (ErrFenced) as a whole. On a Cluster
// (where the batch spans slots) the fence is read with the reads and checked before the writes are sent:
// one fenced check per batch, not atomic with it.
func (r *RedisIndex) round(ctx context.Context, op, model string, f *Fence, reads func(redis.Pipeliner), writes func(redis.Pipeliner) int) error {
	check := func(cmds []redis.Cmder, fg *redis.StringCmd) error {
		for _, c := range cmds {
			if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
				return fmt.Errorf("kvstore: redis %s: %w", op, err)
			}
		}
		if fg == nil {
			return nil
		}
		if cur, err := fg.Result(); err == nil && cur != strconv.FormatInt(f.Token, 10) {
			return fmt.Errorf("kvstore: redis %s: fencing token %d of %q is not the current holder's %s: %w", op, f.Token, f.Scope, cur, ErrFenced)
		}
		return nil
	}
	exec := func(p redis.Pipeliner) error {
		_, err := p.Exec(ctx)
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		return nil
	}
	if f == nil || !r.single {
		var fg *redis.StringCmd
		p := r.c.Pipeline()
		if f != nil {
			fg = p.Get(ctx, r.FenceKeyName(model, f.Scope))
		}
		if reads != nil {
			reads(p)
		}
		var cmds []redis.Cmder
		if p.Len() > 0 {
			var err error
			cmds, err = p.Exec(ctx)
			if err != nil && !errors.Is(err, redis.Nil) {
				return fmt.Errorf("kvstore: redis %s: %w", op, err)
			}
		}
		if err := check(cmds, fg); err != nil {
			return err
		}
		w := r.c.Pipeline()
		if writes(w) == 0 {
			return nil
		}
		if err := exec(w); err != nil {
			return redisErr(op, err)
		}
		return nil
	}
	fk := r.FenceKeyName(model, f.Scope)
	if cl, ok := r.c.(*redis.Client); ok {
		// One connection, two round trips: WATCH, the fence and the reads in one pipeline, then MULTI, the
		// writes and EXEC (which ends the WATCH). go-redis's Watch would add a round trip for WATCH and one
		// for UNWATCH.
		conn := cl.Conn()
		defer conn.Close()
		unwatch := func() { _ = conn.Do(ctx, "UNWATCH").Err() }
		var err error
		for attempt := 0; attempt < 4; attempt++ {
			var fg *redis.StringCmd
			cmds, perr := conn.Pipelined(ctx, func(p redis.Pipeliner) error {
				p.Do(ctx, "WATCH", fk)
				fg = p.Get(ctx, fk)
				if reads != nil {
					reads(p)
				}
				return nil
			})
			if perr != nil && !errors.Is(perr, redis.Nil) {
				unwatch()
				return fmt.Errorf("kvstore: redis %s: %w", op, perr)
			}
			if err := check(cmds, fg); err != nil {
				unwatch()
				return err
			}
			var n int
			_, err = conn.TxPipelined(ctx, func(p redis.Pipeliner) error {
				n = writes(p)
				return nil
			})
			if n == 0 {
				unwatch()
				return nil
			}
			if err == nil || errors.Is(err, redis.Nil) {
				return nil
			}
			if !errors.Is(err, redis.TxFailedErr) {
				return redisErr(op, err)
			}
		}
		return fmt.Errorf("kvstore: redis %s: fence kept changing: %w", op, err)
	}
	var err error
	for attempt := 0; attempt < 4; attempt++ {
		err = r.c.Watch(ctx, func(tx *redis.Tx) error {
			var fg *redis.StringCmd
			cmds, err := tx.Pipelined(ctx, func(p redis.Pipeliner) error {
				fg = p.Get(ctx, fk)
				if reads != nil {
					reads(p)
				}
				return nil
			})
			if err != nil && !errors.Is(err, redis.Nil) {
				return fmt.Errorf("kvstore: redis %s: %w", op, err)
			}
			if err := check(cmds, fg); err != nil {
				return err
			}
			var n int
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				n = writes(p)
				return nil
			})
			if n == 0 {
				return nil
			}
			if err != nil && !errors.Is(err, redis.Nil) {
				if errors.Is(err, redis.TxFailedErr) {
					return err
				}
				return redisErr(op, err)
			}
			return nil
		}, fk)
		if !errors.Is(err, redis.TxFailedErr) {
			return err
		}
	}
	return fmt.Errorf("kvstore: redis %s: fence kept changing: %w", op, err)
}

// loadV2 loads the layout-2 scripts (after NOSCRIPT: a restarted Redis or SCRIPT FLUSH).
func (r *RedisIndex) loadV2(ctx context.Context) error {
	for _, s := range index2Scripts {
		if err := s.Load(ctx, r.c).Err(); err != nil {
			return fmt.Errorf("load script: %w", err)
		}
	}
	return nil
}

// withScripts runs fn, and once more after loading the scripts if it failed with NOSCRIPT.
func (r *RedisIndex) withScripts(ctx context.Context, fn func() error) error {
	err := fn()
	if err != nil && containsNoscript(err) {
		if lerr := r.loadV2(ctx); lerr != nil {
			return lerr
		}
		err = fn()
	}
	return err
}

func containsNoscript(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if redis.HasErrorPrefix(e, "NOSCRIPT") {
			return true
		}
	}
	return false
}

// cell is one (endpoint, family) HASH of a write.
type cell struct {
	ep  EndpointID
	fam Family
}

// applyV2 is Apply on layout 2: round 1 reads the tier fields the updates touch (one HMGET per endpoint
// and family), the updates are applied to those values in order in Go, and round 2 writes what changed
// (HSET, HDEL), registers the endpoint and families and counts its entries; fenced by f as one batch.
func (r *RedisIndex) applyV2(ctx context.Context, f *Fence, op, model string, updates []Update) error {
	type ck struct {
		c cell
		k BlockKey
	}
	var order []cell
	fields := map[cell][]BlockKey{}
	idx := map[ck]int{}
	for ui := range updates {
		u := &updates[ui]
		for i, k := range u.Keys {
			c := cell{u.Endpoint, u.familyAt(i)}
			if _, ok := idx[ck{c, k}]; ok {
				continue
			}
			if _, ok := fields[c]; !ok {
				order = append(order, c)
			}
			idx[ck{c, k}] = len(fields[c])
			fields[c] = append(fields[c], k)
		}
	}
	if len(order) == 0 {
		return nil
	}
	reads := make(map[cell][]*redis.SliceCmd, len(order))
	hlens := make(map[cell]*redis.IntCmd, len(order))
	var counts []*redis.IntCmd
	var countEps []EndpointID
	err := r.round(ctx, op, model, f, func(p redis.Pipeliner) {
		for _, c := range order {
			ks := fields[c]
			hk := r.v2Hash(model, c.fam, c.ep)
			hlens[c] = p.HLen(ctx, hk)
			for i := 0; i < len(ks); i += v2WriteChunk {
				fs := make([]string, 0, min(v2WriteChunk, len(ks)-i))
				for _, k := range ks[i:min(i+v2WriteChunk, len(ks))] {
					fs = append(fs, keyField(k))
				}
				reads[c] = append(reads[c], p.HMGet(ctx, hk, fs...))
			}
		}
	}, func(p redis.Pipeliner) int {
		counts, countEps = nil, nil // a retried round calls this again
		old := map[cell][]byte{}
		for _, c := range order {
			vs := make([]byte, 0, len(fields[c]))
			for _, rc := range reads[c] {
				for _, v := range rc.Val() {
					var t byte
					if s, ok := v.(string); ok && len(s) == 1 {
						t = s[0] & 3
					}
					vs = append(vs, t)
				}
			}
			old[c] = vs
		}
		cur := map[cell][]byte{}
		for c, vs := range old {
			cur[c] = append([]byte(nil), vs...)
		}
		for ui := range updates {
			u := &updates[ui]
			for i, k := range u.Keys {
				c := cell{u.Endpoint, u.familyAt(i)}
				j := idx[ck{c, k}]
				if u.Remove {
					cur[c][j] &^= byte(u.Tier)
				} else {
					cur[c][j] |= byte(u.Tier)
				}
			}
		}
		n := 0
		delta := map[EndpointID]int64{}
		fams := map[EndpointID][]any{}
		var epOrder []EndpointID
		for _, c := range order {
			if _, ok := fams[c.ep]; !ok {
				fams[c.ep] = nil
				epOrder = append(epOrder, c.ep)
			}
			hk := r.v2Hash(model, c.fam, c.ep)
			var set []any
			var del []string
			added := int64(0)
			for j, k := range fields[c] {
				o, nv := old[c][j], cur[c][j]
				switch {
				case nv == o:
				case nv == 0:
					del = append(del, keyField(k))
					delta[c.ep]--
				default:
					set = append(set, keyField(k), string([]byte{nv}))
					if o == 0 {
						delta[c.ep]++
						added++
					}
				}
			}
			if n := hlens[c].Val(); n < v2WideAt && n+added >= v2WideAt {
				set = append(set, v2WideField, v2WideValue)
			}
			for i := 0; i < len(set); i += 2 * v2WriteChunk {
				p.HSet(ctx, hk, set[i:min(i+2*v2WriteChunk, len(set))]...)
				n++
			}
			for i := 0; i < len(del); i += v2WriteChunk {
				p.HDel(ctx, hk, del[i:min(i+v2WriteChunk, len(del))]...)
				n++
			}
			if len(set) > 0 {
				fams[c.ep] = append(fams[c.ep], familyHex(c.fam))
			}
		}
		for _, ep := range epOrder {
			if len(fams[ep]) > 0 {
				p.SAdd(ctx, r.v2Model(model, "eps"), string(ep))
				p.SAdd(ctx, r.v2Model(model, "fh:"+string(ep)), fams[ep]...)
				n += 2
			}
			if d := delta[ep]; d != 0 || (r.epCap > 0 && len(fams[ep]) > 0) {
				counts = append(counts, p.IncrBy(ctx, r.v2Model(model, "n:"+string(ep)), d))
				countEps = append(countEps, ep)
				n++
			}
		}
		return n
	})
	if err != nil {
		return err
	}
	for _, c := range order {
		r.noteEndpoint(model, c.ep)
	}
	if r.epCap > 0 {
		for i, c := range counts {
			if over := c.Val() - int64(r.epCap); over > 0 {
				if err := r.evictV2(ctx, model, countEps[i], min(over, 512)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// evictV2 drops about over of ep's confirmed entries, sampled at random from random families of it
// (RedisConfig.MaxEntriesPerEndpoint; random like layout 1's SPOP), a few round trips at most.
func (r *RedisIndex) evictV2(ctx context.Context, model string, ep EndpointID, over int64) error {
	fh := r.v2Model(model, "fh:"+string(ep))
	return r.withScripts(ctx, func() error {
		for round := 0; round < 8 && over > 0; round++ {
			fams, err := r.c.SRandMemberN(ctx, fh, 8).Result()
			if err != nil {
				return fmt.Errorf("kvstore: redis evict: %w", err)
			}
			if len(fams) == 0 {
				return nil
			}
			per := (over + int64(len(fams)) - 1) / int64(len(fams))
			p := r.c.Pipeline()
			var cmds []*redis.Cmd
			for _, fx := range fams {
				cmds = append(cmds, scriptIndex2Evict.EvalSha(ctx, p, []string{r.v2HashHex(model, fx, ep)}, per))
			}
			if _, err := p.Exec(ctx); err != nil {
				return err
			}
			var gone int64
			for _, c := range cmds {
				n, _ := c.Int64()
				gone += n
			}
			if gone > 0 {
				if err := r.c.DecrBy(ctx, r.v2Model(model, "n:"+string(ep)), gone).Err(); err != nil {
					return fmt.Errorf("kvstore: redis evict: %w", err)
				}
			}
			over -= gone
		}
		return nil
	})
}

// recordV2 writes speculative holds of keys (a prompt from block 0: family of keys[0]) into ep's family
// HASH: one script per writeSlice keys, pipelined with the registry updates.
func (r *RedisIndex) recordV2(ctx context.Context, model string, ep EndpointID, keys []BlockKey, ms int64) error {
	fam := FamilyOf(keys[0])
	hk := r.v2Hash(model, fam, ep)
	err := r.withScripts(ctx, func() error {
		p := r.c.Pipeline()
		for i := 0; i < len(keys); i += writeSlice {
			args := []any{ms}
			for _, k := range keys[i:min(i+writeSlice, len(keys))] {
				args = append(args, holdField(k))
			}
			scriptIndex2Record.EvalSha(ctx, p, []string{hk}, args...)
		}
		p.SAdd(ctx, r.v2Model(model, "eps"), string(ep))
		p.SAdd(ctx, r.v2Model(model, "fh:"+string(ep)), familyHex(fam))
		_, err := p.Exec(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("kvstore: redis record: %w", err)
	}
	r.noteEndpoint(model, ep)
	return nil
}

// clearEndpointV2 pops ep's families (256 per round trip, fenced) and UNLINKs their HASHes (freed by Redis
// in the background), then drops its count and registry entry.
func (r *RedisIndex) clearEndpointV2(ctx context.Context, f *Fence, model string, ep EndpointID) error {
	fh := r.v2Model(model, "fh:"+string(ep))
	n, err := r.c.SCard(ctx, fh).Result()
	if err != nil {
		return fmt.Errorf("kvstore: redis clear endpoint: %w", err)
	}
	for i, limit := int64(0), n/256+16; i < limit; i++ {
		var pop *redis.StringSliceCmd
		if err := r.round(ctx, "clear endpoint", model, f, nil, func(p redis.Pipeliner) int {
			pop = p.SPopN(ctx, fh, 256)
			return 1
		}); err != nil {
			return err
		}
		fams := pop.Val()
		if len(fams) == 0 {
			break
		}
		p := r.c.Pipeline()
		for _, fx := range fams {
			p.Unlink(ctx, r.v2HashHex(model, fx, ep))
		}
		if _, err := p.Exec(ctx); err != nil {
			return fmt.Errorf("kvstore: redis clear endpoint: %w", err)
		}
	}
	if err := r.round(ctx, "clear endpoint", model, f, nil, func(p redis.Pipeliner) int {
		p.Del(ctx, r.v2Model(model, "n:"+string(ep)))
		p.SRem(ctx, r.v2Model(model, "eps"), string(ep))
		return 2
	}); err != nil {
		return err
	}
	r.forgetEndpoint(model, ep)
	return nil
}

// slicedV2 runs script s (a slice of one family HASH: {next cursor, confirmed fields touched}) over every
// family of ep until each cursor is back at 0: v2FamilyBatch families per round trip, each round fenced.
// Families whose HASH is gone afterwards leave ep's family set; the confirmed count is reset.
func (r *RedisIndex) slicedV2(ctx context.Context, op string, f *Fence, model string, ep EndpointID, s *redis.Script, pre ...any) error {
	fh := r.v2Model(model, "fh:"+string(ep))
	fams, err := r.c.SMembers(ctx, fh).Result()
	if err != nil {
		return fmt.Errorf("kvstore: redis %s: %w", op, err)
	}
	type job struct {
		fx     string
		cursor string
	}
	var todo []job
	for _, fx := range fams {
		todo = append(todo, job{fx, "0"})
	}
	var emptied []any
	for len(todo) > 0 {
		batch := todo[:min(v2FamilyBatch, len(todo))]
		todo = todo[len(batch):]
		var cmds []*redis.Cmd
		var lens []*redis.IntCmd
		err := r.withScripts(ctx, func() error {
			cmds, lens = nil, nil
			return r.round(ctx, op, model, f, nil, func(p redis.Pipeliner) int {
				for _, j := range batch {
					hk := r.v2HashHex(model, j.fx, ep)
					args := append(append([]any{}, pre...), j.cursor, v2ScanCount)
					cmds = append(cmds, s.EvalSha(ctx, p, []string{hk}, args...))
					lens = append(lens, p.Exists(ctx, hk))
				}
				return 2 * len(batch)
			})
		})
		if err != nil {
			return err
		}
		for i, j := range batch {
			res, err := cmds[i].Slice()
			if err != nil || len(res) != 2 {
				return fmt.Errorf("kvstore: redis %s: slice reply %v: %v", op, res, err)
			}
			next, _ := res[0].(string)
			if next != "0" && next != "" {
				todo = append(todo, job{j.fx, next})
			} else if lens[i].Val() == 0 {
				emptied = append(emptied, j.fx)
			}
		}
	}
	return r.round(ctx, op, model, f, nil, func(p redis.Pipeliner) int {
		p.Del(ctx, r.v2Model(model, "n:"+string(ep)))
		if len(emptied) > 0 {
			p.SRem(ctx, fh, emptied...)
			return 2
		}
		return 1
	})
}

// mutexes and caches of layout 2 (embedded in RedisIndex).
type v2State struct {
	base2 string
	// layout is RedisConfig.IndexLayout; lmode the marker's layout (0 until read).
	layout   int
	lmu      sync.Mutex
	lmode    int
	lstarted bool
	lstop    chan struct{}
	emu      sync.Mutex
	eps      map[string]v2Eps
	hints    map[recKey]map[EndpointID]v2Hint // Match's memo of block-0 holders (v2HintsOf)
	runs1    map[recKey]int                   // layout 1 Match's memo of block-0 runs (v1RunOf)
}
