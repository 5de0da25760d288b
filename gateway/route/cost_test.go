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
		maxTokens, want int64
	}{
		{-1, 10 + 16}, {0, 10}, {5, 15}, {math.MaxInt64 - 10, math.MaxInt64}, {math.MaxInt64, math.MaxInt64},
	} {
		p := &Plan{IDs: make([]uint32, 10), Request: &openai.Request{MaxTokens: tc.maxTokens}}
		if c := r.Cost(p); c.Requests != 1 || c.Tokens != tc.want {
			t.Errorf("max_tokens %d: cost %+v, want %d tokens", tc.maxTokens, c, tc.want)
		}
	}
}
