package route

import (
	"math"
	"testing"

	"github.com/kvgate/kvgate/gateway/openai"
)

// A request's cost saturates instead of wrapping negative (a negative cost is an invalid argument to the
// store).
func TestCostSaturates(t *testing.T) {
	r := &Router{o: Options{DefaultOutputTokens: 16}}
	for _, tc := range []struct {
		maxTokens, n, want int64
	}{
		{-1, 1, 10 + 16}, {0, 1, 10}, {5, 1, 15}, {5, 0, 15}, {math.MaxInt64 - 10, 1, math.MaxInt64},
		{math.MaxInt64, 1, math.MaxInt64},
		// n choices share the prompt and each generate up to max_tokens.
		{5, 3, 10 + 15}, {-1, 4, 10 + 64}, {openai.MaxTokensCap, openai.MaxNCap, 10 + openai.MaxTokensCap*openai.MaxNCap},
		{math.MaxInt64 / 2, 3, math.MaxInt64}, {0, 7, 10},
	} {
		p := &Plan{IDs: make([]uint32, 10), Request: &openai.Request{MaxTokens: tc.maxTokens, N: tc.n}}
		if c := r.Cost(p); c.Requests != 1 || c.Tokens != tc.want {
			t.Errorf("max_tokens %d n %d: cost %+v, want %d tokens", tc.maxTokens, tc.n, c, tc.want)
		}
	}
}
