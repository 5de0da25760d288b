package tokenizer

import (
	"container/heap"
	"unicode/utf8"
)

// bpe is HF's BPE model: a vocab, ranked merges and the options that change how a word starts out.
type bpe struct {
	vocab        *strTable // model-space token <-> ID (raw bytes for byte-level models)
	merges       *mergeTable
	byteID       [256]int32 // byte-level models: ID of each single-byte token, -1 if absent
	fallbackID   [256]int32 // byte_fallback: ID of "<0xXX>", -1 if absent
	unk          int32      // unk token ID, -1 if none
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
}

// mergeTable maps a pair of token IDs to (rank, merged ID) with open addressing; it is read-only after
// Load and measured faster than a Go map on this hot path (see RATIONALE.md).
type mergeTable struct {
	keys []uint64 // a<<32 | b, plus 1 so that 0 means empty
	vals []uint64 // rank<<32 | merged ID
	mask uint64
	n    int
}

func newMergeTable(capHint int) *mergeTable {
	size := 1
	for size < capHint*2 {
		size <<= 1
	}
	return &mergeTable{keys: make([]uint64, size), vals: make([]uint64, size), mask: uint64(size - 1)}
}

func mix64(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	return k
}

func (m *mergeTable) put(a, b, rank, id uint32) {
	if (m.n+1)*2 > len(m.keys) {
		m.grow()
	}
	k := uint64(a)<<32 | uint64(b) + 1
	for i := mix64(k) & m.mask; ; i = (i + 1) & m.mask {
		if m.keys[i] == 0 {
			m.keys[i], m.vals[i] = k, uint64(rank)<<32|uint64(id)
			m.n++
			return
		}
		if m.keys[i] == k { // duplicate pair: HF keeps the last one
			m.vals[i] = uint64(rank)<<32 | uint64(id)
			return
		}
	}
}

func (m *mergeTable) grow() {
	old := *m
	*m = *newMergeTable(len(old.keys))
	for i, k := range old.keys {
		if k != 0 {
			k--
			m.put(uint32(k>>32), uint32(k), uint32(old.vals[i]>>32), uint32(old.vals[i]))
		}
	}
}

// get returns rank<<32|id for the pair, ok false when the pair does not merge.
func (m *mergeTable) get(a, b uint32) (uint64, bool) {
	k := uint64(a)<<32 | uint64(b) + 1
	for i := mix64(k) & m.mask; ; i = (i + 1) & m.mask {
		switch m.keys[i] {
		case k:
			return m.vals[i], true
		case 0:
			return 0, false
		}
	}
}

// symbols turns a word into its initial symbols: one per byte (byte-level) or one per character with
// byte_fallback and unk handling (HF's BPE::merge_word).
func (b *bpe) symbols(dst []uint32, w string, byteLevel bool) []uint32 {
	if byteLevel {
		for i := 0; i < len(w); i++ {
			if id := b.byteID[w[i]]; id >= 0 {
				dst = append(dst, uint32(id))
			}
		}
		return dst
	}
	pendingUnk := false
	for i := 0; i < len(w); {
		_, size := utf8.DecodeRuneInString(w[i:])
		s := w[i : i+size]
		i += size
		if id, ok := b.vocab.get(s); ok {
			dst = append(dst, id)
			pendingUnk = false
			continue
		}
		if b.byteFallback {
			ok := true
			for k := 0; k < len(s); k++ {
				if b.fallbackID[s[k]] < 0 {
					ok = false
					break
				}
			}
			if ok {
				for k := 0; k < len(s); k++ {
					dst = append(dst, uint32(b.fallbackID[s[k]]))
				}
				pendingUnk = false
				continue
			}
		}
		if b.unk >= 0 {
			if b.fuseUnk && pendingUnk {
				continue
			}
			dst = append(dst, uint32(b.unk))
			pendingUnk = true
		}
	}
	return dst
}

// encodeWord appends the BPE encoding of one pre-token to dst.
func (b *bpe) encodeWord(dst []uint32, w string, byteLevel bool) []uint32 {
	if b.ignoreMerges {
		if id, ok := b.vocab.get(w); ok {
			return append(dst, id)
		}
	}
	start := len(dst)
	dst = b.symbols(dst, w, byteLevel)
	syms := dst[start:]
	if len(syms) < 2 {
		return dst
	}
	if len(syms) <= smallWord {
		n := b.mergeSmall(syms)
		return dst[:start+n]
	}
	n := b.mergeHeap(syms)
	return dst[:start+n]
}

