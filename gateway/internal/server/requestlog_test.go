package server

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/gateway/internal/metrics"
)

func TestValidRequestID(t *testing.T) {
	for id, want := range map[string]bool{"": false, "abc-123_X.y:z/w+q=@": true, strings.Repeat("a", 128): true,
		strings.Repeat("a", 129): false, "has space": false, "semi;colon": false, "new\nline": false, "ünï": false,
		"0af7651916cd43dd8448eb211c80319c": true} {
		if got := ValidRequestID([]byte(id)); got != want {
			t.Errorf("ValidRequestID(%q) = %v", id, got)
		}
	}
	a, b := newRequestID(), newRequestID()
	if len(a) != 32 || a == b || !ValidRequestID([]byte(a)) {
		t.Fatalf("generated %q %q", a, b)
	}
}

// The stream tail finds the last usage event, also when earlier chunks carry "usage":null and the tail
// was cut in the middle of an older event.
func TestStreamTailUsage(t *testing.T) {
	var tl streamTail
	tl.add([]byte(strings.Repeat(`data: {"choices":[{"text":"x"}],"usage":null}`+"\n\n", 400)))
	tl.add([]byte(`data: {"choices":[],"usage":{"prompt_tokens":12,"total_tokens":17,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":8}}}` + "\n\ndata: [DONE]\n\n"))
	if u := tl.usage(); !u.ok || u.prompt != 12 || u.completion != 5 || u.cached != 8 {
		t.Fatalf("%+v", u)
	}
	var none streamTail
	none.add([]byte(`data: {"choices":[{"text":"x","finish_reason":"stop"}],"usage":null}` + "\n\ndata: [DONE]\n\n"))
	if u := none.usage(); u.ok {
		t.Fatalf("usage from a stream without one: %+v", u)
	}
	if n := tokenEvents([]byte("data: {}\n\ndata: {}\n\ndata: [DONE]\n\n")); n != 2 {
		t.Fatalf("token events %d", n)
	}
}

func benchServer(b *testing.B, accessLog string, h slog.Handler) *Server {
	cfg, err := config.Parse([]byte("access_log: " + accessLog + "\nmodels:\n  - name: m\n    tokenizer: x\n    endpoints:\n      - {id: e0, engine: vllm, url: \"http://127.0.0.1:1\"}\n"))
	if err != nil {
		b.Fatal(err)
	}
	return New(Options{Config: cfg, Metrics: metrics.New(), Log: slog.New(h)})
}

// BenchmarkRequestEnd is what the request ID and the access log add per request: a generated ID, the end
// of a finished stream (counters, the three histograms, usage) and, with access_log on, its JSON line
// (on: the LogHandler kvgate serve uses; on-slog: a plain slog JSON handler, the line encoded by slog).
func BenchmarkRequestEnd(b *testing.B) {
	for _, mode := range []string{"off", "on", "on-slog"} {
		b.Run("access_log="+mode, func(b *testing.B) {
			var h slog.Handler = NewLogHandler(io.Discard, nil)
			if mode == "on-slog" {
				h = slog.NewJSONHandler(io.Discard, nil)
			}
			s := benchServer(b, strings.TrimSuffix(mode, "-slog"), h)
			t0 := time.Now()
			b.ReportAllocs()
			for b.Loop() {
				ri := &reqInfo{id: newRequestID(), start: t0, model: "m", label: "m", endpoint: "e0", policy: "three-tier@0123456789ab",
					stream: true, chat: true, prompt: 1800, first: t0.Add(time.Millisecond), last: t0.Add(5 * time.Millisecond), events: 12,
					use: usage{prompt: 1800, cached: 1600, completion: 10, ok: true}}
				s.end(ri, 200)
			}
		})
	}
}

// The access line written by LogHandler's encoder is the line slog's JSON handler writes for the same
// request (time aside): same keys, order, escaping and float format, optional fields included or not.
func TestAccessLineMatchesSlog(t *testing.T) {
	cases := []accessLine{
		{id: "abc", model: "qwen3", endpoint: "e0", policy: "three-tier@0123456789ab", status: 200, stream: true,
			prompt: 1800, cached: 1600, completion: 10, ttft: 0.0012345, itl: 0.0000004, duration: 0.25, retries: 1},
		{id: "x", model: "q\"uo\\te\n\t\r\x01<&>\u2028\u2029é\xff", status: 400, duration: 1e-9},
		{id: "y", model: "m", status: 499, duration: 3, ttft: 1e21, completion: -1},
		{id: "z", status: 200, duration: 123456.789e-12, itl: 0.1 + 0.2},
	}
	for i, a := range cases {
		var fast, ref bytes.Buffer
		now := time.Date(2026, 12, 2, 14, 30, 1, 123456789, time.UTC)
		if !writeAccess(slog.New(NewLogHandler(&fast, nil)), now, &a) {
			t.Fatal("fast path not taken on a LogHandler")
		}
		attrs := []slog.Attr{slog.String("request_id", a.id), slog.String("model", a.model), slog.String("endpoint_id", a.endpoint),
			slog.String("policy", a.policy), slog.Int("status", a.status), slog.Bool("stream", a.stream),
			slog.Int64("prompt_tokens", a.prompt), slog.Int64("cached_tokens", a.cached), slog.Int64("completion_tokens", a.completion)}
		if a.ttft > 0 {
			attrs = append(attrs, slog.Float64("ttft_seconds", a.ttft))
		}
		if a.itl > 0 {
			attrs = append(attrs, slog.Float64("itl_seconds", a.itl))
		}
		attrs = append(attrs, slog.Float64("duration_seconds", a.duration), slog.Int("retries", a.retries))
		r := slog.NewRecord(now, slog.LevelInfo, "request", 0)
		r.AddAttrs(attrs...)
		if err := slog.NewJSONHandler(&ref, nil).Handle(context.Background(), r); err != nil {
			t.Fatal(err)
		}
		if fast.String() != ref.String() {
			t.Errorf("case %d:\nfast %s\nslog %s", i, fast.String(), ref.String())
		}
	}
	// A derived logger (With) is not the LogHandler itself: the caller logs through slog.
	if writeAccess(slog.New(NewLogHandler(io.Discard, nil)).With("k", "v"), time.Now(), &cases[0]) {
		t.Fatal("fast path taken on a derived logger")
	}
	// Below info nothing is written, and the fast path still answers for it.
	var quiet bytes.Buffer
	if !writeAccess(slog.New(NewLogHandler(&quiet, slog.LevelWarn)), time.Now(), &cases[0]) || quiet.Len() != 0 {
		t.Fatalf("wrote %q at warn level", quiet.String())
	}
}

// The ring keeps exactly the last streamTailMax bytes in order, whatever the sizes of the reads.
func TestStreamTailRing(t *testing.T) {
	var all []byte
	var tl streamTail
	for i, n := range []int{0, 1, 100, 8191, 3, 8192, 5000, 9000, 17, 4096, 4096, 1} {
		p := make([]byte, n)
		for j := range p {
			p[j] = byte('a' + (i*7+j)%26)
		}
		tl.add(p)
		all = append(all, p...)
		want := all[max(0, len(all)-streamTailMax):]
		if got := tl.bytes(); !bytes.Equal(got, want) {
			t.Fatalf("after %d reads (%d bytes): kept %d bytes, want the last %d", i+1, len(all), len(got), len(want))
		}
	}
}
