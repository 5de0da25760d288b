package upstream

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// connTransport is the http.RoundTripper under Client: HTTP/1.1 over a pool of keep-alive connections,
// where the calling goroutine writes the request and reads the response itself. net/http's Transport runs a
// write loop and a read loop goroutine per connection and hands every request and response between them
// and the caller (three goroutine wake-ups per request; on a 2-core machine at low concurrency each is a
// thread wake-up and a context switch). What it keeps of net/http's behaviour, because Client relies on it:
//   - the request's context ends the request at any time: context.AfterFunc closes exactly its connection,
//     which unblocks a pending write or read (an engine aborts a request whose connection closes);
//   - httptrace's GotConn (Reused, WasIdle) and WroteRequest (Err) hooks, which Client's retry rules read;
//   - a pooled connection the engine has closed is not used: before reuse a non-blocking MSG_PEEK on the
//     socket must find it open and silent (net/http's read loop notices the FIN in the background); the
//     race this cannot close is Client's stale-connection retry's;
//   - idle connections close after idleTimeout (a sweep timer runs while any is pooled);
//   - responses are parsed by http.ReadResponse (Content-Length, chunked, close-delimited bodies;
//     informational 1xx answers are skipped), and a body read to EOF returns its connection to the pool
//     unless either side said "Connection: close"; a body closed before EOF closes its connection.
//
// Only "http" and "https" URLs; https uses tlsConfig (nil: Go's defaults) with ALPN unset, so HTTP/1.1,
// as the net/http Transport it replaces was configured (ForceAttemptHTTP2 false). Request bodies of unknown
// length are read into memory and sent with a Content-Length. No proxy, no compression negotiation.
type connTransport struct {
	dialer         net.Dialer
	tlsConfig      *tls.Config
	idleTimeout    time.Duration
	maxIdlePerHost int
	maxIdle        int

	mu      sync.Mutex
	idle    map[string][]*pconn // per scheme://host:port, most recently used last
	nIdle   int
	sweep   *time.Timer
	closing bool
}

// pconn is one connection with its buffers.
type pconn struct {
	key       string
	conn      net.Conn // *tls.Conn for https
	raw       syscall.Conn
	br        *bufio.Reader
	bw        *bufio.Writer
	idleSince time.Time
}

func newConnTransport(o Options) *connTransport {
	return &connTransport{
		dialer:         net.Dialer{Timeout: o.ConnectTimeout, KeepAlive: 30 * time.Second},
		tlsConfig:      o.TLS,
		idleTimeout:    IdleConnTimeout,
		maxIdlePerHost: 1024,
		maxIdle:        4096,
		idle:           map[string][]*pconn{},
	}
}

// errScheme is RoundTrip's answer to a URL that is neither http nor https.
var errScheme = errors.New("upstream: unsupported URL scheme")

