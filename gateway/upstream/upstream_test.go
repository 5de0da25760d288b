package upstream

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/gateway/openai"
)

func TestBodyPerEngineKind(t *testing.T) {
	chat := []byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"zz":1}`)
	creq, _ := openai.ParseRequest(openai.Chat, chat)
	comp := []byte(`{"model":"m","prompt":"hi","zz":1}`)
	preq, _ := openai.ParseRequest(openai.Completions, comp)
	batch := []byte(`{"model":"m","prompt":["a","b"]}`)
	breq, _ := openai.ParseRequest(openai.Completions, batch)
	ids := []uint32{7, 8}
	cases := []struct {
		kind string
		req  *openai.Request
		in   []byte
		want string
	}{
		{config.EngineSim, creq, chat, `{"prompt_token_ids":[7,8],"model":"m","messages":[{"role":"user","content":"x"}],"zz":1}`},
		{config.EngineVLLM, creq, chat, string(chat)},
		{config.EngineSGLang, creq, chat, string(chat)},
		{config.EngineSim, preq, comp, `{"model":"m","prompt":[7,8],"zz":1}`},
		{config.EngineVLLM, preq, comp, `{"model":"m","prompt":[7,8],"zz":1}`},
		{config.EngineSGLang, preq, comp, string(comp)},
		{config.EngineVLLM, breq, batch, string(batch)}, // a batch keeps its prompts
	}
	for _, tc := range cases {
		got, err := Body(tc.kind, tc.req, tc.in, ids)
		if err != nil || string(got) != tc.want {
			t.Errorf("%s %s: %s %v", tc.kind, tc.req.API, got, err)
		}
	}
}

// The idle timeout fails a stalled response but never a slow one that keeps sending.
func TestIdleTimeout(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := w.(http.Flusher)
		for range 5 {
			io.WriteString(w, "data: x\n\n")
			f.Flush()
			time.Sleep(60 * time.Millisecond)
		}
		if r.URL.Path == "/stall" {
			time.Sleep(2 * time.Second)
		}
	}))
	defer srv.Close()
	c := New(150 * time.Millisecond)
	resp, err := c.Post(context.Background(), srv.URL, "/ok", []byte("{}"), nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(resp.Body); err != nil || strings.Count(string(b), "data:") != 5 {
		t.Fatalf("slow stream cut: %q %v", b, err)
	}
	resp.Body.Close()
	resp, err = c.Post(context.Background(), srv.URL, "/stall", []byte("{}"), nil, false)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !errors.Is(err, ErrIdle) || time.Since(start) > time.Second {
		t.Fatalf("stall: %v after %v", err, time.Since(start))
	}
	if _, err := c.Post(context.Background(), "http://127.0.0.1:1", "/x", nil, nil, false); !errors.Is(err, ErrBeforeResponse) {
		t.Fatalf("refused: %v", err)
	}
}

// WithRank sets X-data-parallel-rank on a copy (the client's headers are shared by retries to other
// endpoints) and leaves headers alone for an endpoint without ranks.
func TestWithRank(t *testing.T) {
	hdr := http.Header{"X-Data-Parallel-Rank": {"7"}, "Authorization": {"Bearer k"}}
	if got := WithRank(hdr, -1); got.Get(DataParallelRankHeader) != "7" {
		t.Fatalf("no rank: %v", got)
	}
	got := WithRank(hdr, 1)
	if got.Get(DataParallelRankHeader) != "1" || len(got.Values(DataParallelRankHeader)) != 1 || got.Get("Authorization") != "Bearer k" {
		t.Fatalf("rank 1: %v", got)
	}
	if hdr.Get(DataParallelRankHeader) != "7" {
		t.Fatalf("the client's headers changed: %v", hdr)
	}
	if got := WithRank(nil, 0); got.Get(DataParallelRankHeader) != "0" {
		t.Fatalf("nil headers: %v", got)
	}
}
