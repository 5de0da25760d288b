package sim

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func ttftHeader(t *testing.T, r httpResult) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(r.header.Get("X-Enginesim-TTFT-Seconds"), 64)
	if err != nil {
		t.Fatalf("TTFT header: %v", err)
	}
	return v
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// With the default timing (7 ms step, 60 µs per sequence, 50 µs per uncached prompt token), a cold
// 2048-token prompt takes 7.06 ms + 2048 × 50 µs = 109.46 ms to its first token; a warm one hits
// (2048-1)/16 = 127 blocks = 2032 tokens and computes 16: 7.06 ms + 0.8 ms = 7.86 ms.
func TestRepeatedPrefixCachedTokensAndTTFT(t *testing.T) {
	e := startEngine(t, nil)
	body := map[string]any{"model": "m", "prompt": seqTokens(2048, 1000), "max_tokens": 4}
	cold := post(t, e, "/v1/completions", body)
	warm := post(t, e, "/v1/completions", body)
	for _, r := range []httpResult{cold, warm} {
		if r.status != http.StatusOK {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	}
	cu, wu := decode[completionJSON](t, cold.body).Usage, decode[completionJSON](t, warm.body).Usage
	if cu.PromptTokensDetails.CachedTokens != 0 || wu.PromptTokensDetails.CachedTokens != 2032 {
		t.Fatalf("cached_tokens cold %d warm %d, want 0 and 2032", cu.PromptTokensDetails.CachedTokens, wu.PromptTokensDetails.CachedTokens)
	}
	if cu.PromptTokens != 2048 || cu.CompletionTokens != 4 || cu.TotalTokens != 2052 {
		t.Fatalf("usage = %+v", cu)
	}
	if c, w := ttftHeader(t, cold), ttftHeader(t, warm); !near(c, 0.10946) || !near(w, 0.00786) {
		t.Fatalf("TTFT cold %v warm %v, want 0.10946 and 0.00786", c, w)
	}
	if v := metric(t, e, `vllm:prefix_cache_queries_total{model_name="m"}`); v != 4096 {
		t.Fatalf("prefix_cache_queries_total = %v", v)
	}
	if v := metric(t, e, `vllm:prefix_cache_hits_total{model_name="m"}`); v != 2032 {
		t.Fatalf("prefix_cache_hits_total = %v", v)
	}
	if v := metric(t, e, `vllm:time_to_first_token_seconds_sum{model_name="m"}`); !near(v, 0.10946+0.00786) {
		t.Fatalf("TTFT sum = %v", v)
	}
	// Both answers are the same deterministic text.
	if a, b := decode[completionJSON](t, cold.body).Choices[0].Text, decode[completionJSON](t, warm.body).Choices[0].Text; a != b || a == "" {
		t.Fatalf("outputs differ or empty: %q vs %q", a, b)
	}
}

// A prompt evicted to the CPU tier hits there: cached_tokens counts it, the reload costs 5 µs per token,
// so TTFT lands between a GPU hit and a miss.
func TestCPUTierHitPricedBetweenGPUHitAndMiss(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.NumGPUBlocks = 130; c.NumCPUBlocks = 1000 })
	a := map[string]any{"model": "m", "prompt": seqTokens(2048, 1000), "max_tokens": 4}
	b := map[string]any{"model": "m", "prompt": seqTokens(2048, 90000), "max_tokens": 4}
	miss := post(t, e, "/v1/completions", a)
	post(t, e, "/v1/completions", b) // evicts a's blocks 1..127 to the CPU tier; block 0 was freed last
	cpuHit := post(t, e, "/v1/completions", a)
	gpuHit := post(t, e, "/v1/completions", a)
	if u := decode[completionJSON](t, cpuHit.body).Usage; u.PromptTokensDetails.CachedTokens != 2032 {
		t.Fatalf("CPU-tier hit cached_tokens = %d, want 2032", u.PromptTokensDetails.CachedTokens)
	}
	if h := cpuHit.header.Get("X-Enginesim-CPU-Cached-Tokens"); h != "2016" {
		t.Fatalf("CPU cached tokens header %q, want 2016", h)
	}
	m, c, g := ttftHeader(t, miss), ttftHeader(t, cpuHit), ttftHeader(t, gpuHit)
	// 1 block on GPU + 126 on CPU: 7.86 ms + 2016 × 5 µs = 17.94 ms.
	if !near(c, 0.01794) || !near(g, 0.00786) || !near(m, 0.10946) {
		t.Fatalf("TTFT miss %v CPU hit %v GPU hit %v", m, c, g)
	}
	if !(g < c && c < m) {
		t.Fatalf("CPU hit not priced between: %v %v %v", g, c, m)
	}
	if v := metric(t, e, `vllm:external_prefix_cache_hits_total{model_name="m"}`); v != 2016 {
		t.Fatalf("external hits = %v, want 2016", v)
	}
	if v := metric(t, e, `vllm:kv_offload_total_bytes{model_name="m",transfer_type="CPU_to_GPU"}`); v != 2016*131072 {
		t.Fatalf("CPU_to_GPU bytes = %v", v)
	}
	if v := metric(t, e, `vllm:kv_offload_total_bytes{model_name="m",transfer_type="GPU_to_CPU"}`); v < 127*16*131072 {
		t.Fatalf("GPU_to_CPU bytes = %v", v)
	}
}

