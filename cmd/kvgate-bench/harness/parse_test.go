package harness

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/cmd/enginesim/sim"
)

func TestParseMetrics(t *testing.T) {
	page := `# HELP vllm:num_requests_running Number of requests.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="qwen3"} 3
enginesim:requests_total{model_name="qwen3",outcome="finished"} 10
enginesim:requests_total{model_name="qwen3",outcome="cancelled"} 2
odd{a="x\"y\\z\n",b="}"} 1.5e3
inf_metric +Inf
bare 7 1700000000000
`
	s, err := ParseMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Sum("vllm:num_requests_running"); got != 3 {
		t.Errorf("running %v", got)
	}
	if got := s.Sum("enginesim:requests_total"); got != 12 {
		t.Errorf("requests %v", got)
	}
	if got := s.Sum("enginesim:requests_total", "outcome", "cancelled"); got != 2 {
		t.Errorf("cancelled %v", got)
	}
	if got := s.Sum("odd", "a", "x\"y\\z\n", "b", "}"); got != 1500 {
		t.Errorf("escaped labels: %v (%+v)", got, s)
	}
	if got := s.Sum("bare"); got != 7 {
		t.Errorf("sample with timestamp: %v", got)
	}
	if s.Has("missing") || !s.Has("inf_metric") {
		t.Error("Has")
	}
	for _, bad := range []string{"novalue\n", `x{a="b} 1` + "\n", `x{a=b} 1` + "\n", "x{} abc\n"} {
		if _, err := ParseMetrics(strings.NewReader(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// The parser reads a real simulator's /metrics page, and the values move with a real request.
func TestParseMetricsFromSimulator(t *testing.T) {
	c := sim.DefaultConfig()
	c.Model, c.ServedModelNames, c.Host, c.TimeScale = "tiny", []string{"tiny"}, "127.0.0.1", 0
	e, err := sim.Start(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	resp, err := http.Post("http://"+e.HTTPAddr()+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"tiny","prompt":[1,2,3,4,5],"max_tokens":4}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	s, err := ScrapeMetrics(context.Background(), "http://"+e.HTTPAddr()+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Sum(MetricGenerationTokens); got != 4 {
		t.Errorf("%s = %v, want 4", MetricGenerationTokens, got)
	}
	if got := s.Sum(MetricPromptTokens); got != 5 {
		t.Errorf("%s = %v, want 5", MetricPromptTokens, got)
	}
	if got := s.Sum(MetricPeakRunning); got != 1 {
		t.Errorf("%s = %v, want 1", MetricPeakRunning, got)
	}
	if got := s.Sum(MetricRequests, "outcome", "finished"); got != 1 {
		t.Errorf("%s{outcome=finished} = %v, want 1", MetricRequests, got)
	}
}

func TestParseProcStat(t *testing.T) {
	line := []byte("4242 (kv gate) (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 8 0 123 0 0")
	d, err := ParseProcStat(line)
	if err != nil || d != 3250*time.Millisecond {
		t.Fatalf("ParseProcStat = %v, %v; want 3.25s", d, err)
	}
	for _, bad := range []string{"", "1 (x) S 1 2", "1 (x) S 1 2 3 4 5 6 7 8 9 -5 6"} {
		if _, err := ParseProcStat([]byte(bad)); !errors.Is(err, ErrProcStat) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	// This process's own line parses, and CPU time only grows.
	b, err := os.ReadFile("/proc/" + strconv.Itoa(os.Getpid()) + "/stat")
	if err != nil {
		t.Skip("no /proc")
	}
	if _, err := ParseProcStat(b); err != nil {
		t.Fatal(err)
	}
}

func FuzzParseProcStat(f *testing.F) {
	f.Add([]byte("1 (a) S 1 1 1 0 -1 0 0 0 0 0 5 6 0 0 20 0 1 0 1 0 0"))
	f.Fuzz(func(t *testing.T, line []byte) {
		d, err := ParseProcStat(line)
		if err == nil && d < 0 {
			t.Fatalf("negative CPU time %v from %q", d, line)
		}
	})
}