// smallWord is the symbol count up to which a quadratic scan beats the heap.
const smallWord = 48

// mergeSmall applies merges in place by repeatedly merging the lowest-ranked adjacent pair (the leftmost
// one on ties), which is the order HF's heap produces. Pair ranks are looked up once and refreshed only
// next to each merge. It returns the new length.
func (b *bpe) mergeSmall(s []uint32) int {
	const none = ^uint64(0)
	n := len(s)
	var rk [smallWord]uint64 // rk[i]: rank<<32|id of the pair (s[i], s[i+1]), none if it does not merge
	for i := 0; i+1 < n; i++ {
		if v, ok := b.merges.get(s[i], s[i+1]); ok {
			rk[i] = v
		} else {
			rk[i] = none
		}
	}
	for n > 1 {
		best, pos := none, -1
		for i := 0; i+1 < n; i++ {
			if rk[i] < best {
				best, pos = rk[i], i
			}
		}
		if pos < 0 {
			break
		}
		s[pos] = uint32(best)
		copy(s[pos+1:n-1], s[pos+2:n])
		if pos+2 < n-1 {
			copy(rk[pos+1:n-2], rk[pos+2:n-1])
		}
		n--
		if pos > 0 {
			if v, ok := b.merges.get(s[pos-1], s[pos]); ok {
				rk[pos-1] = v
			} else {
				rk[pos-1] = none
			}
		}
		if pos+1 < n {
			if v, ok := b.merges.get(s[pos], s[pos+1]); ok {
				rk[pos] = v
			} else {
				rk[pos] = none
			}
		}
	}
	return n
}

// mergeItem is one candidate merge in the heap: ordered by rank, then by position.
type mergeItem struct {
	rank, pos uint32
	id        uint32
}

type mergeHeap []mergeItem

// Len, Less, Swap, Push and Pop implement heap.Interface (unexported type; methods exported for it).
func (h mergeHeap) Len() int { return len(h) }

// Less orders by rank, then by position (leftmost first).
func (h mergeHeap) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos
}

// Swap implements heap.Interface.
func (h mergeHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }

// Push implements heap.Interface.
func (h *mergeHeap) Push(x any) { *h = append(*h, x.(mergeItem)) }

// Pop implements heap.Interface.
func (h *mergeHeap) Pop() any          { o := *h; x := o[len(o)-1]; *h = o[:len(o)-1]; return x }
func (h *mergeHeap) push(it mergeItem) { heap.Push(h, it) }

// mergeHeap is HF's Word::merge_all for long words: a min-heap of (rank, position) with stale entries
// skipped. It rewrites s in place and returns the new length.
func (b *bpe) mergeHeap(s []uint32) int {
	n := len(s)
	prev := make([]int32, n)
	next := make([]int32, n)
	alive := make([]bool, n)
	for i := range s {
		prev[i], next[i], alive[i] = int32(i-1), int32(i+1), true
	}
	next[n-1] = -1
	h := make(mergeHeap, 0, n)
	for i := 0; i+1 < n; i++ {
		if v, ok := b.merges.get(s[i], s[i+1]); ok {
			h = append(h, mergeItem{rank: uint32(v >> 32), pos: uint32(i), id: uint32(v)})
		}
	}
	heap.Init(&h)
	for h.Len() > 0 {
		top := heap.Pop(&h).(mergeItem)
		p := int32(top.pos)
		if !alive[p] || next[p] < 0 {
			continue
		}
		q := next[p]
		v, ok := b.merges.get(s[p], s[q])
		if !ok || uint32(v) != top.id {
			continue
		}
		s[p] = top.id
		alive[q] = false
		next[p] = next[q]
		if next[q] >= 0 {
			prev[next[q]] = p
		}
		if pp := prev[p]; pp >= 0 {
			if v, ok := b.merges.get(s[pp], s[p]); ok {
				h.push(mergeItem{rank: uint32(v >> 32), pos: uint32(pp), id: uint32(v)})
			}
		}
		if nn := next[p]; nn >= 0 {
			if v, ok := b.merges.get(s[p], s[nn]); ok {
				h.push(mergeItem{rank: uint32(v >> 32), pos: uint32(p), id: uint32(v)})
			}
		}
	}
	k := 0
	for i := 0; i < n; i++ {
		if alive[i] {
			s[k] = s[i]
			k++
		}
	}
	return k
}
