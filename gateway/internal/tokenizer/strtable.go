package tokenizer

import "hash/maphash"

// strTable is the vocab: token bytes <-> ID, without a pointer per entry. All tokens live in one string
// indexed by ID (blob[off[id]:off[id+1]]); lookups probe an open-addressing array of IDs. A map[string]uint32
// and a []string of 150k+ entries cost every garbage collection of the process a walk over as many
// pointers (BenchmarkGC); this costs none.
type strTable struct {
	blob  string   // tokens concatenated in ID order
	off   []uint32 // len = number of IDs + 1; an ID the vocab does not define has an empty range
	has   []bool   // has[id]: the vocab defines id
	slots []uint32 // id+1, 0 = empty
	mask  uint64
	seed  maphash.Seed
	extra map[string]uint32 // tokens whose ID another token already took (kept for lookups only)
}

// strTableBuilder collects (token, ID) pairs.
type strTableBuilder struct {
	arena []byte
	ents  []strEnt
	maxID uint32
}

type strEnt struct{ start, end, id uint32 }

func (b *strTableBuilder) add(tok []byte, id uint32) {
	start := uint32(len(b.arena))
	b.arena = append(b.arena, tok...)
	b.ents = append(b.ents, strEnt{start, uint32(len(b.arena)), id})
	b.maxID = max(b.maxID, id)
}

func (b *strTableBuilder) build() *strTable {
	n := int(b.maxID) + 1
	if len(b.ents) == 0 {
		n = 0
	}
	t := &strTable{off: make([]uint32, n+1), has: make([]bool, n), seed: maphash.MakeSeed()}
	first := make([]int32, n) // entry index defining each ID, -1 if none
	for i := range first {
		first[i] = -1
	}
	for i, e := range b.ents {
		if first[e.id] < 0 {
			first[e.id] = int32(i)
		}
	}
	var blob []byte
	for id := 0; id < n; id++ {
		t.off[id] = uint32(len(blob))
		if k := first[id]; k >= 0 {
			e := b.ents[k]
			blob = append(blob, b.arena[e.start:e.end]...)
			t.has[id] = true
		}
	}
	t.off[n] = uint32(len(blob))
	t.blob = string(blob)
	size := 1
	for size < len(b.ents)*2 {
		size <<= 1
	}
	t.slots = make([]uint32, size)
	t.mask = uint64(size - 1)
	for i, e := range b.ents {
		if first[e.id] != int32(i) {
			if t.extra == nil {
				t.extra = map[string]uint32{}
			}
			t.extra[string(b.arena[e.start:e.end])] = e.id
			continue
		}
		tok := t.token(e.id)
		if _, ok := t.get(tok); ok {
			continue // the same string twice: the first definition wins
		}
		for j := maphash.String(t.seed, tok) & t.mask; ; j = (j + 1) & t.mask {
			if t.slots[j] == 0 {
				t.slots[j] = e.id + 1
				break
			}
		}
	}
	return t
}

// token returns the bytes of id ("" when the vocab does not define it).
func (t *strTable) token(id uint32) string {
	if int(id) >= len(t.has) {
		return ""
	}
	return t.blob[t.off[id]:t.off[id+1]]
}

// defines reports whether the vocab defines id.
func (t *strTable) defines(id uint32) bool { return int(id) < len(t.has) && t.has[id] }

func (t *strTable) get(s string) (uint32, bool) {
	for j := maphash.String(t.seed, s) & t.mask; ; j = (j + 1) & t.mask {
		v := t.slots[j]
		if v == 0 {
			break
		}
		if t.token(v-1) == s {
			return v - 1, true
		}
	}
	if t.extra != nil {
		id, ok := t.extra[s]
		return id, ok
	}
	return 0, false
}

// getBytes is get for a byte slice, without converting it.
func (t *strTable) getBytes(s []byte) (uint32, bool) {
	for j := maphash.Bytes(t.seed, s) & t.mask; ; j = (j + 1) & t.mask {
		v := t.slots[j]
		if v == 0 {
			break
		}
		id := v - 1
		if string(s) == t.blob[t.off[id]:t.off[id+1]] {
			return id, true
		}
	}
	if t.extra != nil {
		id, ok := t.extra[string(s)]
		return id, ok
	}
	return 0, false
}

// size returns the number of IDs the table spans.
func (t *strTable) size() int { return len(t.has) }