type chunkJSON struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int               `json:"index"`
		Delta        map[string]string `json:"delta"`
		Text         *string           `json:"text"`
		FinishReason *string           `json:"finish_reason"`
	} `json:"choices"`
	Usage *usageJSON `json:"usage"`
}

func TestChatSSEFraming(t *testing.T) {
	e := startEngine(t, nil)
	base := map[string]any{"model": "m", "prompt_token_ids": seqTokens(40, 5), "max_tokens": 3}
	whole := post(t, e, "/v1/chat/completions", base)
	wantText := decode[completionJSON](t, whole.body).Choices[0].Message.Content
	for _, includeUsage := range []bool{false, true} {
		req := map[string]any{"stream": true, "stream_options": map[string]bool{"include_usage": includeUsage}}
		for k, v := range base {
			req[k] = v
		}
		r := post(t, e, "/v1/chat/completions", req)
		if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
			t.Fatalf("content type %q", ct)
		}
		ev := sseEvents(t, r.body)
		want := 1 + 3 + 1 // role, 3 tokens, [DONE]
		if includeUsage {
			want++
		}
		if len(ev) != want || ev[len(ev)-1] != "[DONE]" {
			t.Fatalf("include_usage=%v: %d events %q", includeUsage, len(ev), ev)
		}
		// The role delta is exactly vLLM's.
		if !strings.Contains(ev[0], `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`) {
			t.Fatalf("role chunk %s", ev[0])
		}
		var text strings.Builder
		for i := 1; i <= 3; i++ {
			c := decode[chunkJSON](t, []byte(ev[i]))
			if c.Object != "chat.completion.chunk" || c.Model != "m" || !strings.HasPrefix(c.ID, "chatcmpl-") || c.Usage != nil {
				t.Fatalf("chunk %d: %s", i, ev[i])
			}
			text.WriteString(c.Choices[0].Delta["content"])
			fr := c.Choices[0].FinishReason
			if (i < 3 && fr != nil) || (i == 3 && (fr == nil || *fr != "length")) {
				t.Fatalf("chunk %d finish_reason: %s", i, ev[i])
			}
			if !strings.Contains(ev[i], `"finish_reason":`) {
				t.Fatalf("chunk %d lacks finish_reason: %s", i, ev[i])
			}
		}
		if text.String() != wantText {
			t.Fatalf("streamed text %q, non-streamed %q", text.String(), wantText)
		}
		if includeUsage {
			u := decode[chunkJSON](t, []byte(ev[4]))
			if len(u.Choices) != 0 || u.Usage == nil || u.Usage.PromptTokens != 40 || u.Usage.CompletionTokens != 3 ||
				u.Usage.PromptTokensDetails.CachedTokens != 32 {
				t.Fatalf("usage chunk %s", ev[4])
			}
		}
	}
}

