package harness

import "testing"

func TestOracleCachedTokens(t *testing.T) {
	p := [][]uint32{{1, 2, 3, 4, 5}, {1, 2, 3, 9, 9}, {1, 2, 3, 4, 7}, {8}, {}}
	// Second: 3 common with the first → 2 (one block of 2); third: 4 common with the first → 4.
	if got := OracleCachedTokens(p, 2); got != 2+4 {
		t.Fatalf("oracle %d, want 6", got)
	}
	if got := OracleCachedTokens(nil, 16); got != 0 {
		t.Fatalf("oracle of nothing %d", got)
	}
}
