package upstream

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// connCounter is an httptest server that counts the connections it accepted and signals each close.
type connCounter struct {
	srv    *httptest.Server
	opened atomic.Int32
	closed chan struct{}
}

func newConnCounter(t *testing.T, h http.HandlerFunc) *connCounter {
	c := &connCounter{closed: make(chan struct{}, 64)}
	c.srv = httptest.NewUnstartedServer(h)
	c.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			c.opened.Add(1)
		case http.StateClosed, http.StateHijacked:
			c.closed <- struct{}{}
		}
	}
	c.srv.Start()
	t.Cleanup(c.srv.Close)
	return c
}

func (c *connCounter) waitClosed(t *testing.T, what string) {
	t.Helper()
	select {
	case <-c.closed:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: the server never saw the connection close", what)
	}
}

func get(t *testing.T, c *Client, base, path string) (int, string) {
	t.Helper()
	resp, err := c.Do(context.Background(), Request{BaseURL: base, Path: path, Body: []byte(`{"a":1}`)})
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("%s: body: %v", path, err)
	}
	return resp.StatusCode, string(b)
}

// TestConnTransportReuseAndClose: sequential requests share one connection; a response saying
// "Connection: close", a body closed before its end and an informational 100 answer behave as net/http's
// Transport does; the request line, Host, Content-Length and headers reach the engine as sent.
func TestConnTransportReuseAndClose(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	cc := newConnCounter(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%s %s %s len=%d body=%s x=%s", r.Method, r.URL.RequestURI(), r.Host, r.ContentLength, b, r.Header.Get("X-Test")))
		mu.Unlock()
		switch r.URL.Path {
		case "/close":
			w.Header().Set("Connection", "close")
		case "/big":
			w.Write([]byte(strings.Repeat("x", 1<<20)))
			return
		case "/chunked":
			for i := range 3 {
				fmt.Fprintf(w, "part%d;", i)
				w.(http.Flusher).Flush()
			}
			return
		}
		w.Write([]byte("ok"))
	})
	c := NewWithOptions(Options{ConnectTimeout: time.Second})
	for i := range 5 {
		if st, b := get(t, c, cc.srv.URL, "/v1/x?i="+fmt.Sprint(i)); st != 200 || b != "ok" {
			t.Fatalf("request %d: %d %q", i, st, b)
		}
	}
	if n := cc.opened.Load(); n != 1 {
		t.Fatalf("5 sequential requests opened %d connections, want 1 (keep-alive reuse)", n)
	}
	if st, b := get(t, c, cc.srv.URL, "/chunked"); st != 200 || b != "part0;part1;part2;" {
		t.Fatalf("chunked: %d %q", st, b)
	}
	if n := cc.opened.Load(); n != 1 {
		t.Fatalf("a chunked response was not pooled: %d connections", n)
	}
	// Connection: close → the next request dials.
	get(t, c, cc.srv.URL, "/close")
	cc.waitClosed(t, "Connection: close")
	get(t, c, cc.srv.URL, "/after-close")
	if n := cc.opened.Load(); n != 2 {
		t.Fatalf("after a Connection: close answer: %d connections, want 2", n)
	}
	// A body closed before its end closes its connection.
	resp, err := c.Do(context.Background(), Request{BaseURL: cc.srv.URL, Path: "/big", Body: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Read(make([]byte, 10))
	resp.Body.Close()
	cc.waitClosed(t, "body closed early")
	if _, err := resp.Body.Read(make([]byte, 1)); err == nil {
		t.Fatal("a read after Close succeeded")
	}
	get(t, c, cc.srv.URL, "/after-early-close")
	if n := cc.opened.Load(); n != 3 {
		t.Fatalf("after a body closed early: %d connections, want 3", n)
	}
	mu.Lock()
	first := seen[0]
	mu.Unlock()
	if want := "POST /v1/x?i=0 " + strings.TrimPrefix(cc.srv.URL, "http://") + " len=7 body={\"a\":1} x="; first != want {
		t.Fatalf("the engine saw %q, want %q", first, want)
	}
}

// TestConnTransportInformational: an engine's 100 Continue before its answer is skipped.
func TestConnTransportInformational(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		br := bufio.NewReader(conn)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		io.WriteString(conn, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\ndone")
		br.ReadByte() // wait for the client to close
	}()
	c := NewWithOptions(Options{ConnectTimeout: time.Second})
	if st, b := get(t, c, "http://"+ln.Addr().String(), "/x"); st != 201 || b != "done" {
		t.Fatalf("got %d %q, want 201 \"done\"", st, b)
	}
}

// TestConnTransportDeadIdleConnection: an engine that closed an idle pooled connection (its keep-alive
// timeout) is noticed before the connection is used: the next request dials and succeeds, with no error
// and no stale-connection retry (GotConn reports a new connection).
func TestConnTransportDeadIdleConnection(t *testing.T) {
	cc := newConnCounter(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })
	c := NewWithOptions(Options{ConnectTimeout: time.Second})
	get(t, c, cc.srv.URL, "/1")
	cc.srv.CloseClientConnections() // the engine closes its idle connections
	cc.waitClosed(t, "server-side close")
	tr := c.hc.Transport.(*connTransport)
	// The FIN has reached the socket once the server's close returned; the pool still holds the connection.
	tr.mu.Lock()
	pooled := tr.nIdle
	tr.mu.Unlock()
	if pooled != 1 {
		t.Fatalf("pooled connections: %d, want 1", pooled)
	}
	var reused atomic.Bool
	req, _ := http.NewRequest(http.MethodPost, cc.srv.URL+"/2", strings.NewReader("{}"))
	req = req.WithContext(httptraceGotConn(req.Context(), &reused))
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatalf("a request after the engine closed the idle connection: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if reused.Load() {
		t.Fatal("the closed connection was reused")
	}
	if n := cc.opened.Load(); n != 2 {
		t.Fatalf("connections: %d, want 2", n)
	}
}