// RoundTrip sends req on a pooled or new connection and returns once the response headers are read.
func (t *connTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	u := req.URL
	if u.Scheme != "http" && u.Scheme != "https" {
		closeBody(req)
		return nil, fmt.Errorf("%w %q", errScheme, u.Scheme)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	addr := net.JoinHostPort(u.Hostname(), port)
	key := u.Scheme + "://" + addr
	trace := httptrace.ContextClientTrace(ctx)
	for attempt := 0; ; attempt++ {
		pc, reused, err := t.get(ctx, key, u.Scheme == "https", u.Hostname(), addr)
		if err != nil {
			closeBody(req)
			return nil, err
		}
		if trace != nil && trace.GotConn != nil {
			trace.GotConn(httptrace.GotConnInfo{Conn: pc.conn, Reused: reused, WasIdle: reused})
		}
		conn := pc.conn
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		err = pc.write(req)
		if trace != nil && trace.WroteRequest != nil {
			trace.WroteRequest(httptrace.WroteRequestInfo{Err: err})
		}
		var resp *http.Response
		if err == nil {
			resp, err = readResponse(pc.br, req)
		}
		if err == nil {
			resp.Body = &pconnBody{rc: resp.Body, pc: pc, t: t, ctx: ctx, stop: stop, keep: !resp.Close && !req.Close}
			return resp, nil
		}
		stop()
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// A pooled connection the engine closed while this request was sent (its idle timeout racing the
		// reuse; MSG_PEEK cannot see a FIN that is not there yet): a request without a body and with an
		// idempotent method is sent again on another connection, as net/http's Transport does. The scrapes
		// and health checks are such requests; a generation (a POST) is Client.Do's to retry or not.
		if !reused || attempt >= maxStaleRetries || !retryable(req) || !closedByPeer(err) {
			return nil, err
		}
	}
}

// retryable: an idempotent method (RFC 9110 §9.2.2) and no body to send again.
func retryable(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return req.Body == nil || req.Body == http.NoBody
	}
	return false
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// readResponse reads the next final response (informational 1xx answers other than 101 are skipped).
func readResponse(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	for {
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols || resp.StatusCode < 100 {
			return resp, nil
		}
	}
}

// write writes req's request line, headers and body, and flushes.
func (pc *pconn) write(req *http.Request) (err error) {
	defer closeBody(req)
	// A body of known length (Client's, a bytes.Reader) is copied straight into the connection's buffer;
	// only one of unknown length is read into memory first, to send its Content-Length.
	var body io.Reader
	size := req.ContentLength
	if req.Body != nil && req.Body != http.NoBody {
		body = req.Body
		if size <= 0 {
			b, err := io.ReadAll(req.Body)
			if err != nil {
				return err
			}
			body, size = bytes.NewReader(b), int64(len(b))
		}
	}
	w := pc.bw
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	w.WriteString(method)
	w.WriteByte(' ')
	w.WriteString(req.URL.RequestURI())
	w.WriteString(" HTTP/1.1\r\nHost: ")
	w.WriteString(host)
	w.WriteString("\r\n")
	ua := false
	for k, vs := range req.Header {
		switch http.CanonicalHeaderKey(k) {
		case "Host", "Content-Length", "Transfer-Encoding", "Connection", "Trailer":
			continue
		case "User-Agent":
			ua = true
		}
		if !validHeaderToken(k) {
			return fmt.Errorf("upstream: invalid header field name %q", k)
		}
		for _, v := range vs {
			if !validHeaderValue(v) {
				return fmt.Errorf("upstream: invalid header field value for %q", k)
			}
			w.WriteString(k)
			w.WriteString(": ")
			w.WriteString(v)
			w.WriteString("\r\n")
		}
	}
	if !ua {
		w.WriteString("User-Agent: Go-http-client/1.1\r\n")
	}
	if req.Close {
		w.WriteString("Connection: close\r\n")
	}
	if body != nil || (method != http.MethodGet && method != http.MethodHead) {
		w.WriteString("Content-Length: ")
		w.WriteString(strconv.FormatInt(max(size, 0), 10))
		w.WriteString("\r\n")
	}
	w.WriteString("\r\n")
	if body != nil {
		n, err := io.Copy(w, body)
		if err != nil {
			return err
		}
		if n != size {
			return fmt.Errorf("upstream: request body of %d bytes, Content-Length %d", n, size)
		}
	}
	return w.Flush()
}

// validHeaderToken: an RFC 9110 token (no separators, controls or spaces).
func validHeaderToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// validHeaderValue: no CR, LF or NUL (the bytes that would split or end a header).
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '\r' || c == '\n' || c == 0 {
			return false
		}
	}
	return true
}

// get takes the most recently pooled live connection for key, or dials one.
func (t *connTransport) get(ctx context.Context, key string, https bool, host, addr string) (*pconn, bool, error) {
	for {
		t.mu.Lock()
		list := t.idle[key]
		if len(list) == 0 {
			t.mu.Unlock()
			break
		}
		pc := list[len(list)-1]
		list[len(list)-1] = nil
		t.idle[key] = list[:len(list)-1]
		t.nIdle--
		t.mu.Unlock()
		if time.Since(pc.idleSince) < t.idleTimeout && pc.alive() {
			return pc, true, nil
		}
		pc.conn.Close()
	}
	conn, err := t.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, false, err
	}
	raw, _ := conn.(syscall.Conn)
	if https {
		cfg := t.tlsConfig.Clone()
		if cfg == nil {
			cfg = &tls.Config{}
		}
		if cfg.ServerName == "" {
			cfg.ServerName = host
		}
		tc := tls.Client(conn, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, false, err
		}
		conn = tc
	}
	return &pconn{key: key, conn: conn, raw: raw, br: bufio.NewReaderSize(conn, 32<<10), bw: bufio.NewWriterSize(conn, 64<<10)}, false, nil
}

