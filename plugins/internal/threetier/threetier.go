// Package threetier is kvgate's default routing policy, the three-tier ranking,
// written once against the SDK types: the host calls it natively as the fallback ranking and the embedded
// Wasm module (plugins/builtin/threetier) registers the same code with sdk.Register, so both rank every
// snapshot identically.
//
// Per request, with load = waiting requests + gateway in-flight requests, over the healthy endpoints:
//   - overloaded: load − lowest load > ImbalanceThreshold (a per-endpoint gate);
//   - affinity: among non-overloaded endpoints, match rate = (GPU blocks + CPUWeight × CPU-only blocks) ×
//     block size / prompt tokens; if the best ≥ MatchThreshold, the non-overloaded endpoints by match rate
//     (higher first), then by lower load, then the overloaded ones by load;
//   - balance: if only overloaded endpoints reach MatchThreshold, power of two choices: two distinct
//     endpoints drawn with sdk.Rand seeded by Request.Seed, the less loaded first, then the rest by load;
//   - miss: every endpoint by load.
//
// Remaining ties go to lower load, then to sdk.TieKey(seed, index) (lower first). Unhealthy endpoints are
// left out of the ranking; with none healthy the ranking is empty. Rank does not allocate once its scratch
// has grown to the fleet size. A Ranker is not safe for concurrent use.
package threetier

import (
	"math"
	"math/bits"
	"slices"
	"unsafe"

	"github.com/kvgate/kvgate/sdk"
)

// Config holds the three-tier parameters; the JSON keys are imbalance_threshold, match_threshold and
// cpu_weight.
type Config struct {
	ImbalanceThreshold float64 // requests; an endpoint is overloaded when load − min load exceeds it
	MatchThreshold     float64 // match rate in [0,1] the best non-overloaded endpoint needs for affinity
	CPUWeight          float64 // credit of one CPU-only matched block relative to a GPU block, [0,1]
}

// DefaultConfig returns the documented defaults: imbalance threshold 8, match threshold 0.10, CPU
// weight 0.8.
func DefaultConfig() Config {
	return Config{ImbalanceThreshold: 8, MatchThreshold: 0.10, CPUWeight: 0.8}
}

// ParseConfig decodes a JSON config over DefaultConfig (empty input gives the defaults). Unknown keys,
// duplicates and out-of-range values are *sdk.ConfigError.
func ParseConfig(data []byte) (Config, error) {
	c := DefaultConfig()
	err := sdk.DecodeConfig(data,
		sdk.Field{Name: "imbalance_threshold", Dst: &c.ImbalanceThreshold, Min: 0, Max: 1e9},
		sdk.Field{Name: "match_threshold", Dst: &c.MatchThreshold, Min: 0, Max: 1},
		sdk.Field{Name: "cpu_weight", Dst: &c.CPUWeight, Min: 0, Max: 1},
	)
	return c, err
}

// Tier says which branch of the algorithm ranked a request.
type Tier uint8

// Branches of the algorithm.
const (
	TierNone     Tier = iota // no healthy endpoint
	TierAffinity             // best non-overloaded match rate ≥ MatchThreshold
	TierBalance              // only overloaded endpoints match: power of two choices
	TierMiss                 // nothing matches: least load
)

// String returns the branch name.
func (t Tier) String() string {
	return [...]string{"none", "affinity", "balance", "miss"}[t]
}

type item struct {
	// hi is the first key of the full comparison (rankFull): group (0 first) in bit 63 and, in the
	// affinity branch for group 0, the match rate's float64 bits subtracted from the largest positive
	// bits (higher rate first; a non-negative float64 orders like its bits). It is 0 in the miss branch.
	hi   uint64
	rate float64 // match rate (never NaN; never negative with CPUWeight in [0,1])
	load uint64  // lower first; below 2^33 (two uint32 counters)
	key  uint64  // seeded tie-break, lower first; distinct per index (TieKey is a bijection of it)
	idx  uint32
}

// maxRateBits is the bit pattern every non-negative finite match rate's bits are at most.
const maxRateBits = 1<<63 - 1

