// Package probe is the linear-probing arithmetic kvstore's open-addressing tables share (the memory
// index's shards, the speculative-expiry table and the ingester's engine-hash map), which delete by shifting
// later entries back instead of leaving tombstones.
package probe

// Stays reports whether the entry at slot j, whose home slot is home, must stay put when a deletion has
// emptied slot i and the scan for an entry to move into i has reached j: true when home lies cyclically in
// (i, j] (moving the entry to i would put it before its home, where lookups never look). Slots are indices
// into a power-of-two table; the scan from i to j may wrap around its end.
func Stays(i, home, j uint64) bool {
	if i <= j {
		return i < home && home <= j
	}
	return i < home || home <= j
}
