package kvstore

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvgate/kvgate/kvstore/internal/probe"
)

// DefaultMaxKeys is the memory index's key bound when MemoryConfig.MaxKeys is 0 (about 1.6 GB at the
// measured ~100 bytes per key).
const DefaultMaxKeys = 16 << 20

// MemoryConfig configures NewMemoryIndex.
type MemoryConfig struct {
	// MaxKeys bounds the number of (model, block key) entries held; beyond it the least recently used
	// entries (CLOCK approximation, per shard) are evicted. 0 means DefaultMaxKeys. The bound is enforced
	// per shard (MaxKeys/Shards each, rounded up), so eviction may start slightly below MaxKeys.
	MaxKeys int
	// MaxKeysPerEndpoint bounds the entries one (model, endpoint) holds (0: no bound of its own); beyond it
	// that endpoint's least recently used entries go (a CLOCK over its own entries: a Match hit or a new
	// entry gives one a second chance). Enforced per shard (MaxKeysPerEndpoint/Shards each, rounded up).
	MaxKeysPerEndpoint int
	// Shards is the number of lock shards, rounded up to a power of two; 0 means 8. Match read-locks all of
	// them, writers one at a time.
	Shards int
	// Now is the clock for speculative TTLs; nil means time.Now. Tests inject a fake clock.
	Now func() time.Time
}

// Holder bits of one (key, endpoint) entry.
const (
	bitGPU  = uint32(TierGPU) // 1
	bitCPU  = uint32(TierCPU) // 2
	bitSpec = 4               // speculative (Record); live while its expiry is in the future
	bitMask = 0xff
)

// inlineHolders is how many endpoints one entry holds without spilling into the shard's overflow map.
const inlineHolders = 4

// memSlot is one block key's entry in a shard's open-addressing table: 32 bytes, no pointers (the GC never
// scans the table). A holder is packed as holderID<<8 | bits. n == 0 marks an empty slot.
type memSlot struct {
	key uint64 // internal key (block key XOR model mix); its low bits are the home position
	h   [inlineHolders]uint32
	n   uint32 // holder count
	ref uint32 // CLOCK reference bit, set atomically by readers
}

type specItem struct {
	ik      uint64
	hid     uint16
	expires int64
}

type revList struct {
	keys []uint64 // internal keys this holder was added to (may hold stale or duplicate entries)
	live int      // entries that currently hold the holder
	hand int      // the holder's CLOCK hand over keys (MaxKeysPerEndpoint)
}

// memShard is a linear-probing hash table of memSlots keyed by the (already well mixed) internal key.
type memShard struct {
	mu    sync.RWMutex
	table []memSlot // power-of-two length
	mask  uint64
	count int
	limit int
	epLim int // entries one holder may have in this shard (0: no bound)
	hand  int
	over  map[uint64][]uint32 // holders beyond the inline ones, by internal key
	rev   []*revList          // by holder ID; nil = none
	spec  specTable           // speculative expiry (Unix ns) per (internal key, holder)
	specQ []specItem          // FIFO of speculative writes, swept lazily under the write lock
	longQ []specItem          // a second FIFO, so short and long TTLs (Demote) each stay in expiry order
	_     [64]byte            // keep shards' hot fields on separate cache lines
}

type memModel struct {
	mix uint64
	eps map[EndpointID]uint16
}

type holderName struct {
	model string
	ep    EndpointID
}

// MemoryIndex is the in-memory Index: per shard an open-addressing table of block keys with inline holder
// lists, CLOCK eviction, per-endpoint reverse lists and speculative entries with TTLs. Match read-locks
// every shard once (in order) and then looks blocks up without further atomics, so the CPU overlaps the
// cache misses of consecutive blocks; writers lock one shard at a time. Safe for concurrent use.
type MemoryIndex struct {
	shards []memShard
	mask   uint64
	now    func() time.Time

	hmu     sync.RWMutex
	models  map[string]*memModel
	holders []holderName // holder ID -> (model, endpoint); index 0 unused

	fmu    sync.Mutex
	fences map[memFenceKey]*memFence // Fencer: newest token per (model, scope)
}

var _ Index = (*MemoryIndex)(nil)

