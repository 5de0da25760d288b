package route

import (
	"math"
	"testing"

	"github.com/kvgate/kvgate/gateway/internal/openai"
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
		p := &Plan{IDs: make([]uint32, 10), Request: Request{MaxTokens: tc.maxTokens, N: tc.n}}
		if c := r.Cost(p); c.Requests != max(tc.n, 1) || c.Tokens != tc.want { // each choice runs as its own sequence
			t.Errorf("max_tokens %d n %d: cost %+v, want %d tokens", tc.maxTokens, tc.n, c, tc.want)
		}
	}
}

// Issue 10 (5): a completions batch reserves one request per prompt × max(n, best_of) and every prompt's
// tokens (before the fix: 1 request, costed by the first prompt).
func TestCostOfBatches(t *testing.T) {
	r := &Router{o: Options{DefaultOutputTokens: 16}}
	for _, tc := range []struct {
		name                 string
		req                  Request
		batchTokens          int64
		wantReqs, wantTokens int64
	}{
		{"200 prompts", Request{MaxTokens: 4, N: 1, Prompts: 200}, 199 * 10, 200, 200*10 + 200*4},
		{"3 prompts n=2", Request{MaxTokens: 4, N: 2, Prompts: 3}, 20, 6, 30 + 6*4},
		{"best_of 5 n=2", Request{MaxTokens: 4, N: 2, BestOf: 5, Prompts: 1}, 0, 5, 10 + 5*4},
		{"best_of 1 n=3", Request{MaxTokens: -1, N: 3, BestOf: 1, Prompts: 1}, 0, 3, 10 + 3*16},
	} {
		p := &Plan{IDs: make([]uint32, 10), BatchTokens: tc.batchTokens, Request: tc.req}
		if c := r.Cost(p); c.Requests != tc.wantReqs || c.Tokens != tc.wantTokens {
			t.Errorf("%s: cost %+v, want %d requests %d tokens", tc.name, c, tc.wantReqs, tc.wantTokens)
		}
	}
}