// before reports whether a ranks before b: hi, then lower load, then lower tie key, then lower index.
func before(a, b *item) bool {
	// Every comparison is computed first and then combined, so the compiler can fold the || and &&
	// into boolean arithmetic: in Go's wasm code each taken branch is a br_table dispatch.
	hlt, heq := a.hi < b.hi, a.hi == b.hi
	llt, leq := a.load < b.load, a.load == b.load
	klt, keq := a.key < b.key, a.key == b.key
	ilt := a.idx < b.idx
	return hlt || heq && (llt || leq && (klt || keq && ilt))
}

// sortPerm orders perm (positions in items) by before: binary insertion up to 64 positions, pdqsort
// above.
func sortPerm(perm []uint32, items []item) {
	if len(perm) > 64 {
		slices.SortFunc(perm, func(a, b uint32) int {
			if before(&items[a], &items[b]) {
				return -1
			}
			if before(&items[b], &items[a]) {
				return 1
			}
			return 0
		})
		return
	}
	for i := 1; i < len(perm); i++ {
		x := perm[i]
		xp := &items[x]
		lo, hi := 0, i
		for lo < hi {
			m := int(uint(lo+hi) >> 1)
			if before(xp, &items[perm[m]]) {
				hi = m
			} else {
				lo = m + 1
			}
		}
		if lo < i {
			copy(perm[lo+1:i+1], perm[lo:i])
			perm[lo] = x
		}
	}
}

// Ranker ranks snapshots with one Config, reusing its scratch.
type Ranker struct {
	Config Config // thresholds and weights every Rank call uses
	items  []item
	keys   []uint64 // packed sort keys (fast path); capacity ≥ 16 for the sorting networks
	perm   []uint32 // positions in items, sorted by rankFull
	sel    []uint64 // the prefix path's selected keys and their sort's scratch (as keys)
}

// New returns a Ranker for cfg.
func New(cfg Config) *Ranker { return &Ranker{Config: cfg} }

// MatchRate returns (gpu + cpuWeight·cpu) × blockSize / promptTokens, or 0 for an empty prompt. Each
// product is rounded explicitly so no platform fuses it into an FMA (native and Wasm must agree bit for
// bit).
func MatchRate(gpu, cpu, blockSize, promptTokens uint32, cpuWeight float64) float64 {
	if promptTokens == 0 {
		return 0
	}
	credit := float64(gpu) + float64(cpuWeight*float64(cpu))
	return float64(credit*float64(blockSize)) / float64(promptTokens)
}

// Packed key layout of the fast path, most significant bit first, with pb position bits (posBits(k)
// for k healthy endpoints: 6 up to 64, then bits.Len(k−1), at most 11):
//
//	63        group: 1 = after the others (overloaded in affinity, not drawn in balance)
//	62..40    rate field (affinity, group 0 only): 2^23−1 − (rate bits >> 40), so higher rates first
//	39..pb    load in its lb bits (lb = bits.Len64 of the highest load), then the tie key's top 40−pb−lb
//	          bits (none when lb = 40−pb; a larger lb takes rankFull)
//	pb−1..0   position in items
//
// The key orders exactly like before() unless two keys tie above the position bits or two group-0
// affinity keys share a rate field with different rates; emit detects both and Rank then reranks with
// rankFull.
const (
	minPosBits = 6
	maxPosBits = 11
	fieldLow   = 40 // lowest bit of the rate field
	rateField  = 1<<23 - 1
	group      = 1 << 63
)

// maxFast is the largest fleet the packed keys hold (positions in 11 bits; a v1.0 snapshot in the Go
// SDK's 64 KiB buffer has at most sdk.MaxEndpoints = 1,364).
const maxFast = 1 << maxPosBits

// posBits returns the position bits of the packed keys for k items: 6 up to 64 (the layout the fast
// path had when it stopped at 64), else bits.Len(k−1).
func posBits(k int) uint { return max(minPosBits, uint(bits.Len(uint(k-1)))) }

// overLimit turns the imbalance threshold t into an integer: float64(d) > t ⇔ int64(d) > overLimit(t)
// for every load difference 0 ≤ d < 2^33.
func overLimit(t float64) int64 {
	switch {
	case t != t: // NaN: nothing compares greater
		return math.MaxInt64
	case t < 0:
		return -1
	case t >= 1<<62:
		return math.MaxInt64
	}
	return int64(t) // floor(t): an integer exceeds t iff it exceeds floor(t)
}