// NewMemoryIndex returns an empty memory index configured by cfg.
func NewMemoryIndex(cfg MemoryConfig) *MemoryIndex {
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	n := cfg.Shards
	if n <= 0 {
		n = 8
	}
	n = 1 << bits.Len(uint(n-1))
	m := &MemoryIndex{
		shards:  make([]memShard, n),
		mask:    uint64(n - 1),
		now:     cfg.Now,
		models:  map[string]*memModel{},
		holders: make([]holderName, 1),
	}
	if m.now == nil {
		m.now = time.Now
	}
	per := (cfg.MaxKeys + n - 1) / n
	for i := range m.shards {
		s := &m.shards[i]
		s.table = make([]memSlot, 64)
		s.mask = 63
		s.over = map[uint64][]uint32{}
		s.limit = per
		if cfg.MaxKeysPerEndpoint > 0 {
			s.epLim = (cfg.MaxKeysPerEndpoint + n - 1) / n
		}
	}
	return m
}

// Len returns the number of (model, block key) entries currently held.
func (m *MemoryIndex) Len() int {
	total := 0
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.RLock()
		total += s.count
		s.mu.RUnlock()
	}
	return total
}

func (m *MemoryIndex) shardOf(ik uint64) *memShard {
	// The block keys are already well mixed; take high bits so the map's own hashing sees different ones.
	return &m.shards[(ik>>40)&m.mask]
}

// lookup returns the model's mix and the endpoint's holder ID (0 if unknown) without creating either.
func (m *MemoryIndex) lookup(model string, ep EndpointID) (mix uint64, hid uint16, ok bool) {
	m.hmu.RLock()
	defer m.hmu.RUnlock()
	mm := m.models[model]
	if mm == nil {
		return 0, 0, false
	}
	return mm.mix, mm.eps[ep], true
}

// holderFor returns the model's mix and the endpoint's holder ID, numbering it on first use.
func (m *MemoryIndex) holderFor(model string, ep EndpointID) (uint64, uint16, error) {
	if mix, hid, ok := m.lookup(model, ep); ok && hid != 0 {
		return mix, hid, nil
	}
	m.hmu.Lock()
	defer m.hmu.Unlock()
	mm := m.models[model]
	if mm == nil {
		mm = &memModel{mix: xxhash.Sum64String(model), eps: map[EndpointID]uint16{}}
		m.models[model] = mm
	}
	if hid := mm.eps[ep]; hid != 0 {
		return mm.mix, hid, nil
	}
	if len(m.holders) > 0xffff {
		return 0, 0, ErrTooManyEndpoints
	}
	hid := uint16(len(m.holders))
	m.holders = append(m.holders, holderName{model: model, ep: ep})
	mm.eps[ep] = hid
	return mm.mix, hid, nil
}

// checkNames rejects an empty model or endpoint, and endpoint IDs with a tab or newline (the Redis block
// record separators).
func checkNames(op, model string, ep EndpointID) error {
	if model == "" || ep == "" {
		return fmt.Errorf("kvstore: %s: empty model or endpoint: %w", op, ErrInvalidArgument)
	}
	if strings.ContainsAny(string(ep), "\t\n") {
		return fmt.Errorf("kvstore: %s: endpoint %q contains a tab or newline: %w", op, ep, ErrInvalidArgument)
	}
	return nil
}

func checkTier(op string, t Tier) error {
	if t != TierGPU && t != TierCPU {
		return fmt.Errorf("kvstore: %s: tier %d: %w", op, t, ErrInvalidTier)
	}
	return nil
}

