package lru

import (
	"slices"
	"sync"
	"testing"
)

// TestArenaExtend: in place when free or the same, a branch when the array continues differently, a
// growth copies and leaves older views intact; views are clipped.
func TestArenaExtend(t *testing.T) {
	buf := make([]uint32, 3, ArenaCap(3, 2))
	copy(buf, []uint32{1, 2, 3})
	a := NewArena(buf, 2)
	v, capacity, ok := a.Extend(3, []uint32{4})
	if !ok || !slices.Equal(v, []uint32{1, 2, 3, 4}) || cap(v) != len(v) || capacity != 5 || &v[0] != &buf[0] {
		t.Fatalf("in place: %v cap %d/%d ok %v", v, cap(v), capacity, ok)
	}
	if again, _, ok := a.Extend(2, []uint32{3, 4}); !ok || !slices.Equal(again, v) || &again[0] != &v[0] {
		t.Errorf("the same continuation again: %v %v", again, ok)
	}
	if _, _, ok := a.Extend(2, []uint32{9}); ok {
		t.Error("a different continuation extended in place")
	}
	grown, capacity, ok := a.Extend(4, []uint32{5, 6, 7})
	if !ok || !slices.Equal(grown, []uint32{1, 2, 3, 4, 5, 6, 7}) || capacity < ArenaCap(7, 2) || &grown[0] == &v[0] {
		t.Fatalf("growth: %v cap %d ok %v", grown, capacity, ok)
	}
	if !slices.Equal(v, []uint32{1, 2, 3, 4}) {
		t.Error("an older view changed")
	}
	bytes := NewArena([]byte("ab"), 8)
	if s, _, ok := bytes.Extend(1, []byte("bc")); !ok || string(s) != "abc" {
		t.Errorf("bytes: %q %v", s, ok)
	}
}

// TestArenaConcurrent: concurrent extensions of one arena (run with -race); each gets its own
// continuation or a branch, never another's bytes.
func TestArenaConcurrent(t *testing.T) {
	a := NewArena(make([]byte, 0, 16), 16)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			more := []byte{byte('a' + g), byte('a' + g)}
			if v, _, ok := a.Extend(0, more); ok && string(v) != string(more) {
				t.Errorf("got %q for %q", v, more)
			}
		}()
	}
	wg.Wait()
}
