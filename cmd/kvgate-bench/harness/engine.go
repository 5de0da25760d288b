package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// EngineOptions start one enginesim process. Zero values take the simulator's defaults unless noted.
type EngineOptions struct {
	// Bin is the enginesim executable.
	Bin string
	// ID names the endpoint (config id, log file name).
	ID string
	// LogDir receives <ID>.log.
	LogDir string
	// Model is the model directory (tokenizer.json[.gz] + tokenizer_config.json) or a bare name.
	Model string
	// ServedModelName is the name clients send (default: Model).
	ServedModelName string
	// TimeScale is wall time per simulated second (0.05 runs 20x faster). 0 means the simulator's default 1.
	TimeScale float64
	// NumGPUBlocks caps the GPU KV cache (0: simulator default).
	NumGPUBlocks int
	// MaxNumSeqs caps running requests in the engine (0: simulator default 256).
	MaxNumSeqs int
	// NoEvents turns the KV-event publisher off.
	NoEvents bool
	// Args are extra command-line flags (faults, timing).
	Args []string
}

// Engine is a running enginesim process.
type Engine struct {
	*Proc
	// ID is the endpoint ID the harness gave it.
	ID string
	// HTTPAddr is host:port of its OpenAI API.
	HTTPAddr string
	// EventsAddr is its ZMQ PUB address (tcp://127.0.0.1:port), "" without events.
	EventsAddr string
	// ReplayAddr is its ZMQ ROUTER replay address, "" without events.
	ReplayAddr string
}

var startedLine = regexp.MustCompile(`msg="enginesim started" http=(\S+) events=(\S*) replay=(\S*)`)

// StartEngine starts enginesim on free loopback ports (HTTP port 0; KV events and replay on tcp://*:0) and
// waits for its "enginesim started" log line, which names the bound addresses.
func StartEngine(ctx context.Context, o EngineOptions) (*Engine, error) {
	args := []string{"--model", o.Model, "--host", "127.0.0.1", "--port", "0", "--log-level", "info"}
	if o.ServedModelName != "" {
		args = append(args, "--served-model-name", o.ServedModelName)
	}
	if o.TimeScale > 0 {
		args = append(args, "--time-scale", strconv.FormatFloat(o.TimeScale, 'g', -1, 64))
	}
	if o.NumGPUBlocks > 0 {
		args = append(args, "--num-gpu-blocks-override", strconv.Itoa(o.NumGPUBlocks))
	}
	if o.MaxNumSeqs > 0 {
		args = append(args, "--max-num-seqs", strconv.Itoa(o.MaxNumSeqs))
	}
	if !o.NoEvents {
		args = append(args, "--kv-events-config",
			`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:0","replay_endpoint":"tcp://*:0"}`)
	}
	args = append(args, o.Args...)
	p, err := StartProc("engine "+o.ID, filepath.Join(o.LogDir, o.ID+".log"), o.Bin, args, nil)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var m []string
	_, err = waitLog(ctx, p, func(log string) (string, bool) {
		m = startedLine.FindStringSubmatch(log)
		return "", m != nil
	})
	if err != nil {
		p.Kill()
		return nil, err
	}
	return &Engine{Proc: p, ID: o.ID, HTTPAddr: m[1], EventsAddr: m[2], ReplayAddr: m[3]}, nil
}

// URL is the engine's base URL, http://host:port.
func (e *Engine) URL() string { return "http://" + e.HTTPAddr }

// Metrics reads and parses the engine's /metrics page.
func (e *Engine) Metrics(ctx context.Context) (Samples, error) {
	return ScrapeMetrics(ctx, e.URL()+"/metrics")
}

// Tokenize calls the simulator's POST /tokenize with a chat body (it renders messages with the model's chat
// template, as the engine does for a chat request without prompt_token_ids) and returns the token IDs.
func (e *Engine) Tokenize(ctx context.Context, chatBody []byte) ([]uint32, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/tokenize", strings.NewReader(string(chatBody)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("harness: tokenize: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("harness: tokenize: %d %s", resp.StatusCode, b)
	}
	var out struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("harness: tokenize: %w", err)
	}
	return out.Tokens, nil
}

// Simulator metric names the tests read (vLLM's names where vLLM has one).
const (
	MetricRunning          = "vllm:num_requests_running"
	MetricWaiting          = "vllm:num_requests_waiting"
	MetricPeakRunning      = "enginesim:peak_running_requests"
	MetricCancelled        = "enginesim:requests_cancelled_total"
	MetricRequests         = "enginesim:requests_total"
	MetricGenerationTokens = "vllm:generation_tokens_total"
	MetricPromptTokens     = "vllm:prompt_tokens_total"
	MetricPrefixHits       = "vllm:prefix_cache_hits_total"
)