// Match implements Index.
func (m *MemoryIndex) Match(_ context.Context, model string, keys []BlockKey) ([]EndpointMatch, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	m.hmu.RLock()
	mm := m.models[model]
	m.hmu.RUnlock()
	if mm == nil {
		return nil, nil
	}
	type run struct {
		hid      uint16
		alive    bool
		gpu, cpu int32
	}
	var stack [16]run
	runs := stack[:0]
	alive := 0
	var now int64 // read lazily, only when a speculative holder is seen
	held := func(s *memShard, ik uint64, h uint32) (gpu, any bool) {
		b := h & bitMask
		if b&bitGPU != 0 {
			return true, true
		}
		if b&bitSpec != 0 {
			if now == 0 {
				now = m.now().UnixNano()
			}
			if s.spec.get(ik, uint16(h>>8)) > now {
				return true, true
			}
		}
		return false, b&bitCPU != 0
	}
	for i := range m.shards {
		m.shards[i].mu.RLock()
	}
	// Touch the home slots of the next few blocks ahead of use: independent loads whose cache misses the
	// CPU overlaps (a software prefetch; the result is kept only so the loads are not dropped).
	var pf uint64
	const ahead = 8
	for i := range min(ahead, len(keys)) {
		pf ^= m.touch(uint64(keys[i]) ^ mm.mix)
	}
	for i, k := range keys {
		if i+ahead < len(keys) {
			pf ^= m.touch(uint64(keys[i+ahead]) ^ mm.mix)
		}
		ik := uint64(k) ^ mm.mix
		s := m.shardOf(ik)
		p := s.find(ik)
		if p < 0 {
			break
		}
		sl := &s.table[p]
		if atomic.LoadUint32(&sl.ref) == 0 {
			atomic.StoreUint32(&sl.ref, 1)
		}
		n := int(sl.n)
		if i == 0 {
			for j := range n {
				h := s.holderAt(sl, j)
				if g, a := held(s, ik, h); a {
					r := run{hid: uint16(h >> 8), alive: true}
					if g {
						r.gpu = 1
					} else {
						r.cpu = 1
					}
					runs = append(runs, r)
					alive++
				}
			}
		} else {
			for ri := range runs {
				r := &runs[ri]
				if !r.alive {
					continue
				}
				found := false
				for j := range n {
					h := s.holderAt(sl, j)
					if uint16(h>>8) != r.hid {
						continue
					}
					if g, a := held(s, ik, h); a {
						found = true
						if g {
							r.gpu++
						} else {
							r.cpu++
						}
					}
					break
				}
				if !found {
					r.alive = false
					alive--
				}
			}
		}
		if alive == 0 {
			break
		}
	}
	for i := len(m.shards) - 1; i >= 0; i-- {
		m.shards[i].mu.RUnlock()
	}
	if pf == 1 {
		prefetchSink.Store(pf)
	}
	if len(runs) == 0 {
		return nil, nil
	}
	out := make([]EndpointMatch, len(runs))
	m.hmu.RLock()
	for i, r := range runs {
		out[i] = EndpointMatch{Endpoint: m.holders[r.hid].ep, GPUBlocks: int(r.gpu), CPUBlocks: int(r.cpu)}
	}
	m.hmu.RUnlock()
	return out, nil
}

// Add implements Index.
func (m *MemoryIndex) Add(_ context.Context, model string, ep EndpointID, tier Tier, keys []BlockKey) error {
	if err := checkNames("add", model, ep); err != nil {
		return err
	}
	if err := checkTier("add", tier); err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}
	mix, hid, err := m.holderFor(model, ep)
	if err != nil {
		return fmt.Errorf("kvstore: add: %w", err)
	}
	var now int64
	m.eachShard(keys, mix, func(s *memShard) {
		if len(s.specQ)+len(s.longQ) > 0 {
			if now == 0 {
				now = m.now().UnixNano()
			}
			s.sweep(now)
		}
	}, func(s *memShard, ik uint64) {
		s.set(ik, hid, uint32(tier))
	})
	return nil
}

// Record implements Index.
func (m *MemoryIndex) Record(_ context.Context, model string, ep EndpointID, keys []BlockKey, ttl time.Duration) error {
	if err := checkNames("record", model, ep); err != nil {
		return err
	}
	if ttl <= 0 {
		return fmt.Errorf("kvstore: record: ttl %v: %w", ttl, ErrInvalidArgument)
	}
	if len(keys) == 0 {
		return nil
	}
	mix, hid, err := m.holderFor(model, ep)
	if err != nil {
		return fmt.Errorf("kvstore: record: %w", err)
	}
	now := m.now().UnixNano()
	exp := now + int64(ttl)
	m.eachShard(keys, mix, func(s *memShard) { s.sweep(now) }, func(s *memShard, ik uint64) {
		s.set(ik, hid, bitSpec)
		if s.spec.raise(ik, hid, exp) {
			s.queue(specItem{ik: ik, hid: hid, expires: exp})
		}
	})
	return nil
}

