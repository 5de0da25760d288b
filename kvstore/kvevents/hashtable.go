package kvevents

import (
	"math/bits"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/internal/probe"
)

// hashEntry maps one engine hash to kvgate's block key and its chain's family (kvstore.Update.Families:
// the Redis index's layout 2 files blocks by family; it fits in the slot's padding), with the number of
// live announcements per tier.
type hashEntry struct {
	key  kvstore.BlockKey
	refs [3]int32 // by kvstore.Tier (1 GPU, 2 CPU); refs[0] marks a used slot in hashTable
	fam  kvstore.Family
}

// held reports whether some tier still holds the hash.
func (he *hashEntry) held() bool {
	return he.refs[kvstore.TierGPU] != 0 || he.refs[kvstore.TierCPU] != 0
}

// hashTable is the Ingester's engine hash → hashEntry map: linear probing on a multiplicative hash of the
// engine hash (engine hashes may be small or sequential integers), backward-shift deletion. Compared with
// a Go map it needs one probe where the map needed a lookup and then an assignment, and entries are
// updated in place through the returned pointer (RATIONALE.md, "Follow-up O5"). Pointers are valid until
// the next put, del or evict.
//
// Memory: 32 bytes a slot, at most 4 slots for 3 entries before the table doubles, so between 43 and 85
// bytes an entry (RATIONALE.md, "Why is the engine-hash map capped, and by CLOCK?"). The table never
// shrinks; reset keeps it.
type hashTable struct {
	slots []hashSlot
	shift uint8 // 64 - log2(len(slots))
	count int
	hand  uint64 // evict's CLOCK hand: the next slot it examines
}

type hashSlot struct {
	h EngineHash
	e hashEntry
}

const usedMark = 1 // hashEntry.refs[0] of an occupied slot

// unconfirmedMark is ORed into refs[0] of entries whose index entries were demoted (Ingester.demote): their
// tier counts describe the index before the demotion, so the next BlockStored restarts them.
const unconfirmedMark = 2

// refMark is ORed into refs[0] of an entry used since evict's hand last passed it (CLOCK's reference bit):
// touch sets it (a BlockStored of the hash or of a child), evict clears it and gives the entry a second
// chance.
const refMark = 4

// touch marks the entry used.
func (he *hashEntry) touch() { he.refs[0] |= refMark }

// unconfirmed reports whether the entry was marked by markUnconfirmed since its last BlockStored.
func (he *hashEntry) unconfirmed() bool { return he.refs[0]&unconfirmedMark != 0 }

// confirm clears the unconfirmed mark and, if it was set, the tier counts.
func (he *hashEntry) confirm() {
	if he.unconfirmed() {
		he.refs = [3]int32{usedMark | he.refs[0]&refMark}
	}
}

// markUnconfirmed marks every entry unconfirmed.
func (t *hashTable) markUnconfirmed() {
	for i := range t.slots {
		if t.slots[i].e.refs[0] != 0 {
			t.slots[i].e.refs[0] |= unconfirmedMark
		}
	}
}

// eachHeld calls f with the block key and family of every confirmed entry held on tier.
func (t *hashTable) eachHeld(tier kvstore.Tier, f func(kvstore.BlockKey, kvstore.Family)) {
	for i := range t.slots {
		e := &t.slots[i].e
		if e.refs[0] != 0 && e.refs[0]&unconfirmedMark == 0 && e.refs[tier] > 0 {
			f(e.key, e.fam)
		}
	}
}

// dropUnconfirmed removes the entries still marked unconfirmed and returns how many.
func (t *hashTable) dropUnconfirmed() int {
	var hs []EngineHash
	for i := range t.slots {
		if t.slots[i].e.refs[0]&unconfirmedMark != 0 {
			hs = append(hs, t.slots[i].h)
		}
	}
	for _, h := range hs {
		t.del(h)
	}
	return len(hs)
}

func (t *hashTable) home(h EngineHash) uint64 {
	return (uint64(h) * 0x9e3779b97f4a7c15) >> t.shift
}

