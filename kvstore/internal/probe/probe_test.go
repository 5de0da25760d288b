package probe

import "testing"

// Stays against a direct definition: walk forward from i+1 to j (wrapping in a table of n slots) and
// see whether home is passed.
func TestStaysMatchesWalk(t *testing.T) {
	const n = 8
	for i := uint64(0); i < n; i++ {
		for j := uint64(0); j < n; j++ {
			if i == j {
				continue
			}
			for home := uint64(0); home < n; home++ {
				want := false
				for k := (i + 1) % n; ; k = (k + 1) % n {
					if k == home {
						want = true
					}
					if k == j {
						break
					}
				}
				if got := Stays(i, home, j); got != want {
					t.Fatalf("Stays(%d, %d, %d) = %v, want %v", i, home, j, got, want)
				}
			}
		}
	}
}