// Demote implements Demoter. Like ClearConfirmed it visits only the keys on ep's reverse lists.
func (m *MemoryIndex) Demote(_ context.Context, model string, ep EndpointID, ttl time.Duration) error {
	if err := checkNames("demote", model, ep); err != nil {
		return err
	}
	if ttl <= 0 {
		return fmt.Errorf("kvstore: demote: ttl %v: %w", ttl, ErrInvalidArgument)
	}
	_, hid, ok := m.lookup(model, ep)
	if !ok || hid == 0 {
		return nil
	}
	now := m.now().UnixNano()
	exp := now + int64(ttl)
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		s.sweep(now)
		if rl := s.revOf(hid); rl != nil {
			for _, ik := range rl.keys {
				p := s.find(ik)
				if p < 0 {
					continue
				}
				sl := &s.table[p]
				for j := range int(sl.n) {
					h := s.holderAt(sl, j)
					if uint16(h>>8) != hid {
						continue
					}
					if h&(bitGPU|bitCPU) != 0 {
						s.setHolderAt(sl, j, h&^(bitGPU|bitCPU)|bitSpec)
						if s.spec.raise(ik, hid, exp) {
							s.queue(specItem{ik: ik, hid: hid, expires: exp})
						}
					}
					break
				}
			}
		}
		s.mu.Unlock()
	}
	return nil
}

// queue appends it to one of the shard's two FIFOs, keeping each in expiry order when it can (best fit: the
// queue whose last item expires latest but no later than it), so that short Record TTLs and long Demote
// TTLs interleave without a long hold at a queue's front delaying the sweep of later short ones. Caller
// holds the write lock.
func (s *memShard) queue(it specItem) {
	last := func(q []specItem) int64 {
		if len(q) == 0 {
			return math.MinInt64
		}
		return q[len(q)-1].expires
	}
	ls, ll := last(s.specQ), last(s.longQ)
	// Best fit: the queue with the later last item that still expires no later than it.
	if ll <= it.expires && (ls > it.expires || ll > ls) {
		s.longQ = append(s.longQ, it)
		return
	}
	s.specQ = append(s.specQ, it) // fits, or out of order in both (swept late; Match checks the expiry)
}

// Remove implements Index.
func (m *MemoryIndex) Remove(_ context.Context, model string, ep EndpointID, tier Tier, keys []BlockKey) error {
	if err := checkNames("remove", model, ep); err != nil {
		return err
	}
	if err := checkTier("remove", tier); err != nil {
		return err
	}
	mix, hid, ok := m.lookup(model, ep)
	if !ok || hid == 0 {
		return nil
	}
	m.eachShard(keys, mix, nil, func(s *memShard, ik uint64) {
		if p := s.find(ik); p >= 0 {
			s.clearBits(p, hid, uint32(tier))
		}
	})
	return nil
}

// ClearEndpoint implements Index. It visits every shard once and, in each, only the keys on ep's reverse
// list.
func (m *MemoryIndex) ClearEndpoint(_ context.Context, model string, ep EndpointID) error {
	if err := checkNames("clear endpoint", model, ep); err != nil {
		return err
	}
	_, hid, ok := m.lookup(model, ep)
	if !ok || hid == 0 {
		return nil
	}
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		if rl := s.revOf(hid); rl != nil {
			for _, ik := range rl.keys {
				if p := s.find(ik); p >= 0 {
					s.clearBits(p, hid, bitMask)
				}
			}
			s.rev[hid] = nil
		}
		s.mu.Unlock()
	}
	return nil
}

