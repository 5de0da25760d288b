package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go"
	"github.com/openai/openai-go/option"
)

// slowBody is a request body of n bytes handed out chunk bytes per Read with a pause between reads, so that
// the client is still writing it when the gateway answers on the headers. It is the inside of a JSON string
// after the prefix, closed by the suffix.
type slowBody struct {
	prefix, suffix string
	n, chunk, sent int
	pause          time.Duration
}

func (b *slowBody) Read(p []byte) (int, error) {
	total := len(b.prefix) + b.n + len(b.suffix)
	if b.sent >= total {
		return 0, io.EOF
	}
	if b.sent > 0 && b.pause > 0 {
		time.Sleep(b.pause)
	}
	k := 0
	for k < len(p) && k < b.chunk && b.sent < total {
		switch {
		case b.sent < len(b.prefix):
			p[k] = b.prefix[b.sent]
		case b.sent < len(b.prefix)+b.n:
			p[k] = 'a'
		default:
			p[k] = b.suffix[b.sent-len(b.prefix)-b.n]
		}
		k++
		b.sent++
	}
	return k, nil
}

func (b *slowBody) size() int64 { return int64(len(b.prefix) + b.n + len(b.suffix)) }

// errorShape decodes an OpenAI error body and returns its code, or the body when it is not one.
func errorShape(body []byte) string {
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil || e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == nil {
		return "not an OpenAI error: " + string(body)
	}
	return *e.Error.Code
}

// A client still writing a large body when the gateway answers on the headers (a wrong key: 401; a
// declared length over max_body_bytes: 413) reads that answer, in the OpenAI error shape, instead of a
// connection reset: the gateway half-closes and reads and discards the rest of the body (lingering close,
// gateway/RATIONALE.md) before closing. Before the lingering close the gateway closed with the body still
// arriving, Linux reset the connection, and net/http and openai-go returned ECONNRESET/EPIPE, the
// write error winning the race with the answer.
func TestAnswerBeforeBodyReachesWritingClient(t *testing.T) {
	engines := startSims(t, 1, nil)
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), "client_api_keys_env: KVGATE_TEST_KEYS\nmax_body_bytes: 1048576\n"))
	base := "http://" + g.Addr()
	cases := []struct {
		name, key string
		status    int
		code      string
	}{
		{"wrong key", "Bearer wrong", 401, "invalid_api_key"},
		{"declared length over max_body_bytes", "Bearer ck1", 413, "request_too_large"},
	}
	for i := range 2 * len(cases) {
		// Each case twice: the body as one 20 MB buffer (written as fast as the socket takes it), then 8 MB
		// handed out 256 KB at a time with a millisecond's pause.
		tc, paced := cases[i/2], i%2 == 1
		var body io.Reader
		var size int64
		if paced {
			sb := &slowBody{prefix: `{"model":"qwen3","prompt":"`, suffix: `"}`, n: 8 << 20, chunk: 256 << 10, pause: time.Millisecond}
			body, size = sb, sb.size()
		} else {
			b := []byte(`{"model":"qwen3","prompt":"` + strings.Repeat("a", 20<<20) + `"}`)
			body, size = bytes.NewReader(b), int64(len(b))
		}
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions", body)
		req.ContentLength = size
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", tc.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s, paced %v: net/http: %v", tc.name, paced, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || errorShape(b) != tc.code {
			t.Fatalf("%s, paced %v: net/http: %d %s, want %d %s", tc.name, paced, resp.StatusCode, b, tc.status, tc.code)
		}
	}
	// The official client, sending a 20 MB chat body as fast as it can.
	for _, tc := range []struct {
		key    string
		status int
		code   string
	}{{"wrong", 401, "invalid_api_key"}, {"ck1", 413, "request_too_large"}} {
		c := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey(tc.key), option.WithMaxRetries(0))
		_, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "qwen3",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat("lorem ipsum ", 20<<20/12))}})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) {
			t.Fatalf("openai-go, key %q: want a %d API error, got %v", tc.key, tc.status, err)
		}
		if apiErr.StatusCode != tc.status || apiErr.Code != tc.code || apiErr.Message == "" {
			t.Fatalf("openai-go, key %q: %d code %q %q, want %d %s", tc.key, apiErr.StatusCode, apiErr.Code, apiErr.Message, tc.status, tc.code)
		}
	}
	// Nothing lingers on once the clients are gone.
	if !waitFor(5*time.Second, func() bool { return scrape(t, g, "kvgate_connections_lingering") == 0 }) {
		t.Fatalf("kvgate_connections_lingering = %v after the clients closed", scrape(t, g, "kvgate_connections_lingering"))
	}
	if v := scrape(t, g, `kvgate_lingering_closes_total{result="eof"}`); v < 1 {
		t.Errorf("lingering closes ended by the client's close: %v, want at least 1", v)
	}
}

