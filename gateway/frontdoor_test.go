package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/cmd/enginesim/sim"
	"github.com/kvgate/kvgate/gateway/internal/openai"
	"github.com/kvgate/kvgate/gateway/internal/server"
)

func openaiParse(body string) (*openai.Request, error) {
	return openai.ParseRequest(openai.Completions, []byte(body))
}

// fdChildEnv makes the test binary run TestListenerSurvivesFDExhaustion's gateway process.
const fdChildEnv = "KVGATE_TEST_FD_CHILD"

// scrapeMetric reads one sample (name with its label text, e.g. `kvgate_x{a="b"}`) from a /metrics page.
func scrapeMetric(t testing.TB, url, sample string) float64 {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer admintok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// Issue 10 (1): a gateway process out of file descriptors keeps its listener: accept errors (EMFILE) are
// logged, counted and retried, and once the idle connections go away /healthz answers again. Before the
// fix fasthttp's Serve returned on EMFILE and the port stayed dead. A real child process (this binary)
// with a low RLIMIT_NOFILE holds the gateway; this process opens the connections.
func TestListenerSurvivesFDExhaustion(t *testing.T) {
	if os.Getenv(fdChildEnv) == "1" {
		fdChild(t)
		return
	}
	if testing.Short() {
		t.Skip("a process-level test (the race pass runs -short); covered by the unit pass")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestListenerSurvivesFDExhaustion$", "-test.v")
	cmd.Env = append(os.Environ(), fdChildEnv+"=1")
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	var stderr lockedBuf
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}()
	addrCh := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "FDCHILD_ADDR "); ok {
				addrCh <- a
			}
		}
	}()
	var addr string
	select {
	case addr = <-addrCh:
	case <-time.After(60 * time.Second):
		t.Fatalf("child never listened; stderr:\n%s", stderr.String())
	}
	// More connections than the child has descriptors, held idle, then let go.
	var conns []net.Conn
	for range 400 {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	time.Sleep(1500 * time.Millisecond)
	for _, c := range conns {
		c.Close()
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	ok := waitFor(8*time.Second, func() bool {
		resp, err := hc.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	if !ok {
		t.Fatalf("/healthz never answered after the connections closed (%d opened); child stderr:\n%s", len(conns), stderr.String())
	}
	if n := scrapeMetric(t, "http://"+addr+"/metrics", "kvgate_accept_errors_total"); n < 1 {
		t.Errorf("kvgate_accept_errors_total = %v, want ≥ 1 (the descriptors ran out)", n)
	}
	if !strings.Contains(stderr.String(), "accept failed") {
		t.Errorf("no accept error logged; child stderr:\n%s", stderr.String())
	}
}

// lockedBuf is a strings.Builder safe to read while a child process writes to it.
type lockedBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// fdChild runs the gateway with a descriptor limit a little above what it uses, until stdin closes.
func fdChild(t *testing.T) {
	g := startGateway(t, gwYAML("      - {id: e0, engine: enginesim, url: \"http://127.0.0.1:1\"}\n", ""))
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	lim.Cur = uint64(len(ents) + 64)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("FDCHILD_ADDR %s\n", g.Addr())
	io.Copy(io.Discard, os.Stdin)
}

// Issue 10 (1): serving that ends without Close is reported on Stopped (kvgate serve then exits non-zero).
func TestStoppedWhenServingEnds(t *testing.T) {
	g := startGateway(t, gwYAML("      - {id: e0, engine: enginesim, url: \"http://127.0.0.1:1\"}\n", ""))
	g.ln.Close()
	select {
	case err := <-g.Stopped():
		if err == nil || !strings.Contains(err.Error(), "stopped serving") {
			t.Fatalf("Stopped: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Stopped never fired after the listener closed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g.Close(ctx)
	select {
	case err := <-g.Stopped():
		t.Fatalf("a second Stopped after Close: %v", err)
	default:
	}
}

// tryScrape reads one sample from a /metrics page; ok is false when the page could not be read (e.g. the
// scrape's own connection was over a limit).
func tryScrape(url, sample string) (float64, bool) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	return v, err == nil
}

// closedWithin reads c until the server closes it or d passes; it returns what was read and whether the
// server closed the connection (EOF or reset) in time.
func closedWithin(c net.Conn, d time.Duration) (string, bool) {
	c.SetReadDeadline(time.Now().Add(d))
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return b.String(), false
			}
			return b.String(), true
		}
	}
}

func dial(t testing.TB, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Issue 10 (2): with client keys on, an unauthenticated request is refused on its headers: the 401 comes
// back while the declared 60 MB body (or an endless chunked one) is still unsent, and the connection is
// closed. Before the fix the whole body was read first (RSS grew by the bodies' size). An authenticated
// chunked upload over max_body_bytes gets 413 and a closed connection.
func TestAuthBeforeBody(t *testing.T) {
	engines := startSims(t, 1, nil)
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), "client_api_keys_env: KVGATE_TEST_KEYS\n"))
	addr := g.Addr()
	type result struct {
		resp   string
		closed bool
	}
	const n = 24
	res := make(chan result, n)
	for range n {
		go func() {
			c, err := net.DialTimeout("tcp", addr, 2*time.Second)
			if err != nil {
				res <- result{err.Error(), false}
				return
			}
			defer c.Close()
			fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 62914560\r\n\r\n")
			c.Write([]byte(`{"model":"qwen3","messages":[`))
			r, closed := closedWithin(c, 10*time.Second) // generous: the old code never answered at all
			res <- result{r, closed}
		}()
	}
	for range n {
		r := <-res
		if !strings.HasPrefix(r.resp, "HTTP/1.1 401") || !r.closed {
			t.Fatalf("unauthenticated 60 MB POST: closed=%v response %q", r.closed, r.resp)
		}
	}
	// An endless chunked upload without a key: 401 and closed, whatever the client keeps sending.
	c1 := dial(t, addr)
	fmt.Fprintf(c1, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
	go func() {
		chunk := fmt.Sprintf("%x\r\n%s\r\n", 65536, strings.Repeat("a", 65536))
		for range 2000 { // at most 128 MiB
			if _, err := io.WriteString(c1, chunk); err != nil {
				return
			}
		}
	}()
	if r, closed := closedWithin(c1, 10*time.Second); !strings.HasPrefix(r, "HTTP/1.1 401") || !closed {
		t.Fatalf("unauthenticated chunked upload: closed=%v %q", closed, r)
	}
	// Authenticated, over max_body_bytes (64 MiB), chunked: 413 and closed, long before 256 MiB were sent.
	c2 := dial(t, addr)
	fmt.Fprintf(c2, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ck1\r\nTransfer-Encoding: chunked\r\n\r\n")
	sent := make(chan int, 1)
	go func() {
		chunk := fmt.Sprintf("%x\r\n%s\r\n", 65536, strings.Repeat("a", 65536))
		total := 0
		for range 4096 {
			if _, err := io.WriteString(c2, chunk); err != nil {
				break
			}
			total += 65536
		}
		sent <- total
	}()
	if r, closed := closedWithin(c2, 10*time.Second); !strings.HasPrefix(r, "HTTP/1.1 413") || !closed {
		t.Fatalf("authenticated oversize chunked upload: closed=%v %q", closed, r)
	}
	if total := <-sent; total >= 4096*65536 {
		t.Fatalf("the client could send all %d bytes: the server kept reading", total)
	}
	// The limits do not get in the way of a client with a key.
	st, _, body := post(t, "http://"+addr+"/v1/completions", `{"model":"qwen3","prompt":"hello","max_tokens":2}`, "Authorization", "Bearer ck1")
	if st != 200 {
		t.Fatalf("authenticated request: %d %s", st, body)
	}
	if v := scrapeMetric(t, "http://"+addr+"/metrics", `kvgate_requests_total{endpoint="",model="unknown",status="401"}`); v != n+1 {
		t.Errorf("401s counted: %v, want %d", v, n+1)
	}
}

// Issue 10 (3): a connection that sends nothing, a header sent a line at a time and a body sent a byte at a
// time are all closed after client_header_timeout / client_body_timeout. Before the fix none was closed.
func TestClientReadDeadlines(t *testing.T) {
	g := startGateway(t, gwYAML("      - {id: e0, engine: enginesim, url: \"http://127.0.0.1:1\"}\n",
		"client_header_timeout: 1s\nclient_body_timeout: 1s\n"))
	addr := g.Addr()
	drip := func(c net.Conn, head string, step string) {
		go func() {
			io.WriteString(c, head)
			for range 40 {
				time.Sleep(250 * time.Millisecond)
				if _, err := io.WriteString(c, step); err != nil {
					return
				}
			}
		}()
	}
	silent := dial(t, addr)
	hdr := dial(t, addr)
	drip(hdr, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n", "X-Drip: 1\r\n")
	body := dial(t, addr)
	drip(body, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{", " ")
	done := make(chan string, 3)
	for name, c := range map[string]net.Conn{"silent": silent, "header drip": hdr, "body drip": body} {
		go func() {
			start := time.Now()
			r, closed := closedWithin(c, 4*time.Second)
			if !closed {
				done <- fmt.Sprintf("%s: still open after %v (read %q)", name, time.Since(start).Round(time.Millisecond), r)
				return
			}
			done <- ""
		}()
	}
	for range 3 {
		if msg := <-done; msg != "" {
			t.Error(msg)
		}
	}
}

// engineRequests returns how many requests the simulated engine has ended (finished, cancelled, refused
// or failed by a fault), from its own /metrics.
func engineRequests(t testing.TB, e interface{ HTTPAddr() string }) int {
	t.Helper()
	resp, err := http.Get("http://" + e.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	n := 0.0
	for _, m := range regexp.MustCompile(`(?m)^enginesim:requests_total\{[^}]*\} (\S+)$`).FindAllSubmatch(b, -1) {
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		n += v
	}
	return int(n)
}

func engineCounts(t testing.TB, engines []*sim.Engine) []int {
	out := make([]int, len(engines))
	for i, e := range engines {
		out[i] = engineRequests(t, e)
	}
	return out
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// Issue 10 (4): upstream_idle_timeout is silence between bytes, not a header timeout: a ~2 s non-streaming
// generation behind a 1 s idle timeout is answered once, by one engine. Before the fix the idle timeout
// fired on the headers, the written request was re-sent to the same and then every other endpoint (2 × N
// generations) and the client got 502. upstream_total_timeout then ends a non-streaming request with 504,
// and it is not re-sent either.
func TestNoDuplicateGenerations(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time generations (4 engines at time scale 1); run by the unit pass")
	}
	engines := startSims(t, 4, func(c *sim.Config) { c.TimeScale = 1 })
	eps := simEndpointsYAML(engines, 64)
	g := startGateway(t, gwYAML(eps, "upstream_idle_timeout: 1s\n"))
	body := `{"model":"qwen3","messages":[{"role":"user","content":"Tell me a long story."}],"max_tokens":300}`
	before := engineCounts(t, engines)
	start := time.Now()
	st, _, b := post(t, "http://"+g.Addr()+"/v1/chat/completions", body)
	took := time.Since(start)
	if st != 200 {
		t.Fatalf("status %d after %v: %s", st, took, b)
	}
	if took < 1500*time.Millisecond {
		t.Fatalf("the generation took %v: too short to show the idle timeout is not a header timeout", took)
	}
	waitFor(2*time.Second, func() bool { return sum(engineCounts(t, engines))-sum(before) >= 1 })
	after := engineCounts(t, engines)
	if d := sum(after) - sum(before); d != 1 {
		t.Fatalf("engines ran %d requests (before %v, after %v), want 1", d, before, after)
	}

	g2 := startGateway(t, gwYAML(eps, "upstream_total_timeout: 700ms\n"))
	before = engineCounts(t, engines)
	start = time.Now()
	st, _, b = post(t, "http://"+g2.Addr()+"/v1/chat/completions", body)
	took = time.Since(start)
	if st != 504 || !strings.Contains(string(b), `"upstream_timeout"`) || took > 1500*time.Millisecond {
		t.Fatalf("total timeout: status %d after %v: %s", st, took, b)
	}
	waitFor(2*time.Second, func() bool { return sum(engineCounts(t, engines))-sum(before) >= 1 })
	// A re-send would have been forwarded before the 504; once the engines hold no request the cancelled
	// one has left, and the count is final.
	if !waitFor(5*time.Second, func() bool {
		for _, e := range engines {
			if st := e.Stats(); st.Running+st.Waiting > 0 {
				return false
			}
		}
		return true
	}) {
		t.Fatal("the timed-out request never left the engine")
	}
	if d := sum(engineCounts(t, engines)) - sum(before); d != 1 {
		t.Fatalf("after a total timeout the engines ran %d requests, want 1 (cancelled, not re-sent)", d)
	}
	if v := scrapeMetric(t, "http://"+g2.Addr()+"/metrics", `kvgate_upstream_timeouts_total{endpoint="e0",kind="total"}`) +
		scrapeMetric(t, "http://"+g2.Addr()+"/metrics", `kvgate_upstream_timeouts_total{endpoint="e1",kind="total"}`) +
		scrapeMetric(t, "http://"+g2.Addr()+"/metrics", `kvgate_upstream_timeouts_total{endpoint="e2",kind="total"}`) +
		scrapeMetric(t, "http://"+g2.Addr()+"/metrics", `kvgate_upstream_timeouts_total{endpoint="e3",kind="total"}`); v != 1 {
		t.Errorf("kvgate_upstream_timeouts_total{kind=total} = %v, want 1", v)
	}
}

// Issue 10 (5): a completions batch reserves one request per prompt × n: a 200-prompt batch behind a
// 4-request limit is refused with 400 (nothing forwarded), 2 prompts × n=2 fill the limit so that one more
// request waits and gets 429, and a batch over max_batch_prompts is refused. Before the fix the batch
// counted as one request and was forwarded.
func TestBatchCompletionsReserveEverySequence(t *testing.T) {
	release := make(chan struct{})
	eng := newFakeEngine(t, 0, func(w http.ResponseWriter, _ *http.Request, b []byte) {
		if strings.Contains(string(b), "HOLD") {
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`)
	})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	g := startGateway(t, gwYAML(fmt.Sprintf("      - {id: e, engine: vllm, url: %q, max_inflight_requests: 4, max_inflight_tokens: 4096}\n", eng.srv.URL),
		"max_batch_prompts: 300\n"))
	url := "http://" + g.Addr() + "/v1/completions"
	batch := func(n int, word string) string {
		ps := make([]string, n)
		for i := range ps {
			ps[i] = fmt.Sprintf("%q", fmt.Sprintf("%s prompt %d", word, i))
		}
		return "[" + strings.Join(ps, ",") + "]"
	}
	st, _, b := post(t, url, `{"model":"qwen3","max_tokens":4,"prompt":`+batch(200, "x")+`}`)
	if st != 400 || !strings.Contains(string(b), `"batch_too_large"`) || !strings.Contains(string(b), "200 sequences") {
		t.Fatalf("200-prompt batch behind a 4-request limit: %d %s", st, b)
	}
	if n := eng.calls.Load(); n != 0 {
		t.Fatalf("the refused batch reached the engine (%d calls)", n)
	}
	// Every prompt's tokens are reserved, not only the first's.
	req, _ := openaiParse(`{"model":"qwen3","max_tokens":4,"prompt":["a b c d e f g h","a b c d e f g h","a b c d e f g h"]}`)
	plan, err := g.Router().Plan(context.Background(), g.models["qwen3"].Model, "", server.RouteRequest(req), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := g.Router().Cost(plan); c.Requests != 3 || c.Tokens != 3*int64(len(plan.IDs))+3*4 {
		t.Fatalf("3-prompt batch cost %+v (first prompt %d tokens)", c, len(plan.IDs))
	}

	held := make(chan int, 1)
	go func() {
		st, _, _ := post(t, url, `{"model":"qwen3","max_tokens":4,"n":2,"prompt":`+batch(2, "HOLD")+`}`)
		held <- st
	}()
	if !waitFor(5*time.Second, func() bool { return eng.calls.Load() == 1 }) {
		t.Fatal("the held batch never reached the engine")
	}
	st, _, b = post(t, url, `{"model":"qwen3","max_tokens":4,"prompt":"one more"}`)
	if st != 429 {
		t.Fatalf("with 2 prompts × n=2 in flight on a 4-request endpoint another request got %d %s, want 429", st, b)
	}
	close(release)
	if st := <-held; st != 200 {
		t.Fatalf("held batch: %d", st)
	}
	st, _, b = post(t, url, `{"model":"qwen3","max_tokens":1,"prompt":`+batch(301, "y")+`}`)
	if st != 400 || !strings.Contains(string(b), "max_batch_prompts") {
		t.Fatalf("301-prompt batch over max_batch_prompts 300: %d %s", st, b)
	}
	if n := eng.calls.Load(); n != 1 {
		t.Fatalf("engine calls %d, want 1 (the held batch only)", n)
	}
}

// Issue 10 (6): a streaming client that reads only the headers (a 4 KB receive buffer) is disconnected
// after client_write_timeout: the engine's request is cancelled and the lease released. Before the fix the
// engine kept generating and the lease was renewed for as long as the engine went on.
func TestStalledReaderIsDisconnected(t *testing.T) {
	cancelled := make(chan time.Time, 1)
	eng := newFakeEngine(t, 0, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		chunk := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 1000) + "\"},\"finish_reason\":null}]}\n\n"
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			if _, err := io.WriteString(w, chunk); err != nil {
				break
			}
			f.Flush()
			if r.Context().Err() != nil {
				break
			}
		}
		cancelled <- time.Now()
	})
	g := startGateway(t, gwYAML(fmt.Sprintf("      - {id: e, engine: vllm, url: %q}\n", eng.srv.URL), "client_write_timeout: 1s\n"))
	d := net.Dialer{Timeout: 2 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"model":"qwen3","stream":true,"max_tokens":100000,"messages":[{"role":"user","content":"go on forever"}]}`
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	head := make([]byte, 512)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(head); err != nil || !strings.HasPrefix(string(head[:n]), "HTTP/1.1 200") {
		t.Fatalf("headers: %q %v", head[:n], err)
	}
	start := time.Now()
	select {
	case at := <-cancelled:
		if took := at.Sub(start); took > 6*time.Second {
			t.Fatalf("engine request cancelled only after %v", took)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("the engine kept streaming to a client that reads nothing")
	}
	if !waitFor(2*time.Second, func() bool { return g.StoreStatus().OwnInFlight == 0 }) {
		t.Fatalf("lease not released: %d in flight", g.StoreStatus().OwnInFlight)
	}
	if v := scrapeMetric(t, "http://"+g.Addr()+"/metrics", `kvgate_client_disconnects_total{model="qwen3",stream="true"}`); v != 1 {
		t.Errorf("stream client disconnects counted: %v, want 1", v)
	}
}

func getWith(t testing.TB, url, auth string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// Issue 10 (7): an engine answering 503 before any byte is retried on the healthy replica (every client
// request succeeds), and after outlier_consecutive_failures it is ejected: no longer picked, shown in
// /readyz (with the admin token) and in kvgate_endpoint_ejected. Before the fix 4 of 10 requests got the
// engine's 503 and the endpoint kept being picked.
func TestEngine503RetriedAndEjected(t *testing.T) {
	sick := newFakeEngine(t, 0, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":"overloaded"}`)
	})
	good := newFakeEngine(t, 3, okCompletion)
	eps := fmt.Sprintf("      - {id: sick, engine: vllm, url: %q}\n      - {id: good, engine: vllm, url: %q}\n", sick.srv.URL, good.srv.URL)
	g := startGateway(t, gwYAML(eps, "outlier_consecutive_failures: 3\noutlier_ejection_time: 30s\n"))
	for i := range 10 {
		st, h, b := post(t, "http://"+g.Addr()+"/v1/chat/completions", chatBody(false, 1, fmt.Sprintf("q%d", i)))
		if st != 200 || h.Get("x-kvgate-endpoint") != "good" {
			t.Fatalf("request %d: %d %s (endpoint %q)", i, st, b, h.Get("x-kvgate-endpoint"))
		}
	}
	if n := sick.calls.Load(); n != 3 {
		t.Fatalf("the 503 endpoint got %d requests, want 3 (ejected after 3 consecutive failures)", n)
	}
	base := "http://" + g.Addr()
	if v := scrapeMetric(t, base+"/metrics", `kvgate_endpoint_ejected{endpoint="sick"}`); v != 1 {
		t.Errorf("kvgate_endpoint_ejected{sick} = %v", v)
	}
	if v := scrapeMetric(t, base+"/metrics", `kvgate_endpoint_ejections_total{endpoint="sick"}`); v != 1 {
		t.Errorf("kvgate_endpoint_ejections_total{sick} = %v", v)
	}
	st, _, b := getWith(t, base+"/readyz", "Bearer admintok")
	if st != 200 || !strings.Contains(b, `"ejected":true`) {
		t.Fatalf("readyz with token: %d %s", st, b)
	}
}

// Issue 10 (8): streaming edge cases. A stream:true answer labelled application/json is relayed as it
// comes (not buffered whole, no Content-Length); SSE carries X-Accel-Buffering: no; a stream that ends
// without [DONE] or a finish reason ends with one error event and counts as an upstream failure; an
// engine error event followed by a clean end or a FIN gets no second error event.
func TestStreamingEdgeCases(t *testing.T) {
	eng := newFakeEngine(t, 0, func(w http.ResponseWriter, r *http.Request, b []byte) {
		body := string(b)
		f := w.(http.Flusher)
		switch {
		case strings.Contains(body, "JSONLABEL"):
			w.Header().Set("Content-Type", "application/json")
			for i := range 5 {
				fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"%d\"},\"finish_reason\":null}]}\n\n", i)
				f.Flush()
				time.Sleep(150 * time.Millisecond)
			}
			io.WriteString(w, "data: [DONE]\n\n")
		case strings.Contains(body, "NODONE"):
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"finish_reason\":null}]}\n\n")
		case strings.Contains(body, "ERRCLEAN"):
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"finish_reason\":null}]}\n\ndata: {\"error\":{\"message\":\"engine broke\"}}\n\n")
		case strings.Contains(body, "ERRFIN"):
			conn, bw, _ := w.(http.Hijacker).Hijack()
			bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
			bw.WriteString("data: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"finish_reason\":null}]}\n\ndata: {\"error\":{\"message\":\"engine broke\"}}\n\n")
			bw.Flush()
			conn.Close()
		default:
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
		}
	})
	g := startGateway(t, gwYAML(fmt.Sprintf("      - {id: e, engine: vllm, url: %q}\n", eng.srv.URL), ""))
	url := "http://" + g.Addr() + "/v1/chat/completions"
	stream := func(word string) (*http.Response, []time.Duration, string) {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(chatBody(true, 5, word)))
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var at []time.Duration
		var all strings.Builder
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "data:") {
				at = append(at, time.Since(start))
			}
			all.WriteString(sc.Text() + "\n")
		}
		return resp, at, all.String()
	}
	resp, at, _ := stream("JSONLABEL")
	if len(at) != 6 || at[5]-at[0] < 500*time.Millisecond {
		t.Fatalf("application/json stream: %d events at %v (buffered whole?)", len(at), at)
	}
	if resp.ContentLength != -1 || resp.Header.Get("X-Accel-Buffering") != "no" {
		t.Fatalf("application/json stream: content-length %d, X-Accel-Buffering %q", resp.ContentLength, resp.Header.Get("X-Accel-Buffering"))
	}
	resp, _, all := stream("fine")
	if resp.Header.Get("X-Accel-Buffering") != "no" || strings.Contains(all, `"error"`) {
		t.Fatalf("a complete stream: X-Accel-Buffering %q, body %q", resp.Header.Get("X-Accel-Buffering"), all)
	}
	for word, wantErrs := range map[string]int{"NODONE": 1, "ERRCLEAN": 1, "ERRFIN": 1} {
		_, _, all := stream(word)
		if n := strings.Count(all, `"error"`); n != wantErrs {
			t.Errorf("%s: %d error events, want %d:\n%s", word, n, wantErrs, all)
		}
	}
	base := "http://" + g.Addr() + "/metrics"
	if v := scrapeMetric(t, base, `kvgate_requests_total{endpoint="e",model="qwen3",status="502"}`); v != 3 {
		t.Errorf("streams counted as upstream failures: %v, want 3", v)
	}
	if v := scrapeMetric(t, base, `kvgate_requests_total{endpoint="e",model="qwen3",status="200"}`); v != 2 {
		t.Errorf("streams counted as successes: %v, want 2", v)
	}
	if v := scrapeMetric(t, base, `kvgate_upstream_failures_total{endpoint="e"}`); v != 3 {
		t.Errorf("kvgate_upstream_failures_total: %v, want 3", v)
	}
}

// Issue 10 (9): 503 no_healthy_endpoint carries Retry-After; a streaming engine that sends no headers
// within upstream_first_byte_timeout is a 504 (was 502), not retried.
func TestErrorMetadata(t *testing.T) {
	g := startGateway(t, gwYAML("      - {id: e0, engine: enginesim, url: \"http://127.0.0.1:1\"}\n", ""))
	st, h, b := post(t, "http://"+g.Addr()+"/v1/chat/completions", chatBody(false, 1, "x"))
	if st != 503 || h.Get("Retry-After") == "" || !strings.Contains(string(b), "no_healthy_endpoint") {
		t.Fatalf("no healthy endpoint: %d Retry-After %q %s", st, h.Get("Retry-After"), b)
	}
	slow := newFakeEngine(t, 0, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		select {
		case <-time.After(3 * time.Second):
		case <-r.Context().Done():
		}
	})
	g2 := startGateway(t, gwYAML(fmt.Sprintf("      - {id: s, engine: vllm, url: %q}\n", slow.srv.URL), "upstream_first_byte_timeout: 500ms\n"))
	start := time.Now()
	st, _, b = post(t, "http://"+g2.Addr()+"/v1/chat/completions", chatBody(true, 1, "x"))
	if st != 504 || !strings.Contains(string(b), "upstream_timeout") || time.Since(start) > 2*time.Second {
		t.Fatalf("first-byte timeout: %d after %v: %s", st, time.Since(start), b)
	}
	if n := slow.calls.Load(); n != 1 {
		t.Fatalf("engine calls %d, want 1", n)
	}
}

// Issue 10 (10): with client keys on, /metrics needs a token on the client port (or lives on
// metrics_listen only), and /readyz keeps its status code open but shows details (engine URLs, raw errors,
// the store) only with the admin token. Before the fix both were open with every detail.
func TestExposure(t *testing.T) {
	g := startGateway(t, gwYAML("      - {id: e0, engine: enginesim, url: \"http://127.0.0.1:1\"}\n", "client_api_keys_env: KVGATE_TEST_KEYS\n"))
	base := "http://" + g.Addr()
	if st, _, _ := getWith(t, base+"/metrics", ""); st != 401 {
		t.Errorf("/metrics without a token: %d", st)
	}
	if st, _, _ := getWith(t, base+"/metrics", "Bearer ck1"); st != 401 {
		t.Errorf("/metrics with a client key: %d", st)
	}
	if st, _, b := getWith(t, base+"/metrics", "Bearer admintok"); st != 200 || !strings.Contains(b, "kvgate_accept_errors_total") {
		t.Errorf("/metrics with the admin token: %d", st)
	}
	st, _, b := getWith(t, base+"/readyz", "")
	if st != 503 || strings.Contains(b, "127.0.0.1") || strings.Contains(b, "models") || !strings.Contains(b, `"ready":false`) {
		t.Errorf("/readyz without a token: %d %s", st, b)
	}
	st, _, b = getWith(t, base+"/readyz", "Bearer admintok")
	if st != 503 || !strings.Contains(b, `"models"`) || !strings.Contains(b, `"error"`) {
		t.Errorf("/readyz with the admin token: %d %s", st, b)
	}

	g2 := startGateway(t, gwYAML("      - {id: e0, engine: enginesim, url: \"http://127.0.0.1:1\"}\n", "metrics_listen: \"127.0.0.1:0\"\n"))
	if st, _, _ := getWith(t, "http://"+g2.Addr()+"/metrics", "Bearer admintok"); st != 404 {
		t.Errorf("/metrics on the client port with metrics_listen set: %d", st)
	}
	if st, _, b := getWith(t, "http://"+g2.MetricsAddr()+"/metrics", ""); st != 200 || !strings.Contains(b, "kvgate_accept_errors_total") {
		t.Errorf("/metrics on metrics_listen: %d", st)
	}
}

// Issue 10 (11): client-set routing headers, cookies and Connection-nominated headers never reach the
// engine; ambiguous framing (CL+TE, duplicate Content-Length, odd Transfer-Encoding values) is refused with
// 400 and the connection closed. Before the fix they were forwarded / accepted.
func TestHeaderHygieneAndFraming(t *testing.T) {
	seen := make(chan http.Header, 4)
	eng := newFakeEngine(t, 0, func(w http.ResponseWriter, r *http.Request, b []byte) {
		seen <- r.Header.Clone()
		okCompletion(w, r, b)
	})
	g := startGateway(t, gwYAML(fmt.Sprintf("      - {id: e, engine: vllm, url: %q}\n", eng.srv.URL), ""))
	st, _, b := post(t, "http://"+g.Addr()+"/v1/chat/completions", chatBody(false, 1, "x"),
		"X-Gateway-Destination-Endpoint", "10.0.0.9:8000", "X-Forwarded-Host", "evil", "X-Kvgate-Endpoint", "e",
		"Cookie", "session=secret", "Connection", "X-Secret-Hop", "X-Secret-Hop", "1", "X-Vendor", "kept")
	if st != 200 {
		t.Fatalf("%d %s", st, b)
	}
	h := <-seen
	for _, k := range []string{"X-Gateway-Destination-Endpoint", "X-Forwarded-Host", "X-Kvgate-Endpoint", "Cookie", "X-Secret-Hop"} {
		if v := h.Get(k); v != "" {
			t.Errorf("%s reached the engine: %q", k, v)
		}
	}
	if h.Get("X-Vendor") != "kept" {
		t.Errorf("an ordinary header was dropped: %v", h)
	}
	body := chatBody(false, 1, "x")
	for name, head := range map[string]string{
		"CL+TE":             fmt.Sprintf("Content-Length: %d\r\nTransfer-Encoding: chunked\r\n", len(body)),
		"duplicate CL":      fmt.Sprintf("Content-Length: %d\r\nContent-Length: %d\r\n", len(body), len(body)),
		"TE chunked\\t":     "Transfer-Encoding: chunked\t\r\n",
		"TE chunked,ident.": "Transfer-Encoding: chunked, identity\r\n",
	} {
		c := dial(t, g.Addr())
		msg := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + head + "\r\n"
		if strings.Contains(head, "chunked") {
			msg += fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body)
		} else {
			msg += body
		}
		io.WriteString(c, msg)
		r, closed := closedWithin(c, 3*time.Second)
		if !strings.HasPrefix(r, "HTTP/1.1 400") || !closed {
			t.Errorf("%s: closed=%v %q", name, closed, r)
		}
	}
	if n := eng.calls.Load(); n != 1 {
		t.Errorf("engine calls %d, want 1 (no framed-ambiguously request forwarded)", n)
	}
}

// Connection limits: over max_connections_per_ip (or max_connections) a new connection is closed at once
// and counted; behind a trusted proxy the cap applies to concurrent requests per X-Forwarded-For client.
func TestConnectionLimits(t *testing.T) {
	g := startGateway(t, gwYAML("      - {id: e0, engine: enginesim, url: \"http://127.0.0.1:1\"}\n",
		"max_connections_per_ip: 2\nclient_header_timeout: 5s\n"))
	a, b := dial(t, g.Addr()), dial(t, g.Addr())
	c := dial(t, g.Addr())
	if r, closed := closedWithin(c, 2*time.Second); !closed || r != "" {
		t.Fatalf("third connection from one address: closed=%v %q", closed, r)
	}
	a.Close()
	b.Close()
	// The server frees a and b's slots when it reads their close; until then a scrape may be refused too.
	if !waitFor(3*time.Second, func() bool {
		v, ok := tryScrape("http://"+g.Addr()+"/metrics", `kvgate_connections_rejected_total{reason="max_connections_per_ip"}`)
		return ok && v >= 1
	}) {
		t.Fatal("the refused connection was not counted")
	}

	// max_connections: the second open connection is closed at once and counted.
	g1 := startGateway(t, gwYAML("      - {id: e0, engine: enginesim, url: \"http://127.0.0.1:1\"}\n", "max_connections: 1\n"))
	first := dial(t, g1.Addr())
	if r, closed := closedWithin(dial(t, g1.Addr()), 2*time.Second); !closed || r != "" {
		t.Fatalf("connection over max_connections: closed=%v %q", closed, r)
	}
	first.Close()
	if !waitFor(3*time.Second, func() bool {
		v, ok := tryScrape("http://"+g1.Addr()+"/metrics", `kvgate_connections_rejected_total{reason="max_connections"}`)
		return ok && v >= 1
	}) {
		t.Fatal("the connection over max_connections was not counted")
	}

	release := make(chan struct{})
	eng := newFakeEngine(t, 0, func(w http.ResponseWriter, r *http.Request, b []byte) {
		if strings.Contains(string(b), "HOLD") {
			<-release
		}
		okCompletion(w, r, b)
	})
	defer close(release)
	g2 := startGateway(t, gwYAML(fmt.Sprintf("      - {id: e, engine: vllm, url: %q}\n", eng.srv.URL),
		"max_connections_per_ip: 1\ntrusted_proxies: [\"127.0.0.0/8\"]\n"))
	url := "http://" + g2.Addr() + "/v1/chat/completions"
	go func() {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(chatBody(false, 1, "HOLD")))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Forwarded-For", "10.0.0.1")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	if !waitFor(3*time.Second, func() bool { return eng.calls.Load() == 1 }) {
		t.Fatal("held request never reached the engine")
	}
	if st, _, b := post(t, url, chatBody(false, 1, "x"), "X-Forwarded-For", "10.0.0.1"); st != 429 {
		t.Fatalf("second request of one forwarded client: %d %s", st, b)
	}
	if st, _, b := post(t, url, chatBody(false, 1, "x"), "X-Forwarded-For", "10.0.0.2"); st != 200 {
		t.Fatalf("another forwarded client: %d %s", st, b)
	}
}