// ClearConfirmed implements Index. Like ClearEndpoint it visits only the keys on ep's reverse lists; it
// clears their tier bits and keeps live speculative holds that expire within ClearKeepsHoldsWithin
// (expired and longer ones go too).
func (m *MemoryIndex) ClearConfirmed(_ context.Context, model string, ep EndpointID) error {
	if err := checkNames("clear confirmed", model, ep); err != nil {
		return err
	}
	_, hid, ok := m.lookup(model, ep)
	if !ok || hid == 0 {
		return nil
	}
	now := m.now().UnixNano()
	keepTo := now + int64(ClearKeepsHoldsWithin)
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		if rl := s.revOf(hid); rl != nil {
			for _, ik := range rl.keys {
				p := s.find(ik)
				if p < 0 {
					continue
				}
				b := bitGPU | bitCPU
				if exp := s.spec.get(ik, hid); exp <= now || exp > keepTo {
					b = bitMask // no live short speculative hold: drop the holder entirely
				}
				s.clearBits(p, hid, b)
			}
			if rl.live <= 0 {
				s.rev[hid] = nil
			} else {
				s.compact(hid, rl) // keep only the keys still held speculatively
			}
		}
		s.mu.Unlock()
	}
	return nil
}

// eachShard calls f(s, ik) for the internal key of every key, shard by shard, with each shard that holds
// any of them write-locked once (pre(s) first, if not nil), instead of one lock per key. A key's calls keep
// their order (equal keys are in one shard); keys in different shards are independent.
func (m *MemoryIndex) eachShard(keys []BlockKey, mix uint64, pre func(s *memShard), f func(s *memShard, ik uint64)) {
	if len(keys) == 1 || len(m.shards) > 256 {
		for _, k := range keys {
			ik := uint64(k) ^ mix
			s := m.shardOf(ik)
			s.mu.Lock()
			if pre != nil {
				pre(s)
			}
			f(s, ik)
			s.mu.Unlock()
		}
		return
	}
	var stack [256]uint8
	idx := stack[:0]
	if len(keys) > len(stack) {
		idx = make([]uint8, 0, len(keys))
	}
	var present [4]uint64 // bit set per shard that has keys
	for _, k := range keys {
		si := ((uint64(k) ^ mix) >> 40) & m.mask
		idx = append(idx, uint8(si))
		present[si>>6] |= 1 << (si & 63)
	}
	for si := range m.shards {
		if present[si>>6]&(1<<(si&63)) == 0 {
			continue
		}
		s := &m.shards[si]
		s.mu.Lock()
		if pre != nil {
			pre(s)
		}
		for i, k := range keys {
			if int(idx[i]) == si {
				f(s, uint64(k)^mix)
			}
		}
		s.mu.Unlock()
	}
}

var prefetchSink atomic.Uint64

// touch loads ik's home slot in its shard (see Match). Caller holds the shard's lock.
func (m *MemoryIndex) touch(ik uint64) uint64 {
	s := m.shardOf(ik)
	return s.table[ik&s.mask].key
}

// find returns the table position of ik, or -1. Caller holds a lock.
func (s *memShard) find(ik uint64) int {
	for p := ik & s.mask; ; p = (p + 1) & s.mask {
		sl := &s.table[p]
		if sl.n == 0 {
			return -1
		}
		if sl.key == ik {
			return int(p)
		}
	}
}

// holderAt returns holder j of slot sl (inline or overflow). Caller holds a lock.
func (s *memShard) holderAt(sl *memSlot, j int) uint32 {
	if j < inlineHolders {
		return sl.h[j]
	}
	return s.over[sl.key][j-inlineHolders]
}

func (s *memShard) setHolderAt(sl *memSlot, j int, h uint32) {
	if j < inlineHolders {
		sl.h[j] = h
		return
	}
	s.over[sl.key][j-inlineHolders] = h
}

// set ORs bits into hid's holder of internal key ik, creating the entry and the holder as needed. Caller
// holds the write lock.
func (s *memShard) set(ik uint64, hid uint16, b uint32) {
	p := s.findOrInsert(ik)
	sl := &s.table[p]
	n := int(sl.n)
	for j := range n {
		h := s.holderAt(sl, j)
		if uint16(h>>8) == hid {
			s.setHolderAt(sl, j, h|b)
			return
		}
	}
	h := uint32(hid)<<8 | b
	if n < inlineHolders {
		sl.h[n] = h
	} else {
		s.over[ik] = append(s.over[ik], h)
	}
	sl.n++
	s.revAdd(hid, ik)
	if s.epLim > 0 {
		if rl := s.rev[hid]; rl.live > s.epLim {
			s.evictHolder(hid, rl, ik)
		}
	}
}