func TestCompletionsPromptFormsAndSSE(t *testing.T) {
	e := startEngine(t, nil)
	// Byte-level fallback model: "ab" is tokens [97 98].
	for _, tc := range []struct {
		prompt  any
		choices int
		tokens  int
	}{
		{"ab", 1, 2},
		{[]int{97, 98, 99}, 1, 3},
		{[]string{"ab", "abcd"}, 2, 6},
		{[][]int{{1, 2}, {3, 4, 5}}, 2, 5},
		{[]any{"ab", []int{1, 2, 3}}, 2, 5},
	} {
		r := post(t, e, "/v1/completions", map[string]any{"model": "m", "prompt": tc.prompt, "max_tokens": 2})
		if r.status != 200 {
			t.Fatalf("prompt %v: %d %s", tc.prompt, r.status, r.body)
		}
		c := decode[completionJSON](t, r.body)
		if len(c.Choices) != tc.choices || c.Usage.PromptTokens != tc.tokens || c.Usage.CompletionTokens != 2*tc.choices {
			t.Fatalf("prompt %v: %s", tc.prompt, r.body)
		}
	}
	r := post(t, e, "/v1/completions", map[string]any{"model": "m", "prompt": []string{"ab", "cd"}, "max_tokens": 2, "stream": true,
		"stream_options": map[string]bool{"include_usage": true}})
	ev := sseEvents(t, r.body)
	if len(ev) != 6 || ev[5] != "[DONE]" {
		t.Fatalf("events %q", ev)
	}
	seen := map[int]int{}
	for _, s := range ev[:4] {
		c := decode[chunkJSON](t, []byte(s))
		if c.Object != "text_completion" || c.Choices[0].Text == nil || !strings.Contains(s, `"stop_reason":null`) {
			t.Fatalf("chunk %s", s)
		}
		seen[c.Choices[0].Index]++
	}
	if seen[0] != 2 || seen[1] != 2 {
		t.Fatalf("chunks per index %v", seen)
	}
	if u := decode[chunkJSON](t, []byte(ev[4])); u.Usage == nil || u.Usage.PromptTokens != 4 || u.Usage.CompletionTokens != 4 {
		t.Fatalf("usage chunk %s", ev[4])
	}
}

func TestErrorsInVLLMShape(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.MaxModelLen = 100 })
	r := post(t, e, "/v1/chat/completions", map[string]any{"model": "nope", "messages": []any{}})
	if r.status != 404 || string(r.body) != `{"error":{"message":"The model `+"`nope`"+` does not exist.","type":"NotFoundError","param":null,"code":404}}` {
		t.Fatalf("404: %d %s", r.status, r.body)
	}
	for name, body := range map[string]any{
		"bad json":        `{"model":`,
		"empty prompt":    map[string]any{"model": "m", "prompt": []int{}},
		"negative id":     map[string]any{"model": "m", "prompt": []int{-1}},
		"object prompt":   map[string]any{"model": "m", "prompt": map[string]int{"a": 1}},
		"no prompt":       map[string]any{"model": "m"},
		"max_tokens 0":    map[string]any{"model": "m", "prompt": "x", "max_tokens": 0},
		"n 2":             map[string]any{"model": "m", "prompt": "x", "n": 2},
		"too long":        map[string]any{"model": "m", "prompt": seqTokens(90, 1), "max_tokens": 20},
		"empty sub":       map[string]any{"model": "m", "prompt": []any{"a", []int{}}},
		"unknown lora":    map[string]any{"model": "m", "prompt": "x", "lora": "zz"},
		"chat no message": map[string]any{"model": "m", "messages": []any{}},
	} {
		path := "/v1/completions"
		if name == "chat no message" {
			path = "/v1/chat/completions"
		}
		r := post(t, e, path, body)
		want := 400
		if name == "unknown lora" {
			want = 200 // no LoRA modules listed: any adapter name is accepted
		}
		if r.status != want {
			t.Errorf("%s: status %d %s", name, r.status, r.body)
			continue
		}
		if want == 400 {
			eb := decode[errorBody](t, r.body)
			if eb.Error.Code != 400 || eb.Error.Type != "BadRequestError" || eb.Error.Message == "" {
				t.Errorf("%s: %s", name, r.body)
			}
		}
	}
}

