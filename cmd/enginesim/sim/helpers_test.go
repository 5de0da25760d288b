package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore/testenv"
)

// qwen3Dir is the repository's Qwen3 demo tokenizer (tokenizer.json.gz + tokenizer_config.json).
const qwen3Dir = "../../../examples/models/qwen3"

// startEngine starts an engine for one test with the byte fallback model, no sleeping (TimeScale 0), and
// mutate applied; it is closed when the test ends.
func startEngine(t testing.TB, mutate func(*Config)) *Engine {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Model = "sim-model"
	cfg.ServedModelNames = []string{"m"}
	cfg.TimeScale = 0
	cfg.Host = "127.0.0.1"
	if mutate != nil {
		mutate(&cfg)
	}
	e, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

type httpResult struct {
	status int
	header http.Header
	body   []byte
}

func post(t testing.TB, e *Engine, path string, body any) httpResult {
	t.Helper()
	var b []byte
	switch v := body.(type) {
	case string:
		b = []byte(v)
	default:
		var err error
		if b, err = json.Marshal(body); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.Post("http://"+e.HTTPAddr()+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading body: %v", path, err)
	}
	return httpResult{status: resp.StatusCode, header: resp.Header, body: out}
}

func get(t testing.TB, e *Engine, path string) httpResult {
	t.Helper()
	resp, err := http.Get("http://" + e.HTTPAddr() + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return httpResult{status: resp.StatusCode, header: resp.Header, body: out}
}

// metric returns the value of the sample whose name and labels text start the line (e.g.
// `vllm:num_requests_running{engine="0",model_name="m"}`), or -1 when absent.
func metric(t testing.TB, e *Engine, sample string) float64 {
	t.Helper()
	r := get(t, e, "/metrics")
	for _, line := range strings.Split(string(r.body), "\n") {
		if strings.HasPrefix(line, sample+" ") {
			v, err := strconv.ParseFloat(strings.TrimSpace(line[len(sample):]), 64)
			if err != nil {
				t.Fatalf("metric %s: %v", sample, err)
			}
			return v
		}
	}
	return -1
}

// waitFor ends t when cond does not hold within 10 s (testenv.Eventually).
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, what, cond)
}

// sseEvents splits an SSE body into its data payloads ("[DONE]" included).
func sseEvents(t testing.TB, body []byte) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		if !strings.HasPrefix(line, "data: ") {
			t.Fatalf("unexpected SSE line %q", line)
		}
		out = append(out, strings.TrimPrefix(line, "data: "))
	}
	if !bytes.HasSuffix(body, []byte("\n\n")) {
		t.Fatalf("SSE body does not end with a blank line: %q", body[max(0, len(body)-40):])
	}
	return out
}

// seqTokens returns n token IDs first, first+1, ...
func seqTokens(n int, first uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = first + uint32(i)
	}
	return out
}

type usageJSON struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type completionJSON struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
		Message      *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage *usageJSON `json:"usage"`
}

func decode[T any](t testing.TB, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v
}