// TestConnTransportCancelClosesConnection: ending the request's context while the engine works closes
// that connection (the engine aborts the request), both before the headers and mid-body, and the error is
// the context's.
func TestConnTransportCancelClosesConnection(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	cc := newConnCounter(t, func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body) // net/http's server notices a client's close once the body is read
		if r.URL.Path == "/mid" {
			w.Write([]byte("first"))
			w.(http.Flusher).Flush()
		}
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	c := NewWithOptions(Options{ConnectTimeout: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Do(ctx, Request{BaseURL: cc.srv.URL, Path: "/headers", Body: []byte(`{}`)})
		done <- err
	}()
	time.Sleep(50 * time.Millisecond) // the request is written; the engine holds it
	cancel()
	cc.waitClosed(t, "cancel before headers")
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	resp, err := c.Do(ctx, Request{BaseURL: cc.srv.URL, Path: "/mid", Body: []byte(`{}`), Stream: true})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "first" {
		t.Fatalf("first bytes %q, %v", buf, err)
	}
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	_, err = resp.Body.Read(buf)
	resp.Body.Close()
	cc.waitClosed(t, "cancel mid-body")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("mid-body read error %v, want context.Canceled", err)
	}
}

// TestConnTransportIdleSweep: a pooled connection left unused for the idle timeout is closed by the
// gateway (before an engine's own keep-alive timeout would).
func TestConnTransportIdleSweep(t *testing.T) {
	cc := newConnCounter(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })
	c := NewWithOptions(Options{ConnectTimeout: time.Second})
	c.hc.Transport.(*connTransport).idleTimeout = 100 * time.Millisecond
	get(t, c, cc.srv.URL, "/1")
	cc.waitClosed(t, "idle sweep")
	tr := c.hc.Transport.(*connTransport)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.nIdle != 0 || len(tr.idle) != 0 {
		t.Fatalf("after the sweep %d connections are pooled", tr.nIdle)
	}
}

// TestConnTransportConcurrent: concurrent requests each get a whole connection (-race).
func TestConnTransportConcurrent(t *testing.T) {
	cc := newConnCounter(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	})
	c := NewWithOptions(Options{ConnectTimeout: time.Second})
	var wg sync.WaitGroup
	errs := make(chan error, 8*50)
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				want := fmt.Sprintf(`{"g":%d,"i":%d}`, g, i)
				resp, err := c.Do(context.Background(), Request{BaseURL: cc.srv.URL, Path: "/echo", Body: []byte(want)})
				if err != nil {
					errs <- err
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(b) != want {
					errs <- fmt.Errorf("got %q, want %q", b, want)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := cc.opened.Load(); n > 8 {
		t.Fatalf("8 concurrent clients opened %d connections", n)
	}
}

func httptraceGotConn(ctx context.Context, reused *atomic.Bool) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused.Store(i.Reused) }})
}

// TestConnTransportStaleRetryIdempotent: an engine that closes a reused connection after reading the next
// request, without answering (its idle close racing the reuse: no FIN was there to see before the write),
// costs a GET nothing: it is sent again on a new connection, as net/http's Transport does, so a health
// check or a scrape does not fail (the race made TestUpstreamStatusAndStaleConnections answer 503 once
// under -race). A POST is not sent again by the transport: Client.Do's rules decide that.
func TestConnTransportStaleRetryIdempotent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns atomic.Int32
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conn.Close()
				br := bufio.NewReader(conn)
				for n := 0; ; n++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					if n == 1 {
						return // the second request on a connection: closed unanswered
					}
					io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			}()
		}
	}()
	c := NewWithOptions(Options{ConnectTimeout: time.Second})
	base := "http://" + ln.Addr().String()
	for i := range 3 {
		resp, err := c.HTTP().Get(base + "/health")
		if err != nil {
			t.Fatalf("GET %d on a connection the engine closes unanswered: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "ok" {
			t.Fatalf("GET %d: %d %q", i, resp.StatusCode, b)
		}
	}
	if n := conns.Load(); n != 3 {
		t.Fatalf("3 GETs used %d connections, want 3 (each reuse failed and was sent again)", n)
	}
	// The last GET's connection is pooled; a POST on it fails and is not sent again by the transport.
	resp, err := c.HTTP().Post(base+"/v1/completions", "application/json", strings.NewReader("{}"))
	if err == nil {
		resp.Body.Close()
		t.Fatal("a POST the engine never answered succeeded")
	}
	if n := conns.Load(); n != 3 {
		t.Fatalf("the POST opened another connection (%d): the transport sent it again", n)
	}
}