func TestLoRAModelNames(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.LoRAModules = []string{"sql"} })
	for model, want := range map[string]int{"m": 200, "sql": 200, "m:sql": 200, "m:other": 404, "other": 404} {
		r := post(t, e, "/v1/completions", map[string]any{"model": model, "prompt": "hi", "max_tokens": 1})
		if r.status != want {
			t.Errorf("model %q: %d %s", model, r.status, r.body)
		}
		if want == 200 && decode[completionJSON](t, r.body).Model != model {
			t.Errorf("model %q answered as %s", model, r.body)
		}
	}
	var models struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	models = decode[struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}](t, get(t, e, "/v1/models").body)
	if len(models.Data) != 2 || models.Data[0].ID != "m" || models.Data[1].ID != "sql" || *models.Data[1].Parent != "m" {
		t.Fatalf("models %+v", models)
	}
}

// MaxNumSeqs caps the running batch; the peak gauge proves it and the rest waited.
func TestMaxNumSeqsCapsConcurrency(t *testing.T) {
	e := startEngine(t, func(c *Config) {
		c.MaxNumSeqs = 2
		c.StepOverhead = time.Millisecond
		c.TimeScale = 1
	})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			r := post(t, e, "/v1/completions", map[string]any{"model": "m", "prompt": seqTokens(20, uint32(i*100)), "max_tokens": 40})
			if r.status != 200 {
				t.Errorf("status %d", r.status)
			}
		})
	}
	wg.Wait()
	if v := metric(t, e, `enginesim:peak_running_requests{model_name="m"}`); v != 2 {
		t.Fatalf("peak running = %v, want 2", v)
	}
	if v := metric(t, e, `enginesim:peak_inflight_requests{model_name="m"}`); v < 3 || v > 8 {
		t.Fatalf("peak in flight = %v, want 3..8 (more than the 2 running)", v)
	}
	if v := metric(t, e, `vllm:request_queue_time_seconds_sum{model_name="m"}`); v <= 0 {
		t.Fatalf("no request waited (queue time sum %v)", v)
	}
	if s := e.Stats(); s.Running != 0 || s.Waiting != 0 || s.KVCacheUsage != 0 {
		t.Fatalf("stats after drain %+v", s)
	}
}

// A client that goes away stops its generation and frees its blocks (streaming and not).
func TestClientDisconnectCancels(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.StepOverhead = time.Millisecond; c.TimeScale = 1 })
	for i, stream := range []bool{true, false} {
		ctx, cancel := context.WithCancel(context.Background())
		body, _ := json.Marshal(map[string]any{"model": "m", "prompt": seqTokens(64, 1), "max_tokens": 50000, "stream": stream})
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+e.HTTPAddr()+"/v1/completions", strings.NewReader(string(body)))
		done := make(chan error, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				buf := make([]byte, 64)
				_, err = resp.Body.Read(buf) // first chunk
				if stream && err == nil {
					cancel()
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			done <- err
		}()
		if !stream { // a streamed request is cancelled after its first chunk: it ran (Running may be 0 again already)
			waitFor(t, "request running", func() bool { return e.Stats().Running == 1 })
			time.Sleep(20 * time.Millisecond)
			cancel()
		}
		<-done
		waitFor(t, "cancellation", func() bool {
			return metric(t, e, `enginesim:requests_cancelled_total{model_name="m"}`) == float64(i+1) && e.Stats().Running == 0
		})
		if u := e.Stats().KVCacheUsage; u != 0 {
			t.Fatalf("KV usage after cancel = %v", u)
		}
	}
	if v := metric(t, e, `vllm:generation_tokens_total{model_name="m"}`); v >= 100000 {
		t.Fatalf("generation did not stop: %v tokens", v)
	}
}

func setFaults(t *testing.T, e *Engine, f string) {
	t.Helper()
	if r := post(t, e, "/sim/faults", f); r.status != 200 {
		t.Fatalf("set faults: %d %s", r.status, r.body)
	}
}