// evictHolder drops one of hid's entries in the shard, never keep (the entry just set): the first its CLOCK
// hand finds whose reference bit is clear, clearing the bits it passes (at most two passes over its list).
// Caller holds the write lock.
func (s *memShard) evictHolder(hid uint16, rl *revList, keep uint64) {
	for range 2*len(rl.keys) + 1 {
		if rl.hand >= len(rl.keys) {
			rl.hand = 0
		}
		ik := rl.keys[rl.hand]
		rl.hand++
		if ik == keep {
			continue
		}
		p := s.find(ik)
		if p < 0 {
			continue
		}
		sl := &s.table[p]
		held := false
		for j := range int(sl.n) {
			if uint16(s.holderAt(sl, j)>>8) == hid {
				held = true
				break
			}
		}
		if !held {
			continue
		}
		if sl.ref != 0 {
			sl.ref = 0
			continue
		}
		s.clearBits(p, hid, bitMask)
		return
	}
}

// clearBits clears bits b of hid's holder in the slot at position p; a holder left with no bits is
// removed, and a slot left with no holders is deleted. Caller holds the write lock.
func (s *memShard) clearBits(p int, hid uint16, b uint32) {
	sl := &s.table[p]
	n := int(sl.n)
	for j := range n {
		h := s.holderAt(sl, j)
		if uint16(h>>8) != hid {
			continue
		}
		if h&b&bitSpec != 0 {
			s.spec.del(sl.key, hid)
		}
		h &^= b
		if h&bitMask != 0 {
			s.setHolderAt(sl, j, h)
			return
		}
		// Remove: move the last holder into j.
		s.setHolderAt(sl, j, s.holderAt(sl, n-1))
		if n > inlineHolders {
			if o := s.over[sl.key][:n-1-inlineHolders]; len(o) == 0 {
				delete(s.over, sl.key)
			} else {
				s.over[sl.key] = o
			}
		}
		sl.n--
		if rl := s.revOf(hid); rl != nil {
			rl.live--
		}
		if sl.n == 0 {
			s.remove(p)
		}
		return
	}
}

// findOrInsert returns the position of ik, inserting a new, holder-less entry (as insert) when there is
// none: one probe when no eviction or growth is due. The caller must give a new entry a holder.
func (s *memShard) findOrInsert(ik uint64) int {
	p := ik & s.mask
	for ; s.table[p].n != 0; p = (p + 1) & s.mask {
		if s.table[p].key == ik {
			return int(p)
		}
	}
	if s.count >= s.limit || (s.count+1)*4 > len(s.table)*3 {
		return s.insert(ik) // evicting or growing moves entries: probe again
	}
	// A new entry starts referenced (CLOCK's second chance): the hand evicts it on its next pass at the
	// earliest. Evicting fresh entries at once let the hand empty the table behind it while inserts packed the
	// rest, so every eviction's backward shift walked a long probe run: an 8 M-block flood under a 1 M cap
	// took 77 s (BenchmarkMemoryFloodUnderCap).
	s.table[p] = memSlot{key: ik, ref: 1}
	s.count++
	return int(p)
}

// revOf returns hid's reverse list in the shard, or nil.
func (s *memShard) revOf(hid uint16) *revList {
	if int(hid) < len(s.rev) {
		return s.rev[hid]
	}
	return nil
}

// insert places a new, holder-less entry for ik (evicting one entry first when the shard is at its limit,
// growing the table past 3/4 load) and returns its position. The caller must give it a holder.
func (s *memShard) insert(ik uint64) int {
	if s.count >= s.limit {
		s.evictOne()
	}
	if (s.count+1)*4 > len(s.table)*3 {
		s.grow()
	}
	p := ik & s.mask
	for s.table[p].n != 0 {
		p = (p + 1) & s.mask
	}
	// A new entry starts referenced (CLOCK's second chance), as in findOrInsert.
	s.table[p] = memSlot{key: ik, ref: 1}
	s.count++
	return int(p)
}