// Rank appends the ranking of s (Endpoint.Index values, best first) to out and returns it with the
// branch taken.
//
// Up to 2,048 endpoints it sorts one packed 64-bit key per endpoint (sorting networks up to 16, merged
// above): in Go's wasm code every loop iteration and taken branch goes through the function's dispatch
// loop, so the fast path keeps its loops in small functions without branches. It falls back to
// rankFull (the multi-field comparison) above 2,048 endpoints, for a CPU weight outside [0,1], for a
// load too wide for the key (more than 40 − position bits: above 2^29 requests at 2,048 endpoints) and
// when the packed keys cannot decide an order.
func (r *Ranker) Rank(s *sdk.Snapshot, out []uint32) ([]uint32, Tier) {
	cfg := &r.Config
	req := &s.Request
	n := len(s.Endpoints)
	if n > maxFast || !(cfg.CPUWeight >= 0 && cfg.CPUWeight <= 1) {
		return r.rankFull(s, out)
	}
	if cap(r.items) < n || cap(r.keys) < keysCap(n) {
		r.grow(n)
	}
	bs, pt, w := float64(req.BlockSize), float64(req.PromptTokens), cfg.CPUWeight
	if req.PromptTokens == 0 { // MatchRate's empty prompt: every rate is +0, without a branch per endpoint
		bs, pt, w = 0, 1, 0
	}
	k, minLoad, maxLoad := scan(s.Endpoints, r.items[:n], req.Seed, bs, pt, w)
	if k == 0 {
		return out, TierNone
	}
	items := r.items[:k]
	keys := r.keys[:k]
	lb, pb := uint(bits.Len64(maxLoad)), posBits(k)
	if lb > fieldLow-pb {
		return r.rankFull(s, out)
	}
	bf, bo, nOver := classify(items, keys, minLoad, overLimit(cfg.ImbalanceThreshold), lb, pb)
	bestFree, bestOver := math.Float64frombits(bf), math.Float64frombits(bo)
	if nOver == len(items) {
		bestFree = -1
	}
	if nOver == 0 {
		bestOver = -1
	}
	tier := TierAffinity
	if !(bestFree >= cfg.MatchThreshold) {
		tier = rekey(keys, bestOver >= cfg.MatchThreshold, req.Seed)
	}
	l := int(req.RankLimit)
	if l <= 0 || l >= k {
		l = k
	} else if l < topMax && k >= topMin {
		if res, ok := r.top(out, keys, items, pb, l); ok {
			return res, tier
		}
	}
	o := len(out)
	sortPacked(keys, r.keys[:cap(r.keys)])
	res, tied := emit(slices.Grow(out, len(keys)), keys, items, pb)
	if tied {
		res, tier = r.rankFull(s, out)
	}
	return res[:o+l], tier
}

// The prefix path (sdk.Request.RankLimit): limits below topMax on at least topMin healthy endpoints
// select the limit+1 smallest keys instead of sorting them all; other limits rank in full and cut.
const (
	topMax = 16 // limit+1 keys must fit the 16 lanes' minima
	topMin = 32 // below this the full sort costs about what the selection does
)

// top appends the first l (< topMax) entries of the ranking the packed keys give to out and reports
// whether they decide it; when not, the caller ranks in full. keys (at least topMin) are classify's or
// rekey's, in item order (key i has position i).
//
// The 16 lanes' minima (lane = position mod 16) are 16 distinct keys, so the largest of them, t, is at
// least the 16th smallest key: the l+1 ≤ 16 smallest keys are among those ≤ t, which compact gathers
// (usually a few dozen) and sortPacked orders. emit's checks over those l+1 keys cover every pair of
// the prefix and its boundary (a key tied with the l-th above the position bits); what they cannot see
// is a run of keys sharing the l-th key's rate field that continues past position l with a different
// rate (the packed order within a rate field is by load, not by rate), so when the l-th and the
// (l+1)-th share a nonzero rate field, uniformRate checks the whole run.
func (r *Ranker) top(out []uint32, keys []uint64, items []item, pb uint, l int) ([]uint32, bool) {
	w := r.keys[:cap(r.keys)]
	n := (len(keys) + 15) &^ 15
	for i := len(keys); i < n; i++ {
		w[i] = math.MaxUint64 // padding: never a lane's minimum (every lane holds a key)
	}
	t := laneMinMax(w[:n])
	buf := r.sel[:cap(r.sel)]
	c := compact(keys, buf, t)
	if keysCap(c) > len(buf) {
		return out, false // the keys ≤ t do not fit the scratch (lanes very unevenly filled)
	}
	sel := buf[:c]
	sortPacked(sel, buf)
	o := len(out)
	res, tied := emit(slices.Grow(out, l+1), sel[:l+1], items, pb)
	if tied {
		return out, false
	}
	posMask := uint64(1)<<(pb&63) - 1
	if m := sel[l-1]; (m^sel[l]) < 1<<fieldLow && m>>fieldLow&rateField != 0 &&
		!uniformRate(keys, items, m, math.Float64bits(items[m&posMask].rate)) {
		return out, false
	}
	return res[:o+l], true
}

