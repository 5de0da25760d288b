package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/cmd/enginesim/sim"
)

// The request metrics' labels, read from /metrics.

// metricsText returns the gateway's /metrics page, asked with the admin token (which /metrics takes when
// client keys are on, and ignores otherwise).
func metricsText(t *testing.T, g *Gateway) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+g.Addr()+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer admintok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// scrape returns the value of one sample of the gateway's /metrics (name and labels as exposed), or -1.
func scrape(t *testing.T, g *Gateway, sample string) float64 {
	t.Helper()
	for line := range strings.SplitSeq(metricsText(t, g), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return -1
}

// kvgate_requests_total never takes a client's model string as a label (unknown models count as "unknown"),
// counts the gateway's own 4xx answers, and counts a client that hangs up as 499, streaming or not, never as
// 502 or as the engine's 200.
func TestRequestMetricLabels(t *testing.T) {
	engines := startSims(t, 1, func(c *sim.Config) { c.TimeScale = 1; c.StepOverhead = 20 * time.Millisecond })
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), "max_body_bytes: 65536\n"))
	base := "http://" + g.Addr()
	for i := range 3 {
		if st, _, b := post(t, base+"/v1/chat/completions", fmt.Sprintf(`{"model":"client-string-%d","messages":[{"role":"user","content":"x"}]}`, i)); st != 404 {
			t.Fatalf("unknown model: %d %s", st, b)
		}
	}
	for _, body := range []string{`{"model":`, `{"model":"qwen3","messages":[{"role":"user","content":"x"}],"stream":"yes"}`,
		`{"model":"qwen3-lora","messages":[]}`, `{"model":"nope","messages":[]}`} {
		if st, _, b := post(t, base+"/v1/chat/completions", body); st != 400 {
			t.Fatalf("%s: %d %s", body, st, b)
		}
	}
	// The gateway answers 413 on the declared length without reading the body; its lingering close lets the
	// client, still writing, read the answer (gateway/RATIONALE.md "Why a lingering close, and why these bounds?").
	big, _ := http.NewRequest(http.MethodPost, base+"/v1/completions", strings.NewReader(`{"model":"qwen3","prompt":"`+strings.Repeat("a", 70000)+`"}`))
	big.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(big)
	if err != nil {
		t.Fatalf("large body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Fatalf("large body: %d", resp.StatusCode)
	}
	// Hang up on a stream after its first event, and on a non-streaming request while it generates.
	for _, stream := range []bool{true, false} {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions",
			strings.NewReader(fmt.Sprintf(`{"model":"qwen3","stream":%v,"max_tokens":2000,"messages":[{"role":"user","content":"write a long story"}]}`, stream)))
		req.Header.Set("Content-Type", "application/json")
		done := make(chan struct{})
		go func() {
			defer close(done)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				bufio.NewReader(resp.Body).ReadString('\n')
				cancel()
				resp.Body.Close()
			}
		}()
		if !waitFor(3*time.Second, func() bool { return engines[0].Stats().Running == 1 }) {
			t.Fatal("engine never started the request")
		}
		time.Sleep(150 * time.Millisecond)
		cancel()
		<-done
		want := 1.0
		if !stream {
			want = 2
		}
		if !waitFor(2*time.Second, func() bool {
			return scrape(t, g, `kvgate_requests_total{endpoint="e0",model="qwen3",status="499"}`) == want
		}) {
			t.Fatalf("stream=%v: 499 count %v, want %v", stream, scrape(t, g, `kvgate_requests_total{endpoint="e0",model="qwen3",status="499"}`), want)
		}
	}
	resp, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var series []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(line, "kvgate_requests_total{") {
			series = append(series, line)
		}
	}
	slices.Sort(series)
	want := []string{
		`kvgate_requests_total{endpoint="",model="qwen3",status="400"} 2`,
		`kvgate_requests_total{endpoint="",model="unknown",status="400"} 2`,
		`kvgate_requests_total{endpoint="",model="unknown",status="404"} 3`,
		`kvgate_requests_total{endpoint="",model="unknown",status="413"} 1`,
		`kvgate_requests_total{endpoint="e0",model="qwen3",status="499"} 2`,
	}
	if !slices.Equal(series, want) {
		t.Fatalf("series:\n%s\nwant:\n%s", strings.Join(series, "\n"), strings.Join(want, "\n"))
	}
}