func (s *memShard) grow() {
	old := s.table
	s.table = make([]memSlot, 2*len(old))
	s.mask = uint64(len(s.table) - 1)
	for i := range old {
		if old[i].n == 0 {
			continue
		}
		p := old[i].key & s.mask
		for s.table[p].n != 0 {
			p = (p + 1) & s.mask
		}
		s.table[p] = old[i]
	}
	s.hand = 0
}

// remove deletes the entry at position p by backward-shift deletion (no tombstones). Caller holds the
// write lock and has already dropped the entry's holders, spec and overflow state.
func (s *memShard) remove(p int) {
	i := uint64(p)
	for {
		s.table[i] = memSlot{}
		j := i
		for {
			j = (j + 1) & s.mask
			if s.table[j].n == 0 {
				s.count--
				return
			}
			home := s.table[j].key & s.mask
			if probe.Stays(i, home, j) { // home lies cyclically in (i, j]: the entry cannot move to i
				continue
			}
			break
		}
		s.table[i] = s.table[j]
		i = j
	}
}

// evictOne evicts the first entry the CLOCK hand finds with its reference bit clear.
func (s *memShard) evictOne() {
	for {
		if s.hand >= len(s.table) {
			s.hand = 0
		}
		p := s.hand
		s.hand++
		sl := &s.table[p]
		if sl.n == 0 {
			continue
		}
		if sl.ref != 0 {
			sl.ref = 0
			continue
		}
		for j := range int(sl.n) {
			h := s.holderAt(sl, j)
			hid := uint16(h >> 8)
			if rl := s.revOf(hid); rl != nil {
				rl.live--
			}
			if h&bitSpec != 0 {
				s.spec.del(sl.key, hid)
			}
		}
		delete(s.over, sl.key)
		sl.n = 0
		s.remove(p)
		s.hand = p // the backward shift may have moved an unvisited entry into p
		return
	}
}

// revAdd notes that hid now holds ik, compacting hid's reverse list when stale entries dominate.
func (s *memShard) revAdd(hid uint16, ik uint64) {
	if int(hid) >= len(s.rev) {
		s.rev = append(s.rev, make([]*revList, int(hid)+1-len(s.rev))...)
	}
	rl := s.rev[hid]
	if rl == nil {
		rl = &revList{}
		s.rev[hid] = rl
	}
	rl.keys = append(rl.keys, ik)
	rl.live++
	if len(rl.keys) > 2*rl.live+64 {
		s.compact(hid, rl)
	}
}

// compact drops reverse-list entries whose key no longer holds hid, and duplicates.
func (s *memShard) compact(hid uint16, rl *revList) {
	slices.Sort(rl.keys)
	keys := slices.Compact(rl.keys)
	out := keys[:0]
	for _, ik := range keys {
		p := s.find(ik)
		if p < 0 {
			continue
		}
		sl := &s.table[p]
		for j := range int(sl.n) {
			if uint16(s.holderAt(sl, j)>>8) == hid {
				out = append(out, ik)
				break
			}
		}
	}
	rl.keys = slices.Clip(out)
	rl.hand = 0
	if cap(rl.keys) > 2*len(rl.keys)+64 {
		rl.keys = slices.Clone(rl.keys)
	}
	rl.live = len(rl.keys)
}

// sweep expires speculative holds whose deadline has passed (front of the FIFO only; a long TTL at the
// front delays later ones, which Match still treats as expired). Caller holds the write lock.
func (s *memShard) sweep(now int64) {
	s.specQ = s.sweepQueue(s.specQ, now)
	s.longQ = s.sweepQueue(s.longQ, now)
}

func (s *memShard) sweepQueue(q []specItem, now int64) []specItem {
	i := 0
	for ; i < len(q) && q[i].expires <= now; i++ {
		it := q[i]
		if exp := s.spec.get(it.ik, it.hid); exp == 0 || exp > now {
			continue
		}
		if p := s.find(it.ik); p >= 0 {
			s.clearBits(p, it.hid, bitSpec)
		}
	}
	if i > 0 {
		q = q[i:]
		if len(q) == 0 {
			q = nil
		}
	}
	return q
}
