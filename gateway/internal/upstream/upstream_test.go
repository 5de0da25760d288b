package upstream

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/gateway/internal/openai"
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

// A request the engine read is Started (never to be re-sent); a refused connection is not; a streaming
// request without headers in time fails with ErrFirstByteTimeout, a non-streaming one that does not end in
// time with ErrTotalTimeout (also mid-body), and the idle timeout does not apply to the headers.
func TestStartedAndTimeouts(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		switch r.URL.Path {
		case "/drop":
			io.ReadAll(r.Body)
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		case "/slow-headers":
			select {
			case <-time.After(2 * time.Second):
			case <-r.Context().Done():
			}
		case "/slow-body":
			w.Write([]byte("{"))
			w.(http.Flusher).Flush()
			select {
			case <-time.After(2 * time.Second):
			case <-r.Context().Done():
			}
		}
	}))
	defer srv.Close()
	c := NewWithOptions(Options{ConnectTimeout: time.Second, FirstByteTimeout: 200 * time.Millisecond,
		TotalTimeout: 300 * time.Millisecond, IdleTimeout: 100 * time.Millisecond})
	var ue *Error
	_, err := c.Do(context.Background(), Request{BaseURL: srv.URL, Path: "/drop", Body: []byte("{}")})
	if !errors.As(err, &ue) || !ue.Started || calls.Load() != 1 {
		t.Fatalf("dropped after reading: %v (calls %d)", err, calls.Load())
	}
	_, err = c.Do(context.Background(), Request{BaseURL: "http://127.0.0.1:1", Path: "/x"})
	if !errors.As(err, &ue) || ue.Started || !errors.Is(err, ErrBeforeResponse) {
		t.Fatalf("refused: %v", err)
	}
	start := time.Now()
	_, err = c.Do(context.Background(), Request{BaseURL: srv.URL, Path: "/slow-headers", Stream: true})
	if !errors.Is(err, ErrFirstByteTimeout) || !errors.As(err, &ue) || !ue.Started || time.Since(start) > time.Second {
		t.Fatalf("stream headers: %v after %v", err, time.Since(start))
	}
	_, err = c.Do(context.Background(), Request{BaseURL: srv.URL, Path: "/slow-headers"})
	if !errors.Is(err, ErrTotalTimeout) {
		t.Fatalf("non-stream headers: %v (the 100 ms idle timeout must not fire on headers)", err)
	}
	resp, err := c.Do(context.Background(), Request{BaseURL: srv.URL, Path: "/slow-body"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !errors.Is(err, ErrIdle) && !errors.Is(err, ErrTotalTimeout) {
		t.Fatalf("slow body: %v", err)
	}
}

// Hop-by-hop, Connection-nominated, routing and cookie headers are not forwarded; others are.
func TestHeaderHygiene(t *testing.T) {
	got := make(chan http.Header, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Header.Clone() }))
	defer srv.Close()
	hdr := http.Header{"Connection": {"keep-alive, X-Hop"}, "X-Hop": {"1"}, "Cookie": {"a=b"}, "X-Kvgate-Endpoint": {"e"},
		"X-Gateway-Destination-Endpoint": {"h:1"}, "X-Forwarded-Host": {"evil"}, "Authorization": {"Bearer k"},
		"Keep-Alive": {"timeout=5"}, "X-Vendor": {"v"}}
	for _, cookies := range []bool{false, true} {
		c := NewWithOptions(Options{ForwardCookies: cookies})
		resp, err := c.Do(context.Background(), Request{BaseURL: srv.URL, Path: "/", Header: hdr, DropAuth: true})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		h := <-got
		for _, k := range []string{"X-Hop", "X-Kvgate-Endpoint", "X-Gateway-Destination-Endpoint", "X-Forwarded-Host", "Authorization", "Keep-Alive"} {
			if h.Get(k) != "" {
				t.Errorf("%s forwarded", k)
			}
		}
		if (h.Get("Cookie") != "") != cookies || h.Get("X-Vendor") != "v" {
			t.Errorf("forward_cookies %v: Cookie %q, X-Vendor %q", cookies, h.Get("Cookie"), h.Get("X-Vendor"))
		}
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

// staleServer answers one request per connection with keep-alive, then treats the next request on that
// connection as an engine's idle-close racing the reuse: it reads the request and closes without
// answering. It counts connections and requests read.
type staleServer struct {
	ln            net.Listener
	conns, reqs   atomic.Int32
	closeAfterOne bool
}

func newStaleServer(t *testing.T) *staleServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &staleServer{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.conns.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for i := 0; ; i++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					s.reqs.Add(1)
					if i == 1 {
						return // closed with the request unanswered
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}")
				}
			}()
		}
	}()
	return s
}

// A pooled connection the engine closes right after the request was written (EOF, no response byte) is
// the idle-close race: the request is sent again on a new connection and succeeds. The same close on a
// new connection is not retried. Before the fix the second request failed with "Post ...: EOF".
func TestStaleConnectionAfterWriteRetried(t *testing.T) {
	s := newStaleServer(t)
	c := NewWithOptions(Options{ConnectTimeout: time.Second})
	url := "http://" + s.ln.Addr().String()
	for i := range 3 {
		resp, err := c.Do(context.Background(), Request{BaseURL: url, Path: "/v1/completions", Body: []byte(`{"prompt":"x"}`)})
		if err != nil {
			t.Fatalf("request %d: %v (connections %d, requests read %d)", i, err, s.conns.Load(), s.reqs.Load())
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	// Request 0 on conn 1; request 1 read and dropped on conn 1, then answered on conn 2; request 2 read
	// and dropped on conn 2, then answered on conn 3.
	if s.conns.Load() != 3 || s.reqs.Load() != 5 {
		t.Fatalf("connections %d, requests read %d; want 3 and 5", s.conns.Load(), s.reqs.Load())
	}

	// A server that drops every request after reading it: the first attempt on a new connection fails
	// with Started and is not sent again.
	drop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}))
	defer drop.Close()
	var ue *Error
	if _, err := NewWithOptions(Options{}).Do(context.Background(), Request{BaseURL: drop.URL, Path: "/x", Body: []byte("{}")}); !errors.As(err, &ue) || !ue.Started {
		t.Fatalf("fresh connection dropped after the write: %v", err)
	}
}
