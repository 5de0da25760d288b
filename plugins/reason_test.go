package plugins

import (
	"slices"
	"testing"
)

// TestFallbackReasons: every fallback reason, in order, each with its metric label; ReasonNone is not one.
func TestFallbackReasons(t *testing.T) {
	var got []string
	for _, r := range FallbackReasons() {
		got = append(got, r.String())
	}
	want := []string{"trap", "timeout", "guest_error", "invalid_ranking", "too_large", "closed"}
	if !slices.Equal(got, want) {
		t.Fatalf("FallbackReasons labels = %q, want %q", got, want)
	}
}