func TestFaultFailStatus(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.Faults = Faults{FailStatus: 500, FailCount: 2} })
	body := map[string]any{"model": "m", "prompt": "hi", "max_tokens": 1}
	for i, want := range []int{500, 500, 200} {
		if r := post(t, e, "/v1/completions", body); r.status != want {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	setFaults(t, e, `{"fail_status":503}`)
	r := post(t, e, "/v1/chat/completions", map[string]any{"model": "m", "prompt_token_ids": []int{1}, "max_tokens": 1})
	if r.status != 503 || decode[errorBody](t, r.body).Error.Type != "ServiceUnavailableError" {
		t.Fatalf("503: %d %s", r.status, r.body)
	}
	if r := post(t, e, "/v1/completions", body); r.status != 200 {
		t.Fatalf("after the armed fault: %d", r.status)
	}
	if r := post(t, e, "/sim/faults", `{"fail_status":200}`); r.status != 400 {
		t.Fatalf("bad fault accepted: %d", r.status)
	}
	if r := post(t, e, "/sim/faults", `{"bogus":1}`); r.status != 400 {
		t.Fatalf("unknown fault field accepted: %d", r.status)
	}
}

func TestFaultCloseMidStream(t *testing.T) {
	e := startEngine(t, nil)
	setFaults(t, e, `{"close_after_chunks":2}`)
	body := `{"model":"m","prompt":"hi","max_tokens":5,"stream":true}`
	resp, err := http.Post("http://"+e.HTTPAddr()+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read error %v, want unexpected EOF (body %q)", err, got)
	}
	if n := strings.Count(string(got), "data: "); n != 2 || strings.Contains(string(got), "[DONE]") {
		t.Fatalf("got %d chunks: %q", n, got)
	}
	// Disarmed after one use.
	r := post(t, e, "/v1/completions", body)
	if ev := sseEvents(t, r.body); ev[len(ev)-1] != "[DONE]" {
		t.Fatalf("second stream %q", ev)
	}
}

func TestFaultStallBeforeHeaders(t *testing.T) {
	e := startEngine(t, nil)
	setFaults(t, e, `{"stall_before_headers":"30s"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+e.HTTPAddr()+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi"}`))
	if _, err := http.DefaultClient.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stalled request: %v, want deadline exceeded before headers", err)
	}
	if f := e.Faults(); f.StallBeforeHeaders != 0 {
		t.Fatalf("stall still armed: %+v", f)
	}
	if r := post(t, e, "/v1/completions", `{"model":"m","prompt":"hi"}`); r.status != 200 {
		t.Fatalf("after stall: %d", r.status)
	}
}

func TestEnginesHaveOwnMetrics(t *testing.T) {
	a := startEngine(t, nil)
	b := startEngine(t, func(c *Config) { c.ServedModelNames = []string{"other"} })
	post(t, a, "/v1/completions", map[string]any{"model": "m", "prompt": "hello", "max_tokens": 3})
	if v := metric(t, a, `vllm:generation_tokens_total{model_name="m"}`); v != 3 {
		t.Fatalf("engine a generated %v", v)
	}
	if v := metric(t, b, `vllm:generation_tokens_total{model_name="other"}`); v != 0 {
		t.Fatalf("engine b generated %v", v)
	}
	if r := get(t, a, "/health"); r.status != 200 {
		t.Fatalf("health %d", r.status)
	}
}

func TestTokenizeAndResetEndpoints(t *testing.T) {
	e := startEngine(t, nil)
	r := post(t, e, "/tokenize", `{"model":"m","prompt":"abc"}`)
	if string(r.body) != `{"count":3,"max_model_len":131072,"tokens":[97,98,99],"token_strs":null}` {
		t.Fatalf("tokenize: %s", r.body)
	}
	body := map[string]any{"model": "m", "prompt": seqTokens(40, 1), "max_tokens": 1}
	post(t, e, "/v1/completions", body)
	if r := post(t, e, "/reset_prefix_cache", ""); r.status != 200 {
		t.Fatalf("reset %d", r.status)
	}
	if u := decode[completionJSON](t, post(t, e, "/v1/completions", body).body).Usage; u.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("cached after reset = %d", u.PromptTokensDetails.CachedTokens)
	}
}

