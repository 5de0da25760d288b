package sim

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// TestDataParallelLoadPerEngine: with two data-parallel ranks and --max-num-seqs 1, three long requests
// (prompts of several whole blocks, so the running one holds KV blocks from its first step)
// pinned to rank 1 show as rank 1's series (engine="1": 1 running, 2 waiting) while rank 0's (engine="0")
// stay at 0, as vLLM labels each engine core; the ranks' series exist from the start.
func TestDataParallelLoadPerEngine(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.DataParallelSize, c.MaxNumSeqs, c.TimeScale = 2, 1, 1 })
	if v := metric(t, e, `vllm:num_requests_waiting{engine="1",model_name="m"}`); v != 0 {
		t.Fatalf("rank 1 waiting at start: %v (want the series at 0)", v)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for i := range 3 {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+e.HTTPAddr()+"/v1/completions",
				strings.NewReader(fmt.Sprintf(`{"model":"m","max_tokens":4000,"prompt":"%d %s"}`, i, strings.Repeat("busy ", 64))))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(DataParallelRankHeader, "1")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	waitFor(t, "rank 1's queue in its own series", func() bool {
		return metric(t, e, `vllm:num_requests_running{engine="1",model_name="m"}`) == 1 &&
			metric(t, e, `vllm:num_requests_waiting{engine="1",model_name="m"}`) == 2
	})
	for _, s := range []string{`vllm:num_requests_running{engine="0",model_name="m"}`, `vllm:num_requests_waiting{engine="0",model_name="m"}`,
		`vllm:kv_cache_usage_perc{engine="0",model_name="m"}`} {
		if v := metric(t, e, s); v != 0 {
			t.Fatalf("%s = %v, want 0 (rank 0 is idle)", s, v)
		}
	}
	// The running request's blocks count once its prefill has computed tokens (a step after admission).
	waitFor(t, "rank 1's KV-cache usage above 0", func() bool {
		return metric(t, e, `vllm:kv_cache_usage_perc{engine="1",model_name="m"}`) > 0
	})
}