// len returns the number of entries.
func (t *hashTable) len() int { return t.count }

// get returns h's entry, or nil.
func (t *hashTable) get(h EngineHash) *hashEntry {
	if t.count == 0 {
		return nil
	}
	mask := uint64(len(t.slots) - 1)
	for p := t.home(h); ; p = (p + 1) & mask {
		sl := &t.slots[p]
		if sl.e.refs[0] == 0 {
			return nil
		}
		if sl.h == h {
			return &sl.e
		}
	}
}

// put returns h's entry, adding a zero one (no key, no tier counts, referenced) when there is none; added
// reports that. put never evicts: a bounded caller evicts first (Ingester.makeRoom).
func (t *hashTable) put(h EngineHash) (e *hashEntry, added bool) {
	if (t.count+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	mask := uint64(len(t.slots) - 1)
	p := t.home(h)
	for ; t.slots[p].e.refs[0] != 0; p = (p + 1) & mask {
		if t.slots[p].h == h {
			return &t.slots[p].e, false
		}
	}
	t.slots[p] = hashSlot{h: h, e: hashEntry{refs: [3]int32{usedMark | refMark}}} // referenced: see evict
	t.count++
	return &t.slots[p].e, true
}

func (t *hashTable) grow() {
	old := t.slots
	n := max(64, 2*len(old))
	t.slots = make([]hashSlot, n)
	t.shift = uint8(64 - bits.Len(uint(n-1)))
	mask := uint64(n - 1)
	for i := range old {
		if old[i].e.refs[0] == 0 {
			continue
		}
		p := t.home(old[i].h)
		for t.slots[p].e.refs[0] != 0 {
			p = (p + 1) & mask
		}
		t.slots[p] = old[i]
	}
}

// del removes h if present, shifting later entries of its probe run back (no tombstones).
func (t *hashTable) del(h EngineHash) {
	if t.count == 0 {
		return
	}
	mask := uint64(len(t.slots) - 1)
	i := t.home(h)
	for ; ; i = (i + 1) & mask {
		if t.slots[i].e.refs[0] == 0 {
			return
		}
		if t.slots[i].h == h {
			break
		}
	}
	t.delAt(i)
}

// evict removes one entry in CLOCK order and returns it (false when the table is empty): the hand walks
// the slots, clearing the reference bit of each used entry it passes (a second chance) and evicting the
// first whose bit was clear. New entries start referenced (touch), so a flood of fresh entries evicts
// entries about one to two sweeps old rather than the newest. Slot order is hash order, not age: this
// approximates LRU as the memory index's CLOCK does.
func (t *hashTable) evict() (EngineHash, hashEntry, bool) {
	if t.count == 0 {
		return 0, hashEntry{}, false
	}
	mask := uint64(len(t.slots) - 1)
	for i := t.hand & mask; ; i = (i + 1) & mask {
		sl := &t.slots[i]
		if sl.e.refs[0] == 0 {
			continue
		}
		if sl.e.refs[0]&refMark != 0 {
			sl.e.refs[0] &^= refMark
			continue
		}
		h, e := sl.h, sl.e
		t.delAt(i)
		t.hand = i // the backward shift may have moved a later entry into slot i: it is examined next
		return h, e, true
	}
}

// delAt removes the entry in slot i, shifting later entries of its probe run back.
func (t *hashTable) delAt(i uint64) {
	mask := uint64(len(t.slots) - 1)
	for {
		t.slots[i] = hashSlot{}
		j := i
		for {
			j = (j + 1) & mask
			if t.slots[j].e.refs[0] == 0 {
				t.count--
				return
			}
			home := t.home(t.slots[j].h)
			if probe.Stays(i, home, j) { // home lies cyclically in (i, j]: the entry cannot move to i
				continue
			}
			break
		}
		t.slots[i] = t.slots[j]
		i = j
	}
}

// reset removes every entry, keeping the allocated table.
func (t *hashTable) reset() {
	clear(t.slots)
	t.count = 0
	t.hand = 0
}
