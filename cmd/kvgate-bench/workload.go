package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/kvgate/kvgate/cmd/kvgate-bench/harness"
)

func numCPU() int { return runtime.NumCPU() }

var vocab = strings.Fields(`alpha river cobalt granite lantern meadow quartz harbor velvet summit ember willow
falcon orchid canyon pepper thunder marble saffron glacier tundra copper nectar prairie cedar lagoon zephyr
basalt juniper mosaic beacon sierra indigo trellis monsoon pylon quill rampart sonnet anchor bramble cipher
dune ferry gadget hollow islet jasper kettle ledger mantle nimbus oyster parcel quarry rivet spindle tassel`)

// text returns n pseudo-random words from r.
func text(r *rand.Rand, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocab[r.IntN(len(vocab))])
		if r.IntN(7) == 0 {
			fmt.Fprintf(&b, " %d", r.IntN(10000))
		}
	}
	return b.String()
}

// chatBody is an OpenAI chat request with a system prompt (omitted when empty) and one user message.
func chatBody(model, system, user string, maxTokens int) []byte {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var msgs []msg
	if system != "" {
		msgs = append(msgs, msg{"system", system})
	}
	msgs = append(msgs, msg{"user", user})
	b, _ := json.Marshal(map[string]any{"model": model, "messages": msgs, "max_tokens": maxTokens})
	return b
}

// withTokenIDs adds prompt_token_ids to a chat body: what the gateway itself sends an enginesim endpoint.
func withTokenIDs(body []byte, ids []uint32) []byte {
	var m map[string]any
	_ = json.Unmarshal(body, &m)
	m["prompt_token_ids"] = ids
	b, _ := json.Marshal(m)
	return b
}

// wordsFor returns a word count that makes text(r, count) about target tokens long (±2%), measured with the
// engine's tokenizer (as a user message, less the chat template's own tokens).
func wordsFor(ctx context.Context, e *harness.Engine, model string, target int) (int, error) {
	count := func(words int) (int, error) {
		r := rand.New(rand.NewPCG(99, uint64(words)))
		full, err := e.Tokenize(ctx, chatBody(model, "", text(r, words), 1))
		if err != nil {
			return 0, err
		}
		empty, err := e.Tokenize(ctx, chatBody(model, "", "", 1))
		if err != nil {
			return 0, err
		}
		return len(full) - len(empty), nil
	}
	words := target * 2 / 3
	for range 4 {
		got, err := count(words)
		if err != nil {
			return 0, err
		}
		if got >= target*98/100 && got <= target*102/100 {
			break
		}
		words = max(1, words*target/max(got, 1))
	}
	return words, nil
}

// client is a keep-alive HTTP client for one target.
func newClient() *http.Client {
	return &http.Client{Timeout: 120 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64,
		IdleConnTimeout: time.Minute, DisableCompression: true}}
}

// answer is what one chat call returned.
type answer struct {
	Latency      time.Duration
	Endpoint     string
	PromptTokens int64
	CachedTokens int64
}

// post sends a chat body to base+/v1/chat/completions and reads the whole answer.
func post(ctx context.Context, c *http.Client, base string, body []byte) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return answer{}, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	lat := time.Since(start)
	if err != nil {
		return answer{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return answer{}, fmt.Errorf("%s: status %d: %s", base, resp.StatusCode, b)
	}
	var out struct {
		Usage struct {
			PromptTokens int64 `json:"prompt_tokens"`
			Details      *struct {
				CachedTokens int64 `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return answer{}, fmt.Errorf("%s: %w", base, err)
	}
	a := answer{Latency: lat, Endpoint: resp.Header.Get("x-kvgate-endpoint"), PromptTokens: out.Usage.PromptTokens}
	if out.Usage.Details != nil {
		a.CachedTokens = out.Usage.Details.CachedTokens
	}
	return a, nil
}

// quantile returns the q-quantile (0..1) of ds by nearest rank; ds is sorted in place.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(q*float64(len(ds))+0.5) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

// us formats a duration in microseconds.
func us(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d.Nanoseconds())/1e3) }