// laneMinMax returns the largest of the 16 lanes' minima of w (len(w) a multiple of 16, every lane
// holding at least one key below the padding).
//
//go:noinline
func laneMinMax(w []uint64) uint64 {
	m0, m1, m2, m3, m4, m5, m6, m7 := w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]
	m8, m9, m10, m11, m12, m13, m14, m15 := w[8], w[9], w[10], w[11], w[12], w[13], w[14], w[15]
	for b := 16; b+16 <= len(w); b += 16 {
		v := (*[16]uint64)(w[b : b+16])
		m0, m1, m2, m3 = min(m0, v[0]), min(m1, v[1]), min(m2, v[2]), min(m3, v[3])
		m4, m5, m6, m7 = min(m4, v[4]), min(m5, v[5]), min(m6, v[6]), min(m7, v[7])
		m8, m9, m10, m11 = min(m8, v[8]), min(m9, v[9]), min(m10, v[10]), min(m11, v[11])
		m12, m13, m14, m15 = min(m12, v[12]), min(m13, v[13]), min(m14, v[14]), min(m15, v[15])
	}
	return max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)),
		max(max(m8, m9), max(m10, m11)), max(max(m12, m13), max(m14, m15)))
}

// compact copies the keys ≤ t to dst (room for len(keys)), in order, and returns how many.
//
//go:noinline
func compact(keys, dst []uint64, t uint64) int {
	dst = dst[:len(keys)]
	base := unsafe.Pointer(unsafe.SliceData(dst))
	c := uintptr(0)
	for _, kk := range keys {
		// c ≤ the loop index < len(dst): written unconditionally, kept by advancing c.
		*(*uint64)(unsafe.Add(base, c*8)) = kk
		var b uintptr
		if kk <= t {
			b = 1
		}
		c += b
	}
	return int(c)
}

// uniformRate reports whether every key with m's group and rate field (keys[i] belongs to items[i])
// has the match rate whose bits are rate.
//
//go:noinline
func uniformRate(keys []uint64, items []item, m, rate uint64) bool {
	items = items[:len(keys)]
	var bad uint64
	for i, kk := range keys {
		var s, d uint64
		if kk^m < 1<<fieldLow {
			s = 1
		}
		if math.Float64bits(items[i].rate) != rate {
			d = 1
		}
		bad |= s & d
	}
	return bad == 0
}

// drawTwo is the balance branch's power of two choices: two distinct positions in [0,n) drawn with
// sdk.Rand seeded by the request's seed. With n = 1 (only possible with a negative imbalance threshold,
// which ParseConfig rejects) both are 0.
func drawTwo(seed uint64, n int) (a, b int) {
	if n < 2 {
		return 0, 0
	}
	rng := sdk.NewRand(seed)
	a = rng.Intn(n)
	b = rng.Intn(n - 1)
	if b >= a {
		b++
	}
	return a, b
}

