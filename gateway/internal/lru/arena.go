package lru

import (
	"slices"
	"sync"
)

// Arena is the append-only backing array of one conversation's T values (token IDs, prompt bytes).
// Elements below the array's length are never written again: cached entries and results are views of it
// (clipped, len == cap, so a caller's append reallocates), and a later turn of the conversation appends
// after the length, or to a larger copy when the capacity is used up (older views keep the older array).
// Only the appending needs the lock; a view is read without it. Safe for concurrent use.
type Arena[T comparable] struct {
	mu    sync.Mutex
	buf   []T
	spare int
}

// NewArena returns an arena holding buf (whose spare capacity it takes over). When it grows, it grows to
// ArenaCap(need, minSpare) elements.
func NewArena[T comparable](buf []T, minSpare int) *Arena[T] {
	return &Arena[T]{buf: buf, spare: minSpare}
}

// ArenaCap is the capacity of an arena array for n elements: a quarter more, and at least minSpare more
// (about a turn), so a growing conversation copies each element about four times in all and the spare
// capacity stays small.
func ArenaCap(n, minSpare int) int { return n + max(n/4, minSpare) }

// Extend returns a view of the arena's first n elements (n ending at a cached boundary, at most the
// arena's length) followed by more: more is appended in place when the elements after n are free, or
// the elements after n already start with more (the same conversation's previous turn, or the same
// prompt again). ok is false when the elements after n belong to a different continuation (a branch);
// the caller then copies the prefix to a new arena. capacity is the capacity of the array view is a view
// of (what the view keeps alive).
func (a *Arena[T]) Extend(n int, more []T) (view []T, capacity int, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	have := a.buf[n:]
	k := 0
	for k < len(have) && k < len(more) && have[k] == more[k] {
		k++
	}
	switch {
	case k == len(more): // already there
		return a.buf[: n+k : n+k], cap(a.buf), true
	case k < len(have): // the array continues differently: a branch
		return nil, 0, false
	}
	need := len(a.buf) + len(more) - k
	if need > cap(a.buf) {
		// slices.Grow does not zero the part it copies.
		a.buf = slices.Grow(a.buf[:len(a.buf):len(a.buf)], ArenaCap(need, a.spare)-len(a.buf))
	}
	a.buf = append(a.buf, more[k:]...)
	return a.buf[:need:need], cap(a.buf), true
}
