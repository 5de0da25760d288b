package kvstore

import "github.com/kvgate/kvgate/kvstore/internal/probe"

// specTable maps (internal key, holder ID) to a speculative hold's expiry (Unix ns): one shard's table,
// guarded by the shard's lock. Linear probing with backward-shift deletion, so the constant insert and
// delete churn of speculative holds (every Record inserts, every sweep deletes) leaves no tombstones. A Go
// map with a 16-byte struct key did: it hashed the whole key with the generic hasher and, after enough
// churn, probed long runs of deleted slots (RATIONALE.md, "Follow-up O5").
type specTable struct {
	slots []specSlot // power-of-two length, or nil while empty
	mask  uint64
	count int
}

type specSlot struct {
	ik   uint64
	exp  int64
	hid  uint16
	used bool
}

// specHome is the home position of (ik, hid): ik is already well mixed (an XXH64 block key XOR the
// model's mix), hid spreads one key's holders.
func specHome(ik uint64, hid uint16, mask uint64) uint64 {
	return (ik ^ uint64(hid)*0x9e3779b97f4a7c15) & mask
}

// find returns the position of (ik, hid), or -1.
func (t *specTable) find(ik uint64, hid uint16) int {
	if t.count == 0 {
		return -1
	}
	for p := specHome(ik, hid, t.mask); ; p = (p + 1) & t.mask {
		sl := &t.slots[p]
		if !sl.used {
			return -1
		}
		if sl.ik == ik && sl.hid == hid {
			return int(p)
		}
	}
}

// get returns the expiry of (ik, hid), 0 if there is none.
func (t *specTable) get(ik uint64, hid uint16) int64 {
	if p := t.find(ik, hid); p >= 0 {
		return t.slots[p].exp
	}
	return 0
}

// raise sets (ik, hid)'s expiry to exp unless it already is at least exp, and reports whether it changed.
func (t *specTable) raise(ik uint64, hid uint16, exp int64) bool {
	if (t.count+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	p := specHome(ik, hid, t.mask)
	for ; t.slots[p].used; p = (p + 1) & t.mask {
		if sl := &t.slots[p]; sl.ik == ik && sl.hid == hid {
			if sl.exp >= exp {
				return false
			}
			sl.exp = exp
			return true
		}
	}
	t.slots[p] = specSlot{ik: ik, hid: hid, exp: exp, used: true}
	t.count++
	return true
}

func (t *specTable) grow() {
	old := t.slots
	n := max(64, 2*len(old))
	t.slots = make([]specSlot, n)
	t.mask = uint64(n - 1)
	for i := range old {
		if !old[i].used {
			continue
		}
		p := specHome(old[i].ik, old[i].hid, t.mask)
		for t.slots[p].used {
			p = (p + 1) & t.mask
		}
		t.slots[p] = old[i]
	}
}

// del removes (ik, hid) if present, shifting later entries of its probe run back (no tombstones).
func (t *specTable) del(ik uint64, hid uint16) {
	p := t.find(ik, hid)
	if p < 0 {
		return
	}
	i := uint64(p)
	for {
		t.slots[i] = specSlot{}
		j := i
		for {
			j = (j + 1) & t.mask
			if !t.slots[j].used {
				t.count--
				return
			}
			home := specHome(t.slots[j].ik, t.slots[j].hid, t.mask)
			if probe.Stays(i, home, j) { // home lies cyclically in (i, j]: the entry cannot move to i
				continue
			}
			break
		}
		t.slots[i] = t.slots[j]
		i = j
	}
}