// scan writes the healthy endpoints' load, match rate, tie key and index to items[0:k] and returns k
// with the lowest and highest load among them. The body has no branch: an unhealthy endpoint's item is
// written and then overwritten (k does not advance), and it counts in neither load bound.
//
//go:noinline
func scan(eps []sdk.Endpoint, items []item, seed uint64, bs, pt, w float64) (k int, minLoad, maxLoad uint64) {
	minLoad = math.MaxUint64
	items = items[:len(eps)]
	base := unsafe.Pointer(unsafe.SliceData(items))
	for i := range eps {
		e := &eps[i]
		h := uint64(e.Flags & sdk.FlagHealthy)
		load := uint64(e.Waiting) + uint64(e.InFlightRequests)
		minLoad = min(minLoad, load|(h-1))
		maxLoad = max(maxLoad, load&-h)
		// The same operations as MatchRate (uint32 → int64 → float64 is exact and avoids wasm's
		// unsigned conversion).
		credit := float64(int64(e.GPUBlocks)) + float64(w*float64(int64(e.CPUBlocks)))
		// k ≤ i < len(items), so items[k] needs no bounds check (a taken jump in Go's wasm code).
		it := (*item)(unsafe.Add(base, uintptr(k)*unsafe.Sizeof(item{})))
		it.rate = float64(credit*bs) / pt
		it.load = load
		it.key = sdk.TieKey(seed, e.Index)
		it.idx = e.Index
		k += int(h)
	}
	return k, minLoad, maxLoad
}

// classify writes each item's packed key as the affinity branch wants it (lb load bits, pb position
// bits, lb+pb ≤ 40) and returns the bits of the best match rates of the free and the overloaded items
// (rates are ≥ 0, so their bits order like them) and the number of overloaded ones.
//
//go:noinline
func classify(items []item, keys []uint64, minLoad uint64, limit int64, lb, pb uint) (bestFree, bestOver uint64, nOver int) {
	keys = keys[:len(items)]
	// The tie key's top fieldLow−pb−lb bits at bit pb: its top fieldLow−lb bits (a shift of 24 + lb,
	// in [24, 64)) with the position bits cleared. Shift counts masked with 63 are used as they are; an
	// unmasked count is a compare and select per shift in Go's wasm code.
	tieShift, loadShift := (64-fieldLow+lb)&63, (fieldLow-lb)&63
	posMask := uint64(1)<<(pb&63) - 1
	for i := range items {
		it := &items[i]
		rb := math.Float64bits(it.rate)
		// All ones when overloaded: load − minLoad < 2^33 and limit ≥ −1, so the difference cannot
		// overflow.
		m := uint64((limit - int64(it.load-minLoad)) >> 63)
		nOver += int(m & 1)
		rf := (rateField - rb>>fieldLow) << fieldLow
		keys[i] = it.load<<loadShift | it.key>>tieShift&^posMask | uint64(i) | group&m | rf&^m
		bestOver = max(bestOver, rb&m)
		bestFree = max(bestFree, rb&^m)
	}
	return bestFree, bestOver, nOver
}

// emit appends the indices of the items in key order and reports whether the packed keys (pb position
// bits) failed to decide the order: two keys equal above the position bits, or adjacent keys with the
// same nonzero rate field (group 0 in affinity) whose exact rates differ.
//
//go:noinline
func emit(out []uint32, keys []uint64, items []item, pb uint) ([]uint32, bool) {
	o := len(out)
	out = out[:o+len(keys)]
	dst := out[o:]
	dst = dst[:len(keys)]
	base := unsafe.Pointer(unsafe.SliceData(items))
	var tied uint64
	posMask := uint64(1)<<(pb&63) - 1
	prev, prevRate := uint64(math.MaxUint64), uint64(0)
	for j, kk := range keys {
		// The position bits are < len(items) (classify wrote them).
		it := (*item)(unsafe.Add(base, uintptr(kk&posMask)*unsafe.Sizeof(item{})))
		rb := math.Float64bits(it.rate)
		// Three flags combined without && or ||: each short-circuit is a jump in Go's wasm code. Keys
		// equal above bit b differ by less than 1<<b (no shift by the variable pb: in Go's wasm code a
		// shift by an unbounded count is a compare and a select).
		d := kk ^ prev
		var t, u, v uint64
		if d <= posMask {
			t = 1
		}
		if d < 1<<fieldLow {
			u = kk >> fieldLow & rateField
		}
		if rb != prevRate {
			v = 1
		}
		tied |= t | u*v
		prev, prevRate = kk, rb
		dst[j] = it.idx
	}
	return out, tied != 0
}