// alive reports whether an idle connection is still open with nothing to read: the engine has not closed
// it (no FIN) and sent nothing (a stray byte or a TLS alert on an idle connection means it is unusable).
func (pc *pconn) alive() bool {
	if pc.br.Buffered() > 0 {
		return false
	}
	if pc.raw == nil {
		return true
	}
	rc, err := pc.raw.SyscallConn()
	if err != nil {
		return false
	}
	var buf [1]byte
	ok := false
	if err := rc.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		ok = err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
		return true
	}); err != nil {
		return false
	}
	return ok
}

// put pools pc (or closes it when the pool is full or closing).
func (t *connTransport) put(pc *pconn) {
	pc.idleSince = time.Now()
	t.mu.Lock()
	if t.closing || len(t.idle[pc.key]) >= t.maxIdlePerHost || t.nIdle >= t.maxIdle {
		t.mu.Unlock()
		pc.conn.Close()
		return
	}
	t.idle[pc.key] = append(t.idle[pc.key], pc)
	t.nIdle++
	if t.sweep == nil {
		t.sweep = time.AfterFunc(t.idleTimeout, t.sweepIdle)
	}
	t.mu.Unlock()
}

// sweepIdle closes connections idle for idleTimeout and runs again while any stays pooled.
func (t *connTransport) sweepIdle() {
	var old []*pconn
	t.mu.Lock()
	now := time.Now()
	for k, list := range t.idle {
		keep := list[:0]
		for _, pc := range list {
			if now.Sub(pc.idleSince) >= t.idleTimeout {
				old = append(old, pc)
			} else {
				keep = append(keep, pc)
			}
		}
		clear(list[len(keep):])
		if len(keep) == 0 {
			delete(t.idle, k)
		} else {
			t.idle[k] = keep
		}
	}
	t.nIdle -= len(old)
	t.sweep = nil
	if t.nIdle > 0 && !t.closing {
		t.sweep = time.AfterFunc(t.idleTimeout/2, t.sweepIdle)
	}
	t.mu.Unlock()
	for _, pc := range old {
		pc.conn.Close()
	}
}

// CloseIdleConnections closes every pooled connection (http.Client.CloseIdleConnections calls it).
func (t *connTransport) CloseIdleConnections() {
	t.mu.Lock()
	var all []*pconn
	for _, list := range t.idle {
		all = append(all, list...)
	}
	clear(t.idle)
	t.nIdle = 0
	t.mu.Unlock()
	for _, pc := range all {
		pc.conn.Close()
	}
}

// pconnBody is a response body on a pooled connection. Read and Close may run concurrently (the idle
// timeout closes a body another goroutine reads): exactly one of "read to EOF" and "closed" decides the
// connection's fate.
type pconnBody struct {
	rc    io.ReadCloser
	pc    *pconn
	t     *connTransport
	ctx   context.Context
	stop  func() bool
	keep  bool
	state atomic.Int32 // bodyOpen, bodyEOF or bodyClosed
}

const (
	bodyOpen int32 = iota
	bodyEOF
	bodyClosed
)

// errBodyClosed is a read after Close (net/http says the same).
var errBodyClosed = errors.New("http: read on closed response body")

func (b *pconnBody) Read(p []byte) (int, error) {
	switch b.state.Load() {
	case bodyEOF:
		return 0, io.EOF
	case bodyClosed:
		return 0, errBodyClosed
	}
	n, err := b.rc.Read(p)
	switch {
	case err == io.EOF:
		if b.state.CompareAndSwap(bodyOpen, bodyEOF) {
			if b.stop() && b.keep {
				b.t.put(b.pc) // the context can no longer close it
			} else {
				b.pc.conn.Close()
			}
		}
	case err != nil && b.ctx.Err() != nil:
		err = b.ctx.Err()
	}
	return n, err
}

// Close closes the connection unless the body was read to its end (then it is already pooled).
func (b *pconnBody) Close() error {
	if b.state.CompareAndSwap(bodyOpen, bodyClosed) {
		b.stop()
		b.pc.conn.Close()
	} else {
		b.state.CompareAndSwap(bodyEOF, bodyClosed)
	}
	return nil
}
