package server

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/gateway/metrics"
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

func benchServer(b *testing.B, accessLog string) *Server {
	cfg, err := config.Parse([]byte("access_log: " + accessLog + "\nmodels:\n  - name: m\n    tokenizer: x\n    endpoints:\n      - {id: e0, engine: vllm, url: \"http://127.0.0.1:1\"}\n"))
	if err != nil {
		b.Fatal(err)
	}
	return New(Options{Config: cfg, Metrics: metrics.New(), Log: slog.New(slog.NewJSONHandler(io.Discard, nil))})
}

// BenchmarkRequestEnd is what the request ID and the access log add per request: a generated ID, the end
// of a finished stream (counters, the three histograms, usage) and, with access_log on, its JSON line.
func BenchmarkRequestEnd(b *testing.B) {
	for _, mode := range []string{"off", "on"} {
		b.Run("access_log="+mode, func(b *testing.B) {
			s := benchServer(b, mode)
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
