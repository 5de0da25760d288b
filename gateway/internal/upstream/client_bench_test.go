package upstream

import (
	"context"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkClientHop is one upstream hop's cost by client: this package's Client (its cancellation, timers
// and header rules over connTransport), the same Client over the net/http Transport it used before, a bare
// net/http Transport, and fasthttp's HostClient (no
// per-request cancellation), each posting a 1 KiB body to the same local fasthttp server answering 200
// bytes. cpu-ns/op is the process's CPU per request (server included, the same for all three): the
// differences are the clients'.
func BenchmarkClientHop(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	answer := make([]byte, 200)
	srv := &fasthttp.Server{Handler: func(c *fasthttp.RequestCtx) {
		c.SetContentType("application/json")
		c.SetBody(answer)
	}}
	go srv.Serve(ln)
	defer srv.Shutdown()
	base := "http://" + ln.Addr().String()
	body := make([]byte, 1024)
	hdr := http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"0123456789abcdef"}}
	run := func(b *testing.B, do func()) {
		for range 50 {
			do()
		}
		c0 := processCPU()
		b.ResetTimer()
		for b.Loop() {
			do()
		}
		b.ReportMetric(float64(processCPU()-c0)/float64(b.N), "cpu-ns/op")
	}
	post := func(b *testing.B, c *Client) {
		resp, err := c.Do(context.Background(), Request{BaseURL: base, Path: "/v1/chat/completions", Body: body, Header: hdr})
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	b.Run("upstream.Client", func(b *testing.B) {
		c := NewWithOptions(Options{ConnectTimeout: 5 * time.Second, IdleTimeout: time.Minute})
		run(b, func() { post(b, c) })
	})
	b.Run("upstream.Client/net-http-Transport", func(b *testing.B) {
		c := NewWithOptions(Options{ConnectTimeout: 5 * time.Second, IdleTimeout: time.Minute})
		c.hc = &http.Client{Transport: &http.Transport{ // the Transport Client used before connTransport
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        4096,
			MaxIdleConnsPerHost: 1024,
			IdleConnTimeout:     IdleConnTimeout,
			DisableCompression:  true,
			WriteBufferSize:     64 << 10,
			ReadBufferSize:      32 << 10,
		}}
		run(b, func() { post(b, c) })
	})
	b.Run("net/http", func(b *testing.B) {
		hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, DisableCompression: true}}
		run(b, func() {
			req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", bytesReader(body))
			req.Header = hdr.Clone()
			resp, err := hc.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	})
	b.Run("fasthttp.HostClient", func(b *testing.B) {
		hc := &fasthttp.HostClient{Addr: ln.Addr().String(), MaxConns: 16}
		run(b, func() {
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			req.SetRequestURI(base + "/v1/chat/completions")
			req.Header.SetMethod(http.MethodPost)
			for k, vs := range hdr {
				for _, v := range vs {
					req.Header.Add(k, v)
				}
			}
			req.SetBody(body)
			if err := hc.Do(req, resp); err != nil {
				b.Fatal(err)
			}
			fasthttp.ReleaseRequest(req)
			fasthttp.ReleaseResponse(resp)
		})
	})
}

type byteReader struct {
	b []byte
	i int
}

func (r *byteReader) Read(p []byte) (int, error) {
	if r.i >= len(r.b) {
		return 0, io.EOF
	}
	n := copy(p, r.b[r.i:])
	r.i += n
	return n, nil
}

func bytesReader(b []byte) io.Reader { return &byteReader{b: b} }