func TestStartRejectsBadConfig(t *testing.T) {
	for name, mutate := range map[string]func(*Config){
		"no model":   func(c *Config) { c.Model = "" },
		"block size": func(c *Config) { c.BlockSize = 0 },
		"encoding":   func(c *Config) { c.EventsEncoding = "xml" },
		"name colon": func(c *Config) { c.ServedModelNames = []string{"a:b"} },
		"fault":      func(c *Config) { c.Faults.FailStatus = 302 },
		"time scale": func(c *Config) { c.TimeScale = -1 },
	} {
		cfg := DefaultConfig()
		cfg.Model = "x"
		cfg.Port = 0
		mutate(&cfg)
		if _, err := Start(context.Background(), cfg); err == nil {
			t.Errorf("%s: started", name)
		} else if _, ok := errors.AsType[*ConfigError](err); !ok {
			t.Errorf("%s: error %T %v, want *ConfigError", name, err, err)
		}
	}
}

// kv_cache_usage_perc counts the blocks a running request has written (prompt plus tokens so far), not
// the output blocks reserved for it.
func TestKVCacheUsageDuringRequest(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.NumGPUBlocks = 100; c.StepOverhead = 10 * time.Millisecond; c.TimeScale = 1 })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := `{"model":"m","prompt":` + mustJSON(seqTokens(160, 1)) + `,"max_tokens":1000,"stream":true}`
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+e.HTTPAddr()+"/v1/completions", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 64)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	// 160 prompt tokens = 10 blocks, plus at most a few blocks of output so far; 73 blocks are reserved.
	// The gauge is set when the step that emitted the first token is booked, which may be just after the
	// token reached us: wait for it to leave 0.
	u := metric(t, e, `vllm:kv_cache_usage_perc{engine="0",model_name="m"}`)
	for deadline := time.Now().Add(2 * time.Second); u == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
		u = metric(t, e, `vllm:kv_cache_usage_perc{engine="0",model_name="m"}`)
	}
	if u < 0.10 || u > 0.20 {
		t.Fatalf("usage %v, want 0.10..0.20", u)
	}
	if s := e.Stats(); s.Running != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// Blocks filled by generated tokens are cached too (as vLLM caches them), so a follow-up turn that re-sends
// the answer hits them: 20 prompt + 30 output tokens leave 49 computed tokens = 3 full blocks.
func TestOutputBlocksAreCached(t *testing.T) {
	e := startEngine(t, nil)
	prompt := seqTokens(20, 300)
	first := decode[completionJSON](t, post(t, e, "/v1/completions", map[string]any{"model": "m", "prompt": prompt, "max_tokens": 30}).body)
	answer := byteModel{}.EncodeCompletion(first.Choices[0].Text) // the byte model: one token per byte
	if len(answer) != 30 {
		t.Fatalf("answer %q has %d tokens", first.Choices[0].Text, len(answer))
	}
	next := append(append(append([]uint32{}, prompt...), answer...), seqTokens(10, 7)...)
	second := decode[completionJSON](t, post(t, e, "/v1/completions", map[string]any{"model": "m", "prompt": next, "max_tokens": 1}).body)
	if c := second.Usage.PromptTokensDetails.CachedTokens; c != 48 {
		t.Fatalf("follow-up cached_tokens = %d, want 48", c)
	}
	if g := e.Stats().GPUCachedBlocks; g != 3 {
		t.Fatalf("GPU cached blocks = %d, want 3", g)
	}
}

// The step model: decode ITL grows with the batch, prefill is paid per uncached token, CPU-tier hits per
// reloaded token, and the token budget chunks long prefills.
func TestStepDurationModel(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.MaxNumBatchedTokens = 1024 })
	e.mu.Lock()
	defer e.mu.Unlock()
	decoding := func(n int) []*request {
		var rs []*request
		for range n {
			rs = append(rs, &request{prompt: seqTokens(10, 1), computed: 10})
		}
		return rs
	}
	for _, tc := range []struct {
		name    string
		running []*request
		want    time.Duration
		work    int
	}{
		{"1 decode", decoding(1), 7*time.Millisecond + 60*time.Microsecond, 1},
		{"8 decodes", decoding(8), 7*time.Millisecond + 8*60*time.Microsecond, 8},
		{"64 decodes", decoding(64), 7*time.Millisecond + 64*60*time.Microsecond, 64},
		{"prefill chunk + 2 decodes", append(decoding(2), &request{prompt: seqTokens(4000, 1)}),
			7*time.Millisecond + 3*60*time.Microsecond + 1022*50*time.Microsecond, 3},
		{"CPU reload", []*request{{prompt: seqTokens(100, 1), computed: 96, reloadTokens: 80}},
			7*time.Millisecond + 60*time.Microsecond + 4*50*time.Microsecond + 80*5*time.Microsecond, 1},
	} {
		e.running = tc.running
		work, dur := e.plan()
		if dur != tc.want || len(work) != tc.work {
			t.Errorf("%s: %v with %d items, want %v with %d", tc.name, dur, len(work), tc.want, tc.work)
		}
	}
	e.running = nil
}