// rankFull is the ranking with the multi-field comparison (before) over positions: the reference
// order the packed keys reproduce.
func (r *Ranker) rankFull(s *sdk.Snapshot, out []uint32) ([]uint32, Tier) {
	cfg := &r.Config
	req := &s.Request
	items := r.items[:0]
	var minLoad uint64
	first := true
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if !e.Healthy() {
			continue
		}
		load := uint64(e.Waiting) + uint64(e.InFlightRequests)
		if first || load < minLoad {
			minLoad, first = load, false
		}
		items = append(items, item{rate: MatchRate(e.GPUBlocks, e.CPUBlocks, req.BlockSize, req.PromptTokens, cfg.CPUWeight),
			load: load, key: sdk.TieKey(req.Seed, e.Index), idx: e.Index})
	}
	r.items = items
	if len(items) == 0 {
		return out, TierNone
	}
	bestFree, bestOver := -1.0, -1.0
	perm := r.perm[:0]
	for i := range items {
		it := &items[i]
		if float64(it.load-minLoad) > cfg.ImbalanceThreshold {
			it.hi = group
			bestOver = max(bestOver, it.rate)
		} else {
			it.hi = maxRateBits - math.Float64bits(it.rate)
			bestFree = max(bestFree, it.rate)
		}
		perm = append(perm, uint32(i))
	}
	r.perm = perm
	var tier Tier
	switch {
	case bestFree >= cfg.MatchThreshold:
		tier = TierAffinity
	case bestOver >= cfg.MatchThreshold:
		tier = TierBalance
		a, b := drawTwo(req.Seed, len(items))
		for i := range items {
			items[i].hi = group
		}
		items[a].hi, items[b].hi = 0, 0
	default:
		tier = TierMiss
		for i := range items {
			items[i].hi = 0
		}
	}
	sortPerm(perm, items)
	for _, p := range perm {
		out = append(out, items[p].idx)
	}
	return out, tier
}

// Policy is the sdk.Policy form of the three-tier ranker (what the embedded Wasm module registers).
type Policy struct {
	r Ranker
}

// HonorsRankLimit marks the policy sdk.RankLimited: Rank returns exactly the first RankLimit entries of
// the whole ranking (TestRankPrefixes), so the module declares ABI v1.1.
func (p *Policy) HonorsRankLimit() {}

// Init parses the config (see ParseConfig).
func (p *Policy) Init(config []byte) error {
	c, err := ParseConfig(config)
	if err != nil {
		return err
	}
	p.r.Config = c
	return nil
}

// Choose ranks s into r.
func (p *Policy) Choose(s *sdk.Snapshot, r *sdk.Ranking) error {
	out, _ := p.r.Rank(s, r.AppendTo())
	r.Set(out)
	return nil
}

// rekey rewrites the affinity keys classify wrote for the balance branch (the two drawn endpoints
// first, then all by load) or the miss branch (all by load) and returns the branch.
//
//go:noinline
func rekey(keys []uint64, balance bool, seed uint64) Tier {
	if !balance {
		for i := range keys {
			keys[i] &= 1<<fieldLow - 1
		}
		return TierMiss
	}
	a, b := drawTwo(seed, len(keys))
	for i := range keys {
		keys[i] = keys[i]&(1<<fieldLow-1) | group
	}
	keys[a] &^= group
	keys[b] &^= group
	return TierBalance
}

// sortPacked sorts keys ascending; all is keys' backing array with room for keysCap(len(keys)).
//
//go:noinline
func sortPacked(keys, all []uint64) {
	switch {
	case len(keys) <= 8:
		for i := len(keys); i < 8; i++ {
			all[i] = math.MaxUint64
		}
		sortNet8((*[8]uint64)(all))
	case len(keys) <= 16:
		for i := len(keys); i < 16; i++ {
			all[i] = math.MaxUint64
		}
		sortNet16((*[16]uint64)(all))
	default:
		sortMerge(keys, all)
	}
}

// mergePad fills the last block of 16 above the keys for sortMerge: larger than every key (the top key
// is group | 2^40−1), smaller than the merge sentinel.
const mergePad = math.MaxUint64 - 1

