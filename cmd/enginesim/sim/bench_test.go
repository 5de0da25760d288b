package sim

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
)

// BenchmarkKVCacheWarm2k: the cache work of one warm 2048-token request (prefix match, allocation,
// commit, release), without hashing or HTTP.
func BenchmarkKVCacheWarm2k(b *testing.B) {
	c := newKVCache(16, 28000, 0, true)
	toks, hs := testPrompt(128, 1)
	total := 129
	for b.Loop() {
		run := c.match(hs, (len(toks)-1)/16)
		blocks, ok := c.allocate(run, total, hs, "")
		if !ok {
			b.Fatal("allocate failed")
		}
		c.commit(blocks, hs, toks, "", len(run), len(hs))
		c.release(blocks)
		c.takeEvents()
	}
}

// BenchmarkCompletionHTTP2k: one non-streaming /v1/completions round trip over real HTTP with a
// 2048-token token-ID prompt (warm after the first), 16 output tokens, no simulated sleeping: the
// simulator's own overhead per request (JSON, sha256_cbor hashing of 128 blocks, scheduling, response).
func BenchmarkCompletionHTTP2k(b *testing.B) {
	e := startEngine(b, nil)
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": seqTokens(2048, 1), "max_tokens": 16})
	url := "http://" + e.HTTPAddr() + "/v1/completions"
	for b.Loop() {
		resp, err := http.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatal(resp.Status)
		}
	}
}

// BenchmarkChatStream64: one streaming chat request with 64 SSE token chunks (pre-tokenized prompt of
// 256 tokens), no simulated sleeping.
func BenchmarkChatStream64(b *testing.B) {
	e := startEngine(b, nil)
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt_token_ids": seqTokens(256, 1), "max_tokens": 64, "stream": true})
	url := "http://" + e.HTTPAddr() + "/v1/chat/completions"
	for b.Loop() {
		resp, err := http.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}