// A prompt longer than the step budget is prefilled in chunks: 2048 tokens at 1024 per step take two
// steps of 7.06 ms + 1024 × 50 µs each.
func TestChunkedPrefillTTFT(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.MaxNumBatchedTokens = 1024 })
	r := post(t, e, "/v1/completions", map[string]any{"model": "m", "prompt": seqTokens(2048, 1), "max_tokens": 2})
	if got := ttftHeader(t, r); !near(got, 2*(0.00706+1024*0.00005)) {
		t.Fatalf("TTFT %v, want %v", got, 2*(0.00706+1024*0.00005))
	}
}

func TestPrefixCachingDisabled(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.EnablePrefixCaching = false })
	body := map[string]any{"model": "m", "prompt": seqTokens(100, 1), "max_tokens": 2}
	post(t, e, "/v1/completions", body)
	if c := decode[completionJSON](t, post(t, e, "/v1/completions", body).body).Usage.PromptTokensDetails.CachedTokens; c != 0 {
		t.Fatalf("cached_tokens %d with prefix caching off", c)
	}
	if g := e.Stats().GPUCachedBlocks; g != 0 {
		t.Fatalf("%d blocks cached with prefix caching off", g)
	}
}

// TestMaxTokensOverflowRejected: a max_tokens near MaxInt64 once overflowed prompt+max_tokens past the
// max-model-len check and panicked the engine (makeslice in the KV cache). It must be a 400 in vLLM's shape,
// and the engine must keep serving; integral floats are accepted as vLLM's pydantic int accepts them.
func TestMaxTokensOverflowRejected(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.MaxModelLen = 1000 })
	chat := func(field, value string) httpResult {
		return post(t, e, "/v1/chat/completions",
			`{"model":"m","messages":[{"role":"user","content":"x"}],"`+field+`":`+value+`}`)
	}
	for _, field := range []string{"max_tokens", "max_completion_tokens"} {
		for _, v := range []string{"9223372036854775807", "9223372036854775808", "1e30", "4611686018427387904"} {
			r := chat(field, v)
			if r.status != 400 {
				t.Fatalf("%s=%s: status %d %s", field, v, r.status, r.body)
			}
			eb := decode[errorBody](t, r.body)
			if eb.Error.Type != "BadRequestError" || !strings.Contains(eb.Error.Message, "maximum context length is 1000 tokens") {
				t.Errorf("%s=%s: %s", field, v, r.body)
			}
		}
		for _, v := range []string{"2.5", `"2"`, "-1", "-9223372036854775808", "0"} {
			if r := chat(field, v); r.status != 400 {
				t.Errorf("%s=%s: status %d %s", field, v, r.status, r.body)
			}
		}
	}
	r := post(t, e, "/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":9223372036854775807}`)
	if eb := decode[errorBody](t, r.body); r.status != 400 ||
		eb.Error.Message != "This model's maximum context length is 1000 tokens. However, you requested 9223372036854775810 tokens (3 in the messages, 9223372036854775807 in the completion). Please reduce the length of the messages or completion." {
		t.Fatalf("completions: %d %s", r.status, r.body)
	}
	// The engine is alive, and 2.0 means 2.
	for _, field := range []string{"max_tokens", "max_completion_tokens"} {
		r := chat(field, "2.0")
		if r.status != 200 {
			t.Fatalf("%s=2.0: %d %s", field, r.status, r.body)
		}
		if c := decode[completionJSON](t, r.body); c.Usage == nil || c.Usage.CompletionTokens != 2 {
			t.Fatalf("%s=2.0: %s", field, r.body)
		}
	}
}