// sortMerge sorts keys (more than 16): blocks of 16 by sortNet16, then runs merged pairwise. all
// is keys' backing array, with room for a multiple of 16 keys plus the merge's scratch (as many + 4).
func sortMerge(keys, all []uint64) {
	n := (len(keys) + 15) &^ 15
	w := all[:n]
	for i := len(keys); i < n; i++ {
		w[i] = mergePad
	}
	for b := 0; b+16 <= n; b += 16 {
		sortNet16((*[16]uint64)(w[b : b+16]))
	}
	tmp := all[n : n+n+4]
	for width := 16; width < n; width *= 2 {
		for lo := 0; lo+width < n; lo += 2 * width {
			mergeRuns(w[lo:min(lo+2*width, n)], width, tmp)
		}
	}
}

// mergeRuns merges the sorted runs w[:m] and w[m:] in place, through tmp (len(w)+4 words), from both
// ends at once: the front takes the smaller head, the back the larger tail, each len(w)/2 times. The two
// are independent chains of load, compare and select (a one-ended branch-free merge waits on each
// step's loads before the next), so the merge takes about half as long. Each run is copied to tmp
// between a low sentinel (0) and a high one (larger than every key), so neither end needs a bound test.
//
// The halves meet exactly: the front's first len(w)/2 outputs are the smallest keys and the back's the
// largest, with ties (only the padding keys, all in the second run) taken from the first run by the front
// and from the second by the back. A 0 key can only be the smallest one, which the back never reaches.
//
//go:noinline
func mergeRuns(w []uint64, m int, tmp []uint64) {
	n := len(w)
	tmp = tmp[:n+4]
	tmp[0] = 0
	copy(tmp[1:], w[:m])
	tmp[m+1] = math.MaxUint64
	tmp[m+2] = 0
	copy(tmp[m+3:], w[m:])
	tmp[n+3] = math.MaxUint64
	base := unsafe.Pointer(unsafe.SliceData(tmp))
	dst := unsafe.Pointer(unsafe.SliceData(w))
	i, j := uintptr(1), uintptr(m+3) // front heads
	p, q := uintptr(m), uintptr(n+2) // back tails
	// n is a multiple of 16 (whole blocks), so n/2 is even: two steps of each end per iteration.
	for k, e := uintptr(0), uintptr(n-1); k < uintptr(n/2); k, e = k+2, e-2 {
		i, j = frontStep(base, dst, k, i, j)
		p, q = backStep(base, dst, e, p, q)
		i, j = frontStep(base, dst, k+1, i, j)
		p, q = backStep(base, dst, e-1, p, q)
	}
}

// frontStep writes the smaller of tmp[i] and tmp[j] (base is tmp) to w[k] (dst is w) and advances the
// index it took (i on a tie).
func frontStep(base, dst unsafe.Pointer, k, i, j uintptr) (uintptr, uintptr) {
	x := *(*uint64)(unsafe.Add(base, i*8))
	y := *(*uint64)(unsafe.Add(base, j*8))
	var t uintptr
	if x <= y {
		t = 1
	}
	*(*uint64)(unsafe.Add(dst, k*8)) = min(x, y)
	return i + t, j + 1 - t
}

// backStep writes the larger of tmp[p] and tmp[q] to w[e] and moves back the index it took (q on a tie).
func backStep(base, dst unsafe.Pointer, e, p, q uintptr) (uintptr, uintptr) {
	x := *(*uint64)(unsafe.Add(base, p*8))
	y := *(*uint64)(unsafe.Add(base, q*8))
	var t uintptr
	if x > y {
		t = 1
	}
	*(*uint64)(unsafe.Add(dst, e*8)) = max(x, y)
	return p - t, q - 1 + t
}

// grow makes the fast path's scratch room for n endpoints (the keys at least 16, for the networks).
//
//go:noinline
func (r *Ranker) grow(n int) {
	r.items = make([]item, n)
	r.keys = make([]uint64, keysCap(n))
	r.sel = make([]uint64, keysCap(n))
}

// keysCap is the room the fast path's keys need for n endpoints: the keys padded to a multiple of 16
// (at least 16, for the networks), then sortMerge's scratch (as many again plus four sentinels).
func keysCap(n int) int {
	w := max((n+15)&^15, 16)
	return 2*w + 4
}
