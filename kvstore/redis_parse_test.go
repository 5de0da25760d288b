package kvstore

import (
	"strconv"
	"testing"
)

func TestMatchRuns(t *testing.T) {
	now := int64(1_000_000)
	spec := func(exp int64, tiers int64) string { return itoa(exp*4 + tiers) }
	vals := []any{
		"a\t1\nb\t2\nc\t" + spec(now+5, 0) + "\nd\t" + spec(now-5, 0) + "\n",
		"a\t3\nb\t2\nc\t" + spec(now+5, 2) + "\n",
		"a\t2\nc\t1\n",
		"c\t1\n",
		nil,
		"c\t1\n",
	}
	got, err := matchRuns(now, vals)
	if err != nil {
		t.Fatal(err)
	}
	want := map[EndpointID][2]int{"a": {2, 1}, "b": {0, 2}, "c": {4, 0}}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for _, m := range got {
		if w := want[m.Endpoint]; w != [2]int{m.GPUBlocks, m.CPUBlocks} {
			t.Fatalf("%s: got %+v, want %v", m.Endpoint, m, w)
		}
	}
	for _, bad := range []string{"a\t1", "a1\n", "a\tx\n", "\n\t1\n"} {
		if _, err := matchRuns(now, []any{bad}); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// FuzzMatchRuns feeds arbitrary block values (as Redis might return after corruption or a foreign writer)
// to the match-reply parser: it must return a result or an error, never panic, and never report more
// blocks for an endpoint than there are values.
func FuzzMatchRuns(f *testing.F) {
	f.Add("a\t1\nb\t2\n", "a\t1\n", int64(0))
	f.Add("a\t4000001\n", "a\t6\n", int64(1000000))
	f.Add("", "x", int64(-1))
	f.Add("a\t99999999999999999999\n", "\t\n", int64(5))
	f.Fuzz(func(t *testing.T, v0, v1 string, now int64) {
		got, err := matchRuns(now, []any{v0, v1, v0})
		if err != nil {
			return
		}
		for _, m := range got {
			if m.GPUBlocks < 0 || m.CPUBlocks < 0 || m.GPUBlocks+m.CPUBlocks > 3 {
				t.Fatalf("impossible run %+v", m)
			}
		}
	})
}