// A lingering connection is bounded: a client that neither sends nor closes is closed after
// client_lingering_time, one that keeps sending after client_lingering_bytes, and over
// max_lingering_connections a connection is closed at once (the old behaviour), counted as skipped.
func TestLingeringIsBounded(t *testing.T) {
	engines := startSims(t, 1, nil)
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), "client_api_keys_env: KVGATE_TEST_KEYS\n"+
		"client_lingering_time: 400ms\nclient_lingering_bytes: 1048576\nmax_lingering_connections: 2\n"))
	addr := g.Addr()
	refuse := func(c net.Conn) {
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\nContent-Length: 64000000\r\n\r\n{\"model\":")
	}
	// Two silent clients fill the lingering slots; each reads its 401 and then the gateway's FIN.
	silent := []net.Conn{dial(t, addr), dial(t, addr)}
	for _, c := range silent {
		refuse(c)
		if r, closed := closedWithin(c, 5*time.Second); !strings.HasPrefix(r, "HTTP/1.1 401") || !closed {
			t.Fatalf("silent client: closed=%v %q", closed, r)
		}
	}
	if v := scrape(t, g, "kvgate_connections_lingering"); v != 2 {
		t.Fatalf("lingering connections: %v, want 2", v)
	}
	// A third is over max_lingering_connections: closed at once.
	c3 := dial(t, addr)
	refuse(c3)
	if r, closed := closedWithin(c3, 5*time.Second); !strings.HasPrefix(r, "HTTP/1.1 401") || !closed {
		t.Fatalf("third client: closed=%v %q", closed, r)
	}
	if v := scrape(t, g, `kvgate_lingering_closes_total{result="skipped"}`); v != 1 {
		t.Fatalf("skipped lingering closes: %v, want 1", v)
	}
	// The silent ones are closed after client_lingering_time.
	if !waitFor(5*time.Second, func() bool { return scrape(t, g, "kvgate_connections_lingering") == 0 }) {
		t.Fatalf("silent clients still lingering: %v", scrape(t, g, "kvgate_connections_lingering"))
	}
	if v := scrape(t, g, `kvgate_lingering_closes_total{result="time"}`); v != 2 {
		t.Fatalf("lingering closes ended by client_lingering_time: %v, want 2", v)
	}
	// A client that keeps sending is closed after client_lingering_bytes: its writes fail long before the
	// declared 64 MB (plus what the socket buffers hold) are all sent.
	c4 := dial(t, addr)
	refuse(c4)
	sent := make(chan int, 1)
	go func() {
		chunk := []byte(strings.Repeat("a", 64<<10))
		total := 0
		for total < 64000000 {
			c4.SetWriteDeadline(time.Now().Add(10 * time.Second))
			n, err := c4.Write(chunk)
			total += n
			if err != nil {
				break
			}
		}
		sent <- total
	}()
	if r, closed := closedWithin(c4, 5*time.Second); !strings.HasPrefix(r, "HTTP/1.1 401") || !closed {
		t.Fatalf("sending client: closed=%v %q", closed, r)
	}
	if total := <-sent; total >= 64000000 {
		t.Fatalf("the client sent all %d bytes: the lingering read was not bounded", total)
	}
	if !waitFor(5*time.Second, func() bool { return scrape(t, g, `kvgate_lingering_closes_total{result="bytes"}`) == 1 }) {
		t.Fatalf("lingering closes ended by client_lingering_bytes: %v, want 1", scrape(t, g, `kvgate_lingering_closes_total{result="bytes"}`))
	}
	if !waitFor(5*time.Second, func() bool { return scrape(t, g, "kvgate_connections_open") == 1 }) { // the scrape's own
		t.Fatalf("open connections: %v, want 1 (the scrape)", scrape(t, g, "kvgate_connections_open"))
	}
}

// Closing the gateway ends its lingering closes at once: Close does not wait out client_lingering_time, and
// no lingering goroutine is left behind.
func TestCloseEndsLingering(t *testing.T) {
	engines := startSims(t, 1, nil)
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), "client_api_keys_env: KVGATE_TEST_KEYS\nclient_lingering_time: 1m\n"))
	c := dial(t, g.Addr())
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\nContent-Length: 10000000\r\n\r\n{\"model\":")
	if r, closed := closedWithin(c, 5*time.Second); !strings.HasPrefix(r, "HTTP/1.1 401") || !closed {
		t.Fatalf("closed=%v %q", closed, r)
	}
	if v := scrape(t, g, "kvgate_connections_lingering"); v != 1 {
		t.Fatalf("lingering connections: %v, want 1", v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	g.Close(ctx)
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("Close took %v: it waited for the lingering connection", d)
	}
	buf := make([]byte, 1<<20)
	if st := string(buf[:runtime.Stack(buf, true)]); strings.Contains(st, "limitConn).drain") {
		t.Fatalf("a lingering goroutine outlived Close:\n%s", st)
	}
}

// The lingering close works on a TLS listener too (the mark reaches the TCP connection under tls.Conn):
// openai-go over TLS writing a 20 MB body with a wrong key reads the 401.
func TestAnswerBeforeBodyOverTLS(t *testing.T) {
	engines := startSims(t, 1, nil)
	ca := newTestCA(t)
	certFile, keyFile := ca.issue(t, "listener", 100)
	g, err := startGatewayEnv(t, gwYAML(simEndpointsYAML(engines, 64), fmt.Sprintf("client_api_keys_env: KVGATE_TEST_KEYS\ntls: {cert_file: %q, key_file: %q}\n", certFile, keyFile)), nil)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool()}}}
	c := openai.NewClient(option.WithBaseURL("https://"+g.Addr()+"/v1"), option.WithAPIKey("wrong"), option.WithMaxRetries(0),
		option.WithHTTPClient(hc))
	_, err = c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "qwen3",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat("lorem ipsum ", 20<<20/12))}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Code != "invalid_api_key" {
		t.Fatalf("openai-go over TLS: want a 401 invalid_api_key, got %v", err)
	}
}
