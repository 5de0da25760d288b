package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--mode", "overhead", "--stores", "memory", "--requests", "50", "--policies", "a, b"})
	if err != nil {
		t.Fatal(err)
	}
	if o.mode != "overhead" || !slices.Equal(o.stores, []string{"memory"}) || o.requests != 50 ||
		!slices.Equal(o.policies, []string{"a", "b"}) {
		t.Fatalf("%+v", o)
	}
	for _, bad := range [][]string{{"--mode", "x"}, {"--stores", "etcd"}, {"--requests", "3"}, {"extra"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestQuantile(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i))
	}
	if q := quantile(ds, .5); q != 50 {
		t.Errorf("p50 %v", q)
	}
	if q := quantile(ds, .99); q != 99 {
		t.Errorf("p99 %v", q)
	}
	if q := quantile(nil, .5); q != 0 {
		t.Errorf("empty %v", q)
	}
}

func TestWithTokenIDs(t *testing.T) {
	b := withTokenIDs(chatBody("m", "sys", "hi", 1), []uint32{1, 2, 3})
	var m struct {
		Model    string           `json:"model"`
		Messages []map[string]any `json:"messages"`
		IDs      []uint32         `json:"prompt_token_ids"`
		Max      int              `json:"max_tokens"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m.Model != "m" || len(m.Messages) != 2 || !slices.Equal(m.IDs, []uint32{1, 2, 3}) || m.Max != 1 {
		t.Fatalf("%s", b)
	}
}

// The whole bench, small: real processes, both modes, memory store, two policies. It builds the binaries,
// so it is skipped with -short.
func TestRunSmall(t *testing.T) {
	t.Parallel() // waits on its own build, engines and gateways only; asserts shapes and plausibility, no latency bound
	if testing.Short() {
		t.Skip("builds and runs real processes")
	}
	cfg := filepath.Join(t.TempDir(), "base.yaml")
	// A user config: its policy config and timings are kept, its endpoints replaced.
	if err := os.WriteFile(cfg, []byte(`log_level: warn
scrape_interval: 200ms
models:
  - name: qwen3
    tokenizer: ../../examples/models/qwen3
    policy: {name: three-tier, config: {imbalance_threshold: 8}}
    endpoints:
      - {id: x, engine: enginesim, url: "http://127.0.0.1:1"}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run([]string{"--config", cfg, "--requests", "20", "--stores", "memory", "--policies", "three-tier,round-robin",
		"--quick", "--overhead-sizes", "2048", "--overhead-turns-to", "1500"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	s := out.String()
	t.Log("\n" + s)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`memory\s+2k seen\s+\d{4}\s+1\d{3}\s`), // ~1.8k of ~2k tokens cached
		regexp.MustCompile(`memory\s+2k fresh\s+\d{4}\s+\d{1,3}\s`),
		regexp.MustCompile(`oracle \(one infinite cache\)\s+0\.\d+\s+1\.00`),
		regexp.MustCompile(`three-tier\s+0\.\d+\s+\d\.\d\d\s+\d+/\d+/\d+/\d+`),
		regexp.MustCompile(`round-robin\s+0\.\d+\s+\d\.\d\d\s+5/5/5/5\s`), // 20 requests in rotation
	} {
		if !want.MatchString(s) {
			t.Errorf("report lacks %v", want)
		}
	}
	if strings.Contains(s, "error:") {
		t.Errorf("a policy failed")
	}
}

// TestOverheadEndToEnd runs --mode overhead small (memory store, 512- and 2k-token prompts, a 2.5k-token
// conversation) and checks its JSON report: every scenario present with plausible prompt sizes, cached
// tokens on the seen rows only, nonzero latencies and CPU per request, the nginx figures when nginx is
// installed, a multi-turn curve and one verdict per target.
func TestOverheadEndToEnd(t *testing.T) {
	t.Parallel() // waits on its own build, engines, gateway and nginx only; asserts shapes and plausibility, no latency bound
	if testing.Short() {
		t.Skip("builds and runs real processes")
	}
	jsonPath := filepath.Join(t.TempDir(), "overhead.json")
	var out bytes.Buffer
	start := time.Now()
	if err := run([]string{"--mode", "overhead", "--quick", "--stores", "memory", "--requests", "20",
		"--overhead-sizes", "512,2048", "--overhead-turns-to", "2500", "--overhead-out", jsonPath}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Logf("%s in %s", out.String(), time.Since(start).Round(time.Second))
	for _, want := range []string{"Gateway overhead", "Multi-turn", "machine: load average", "target kvgate CPU/request ≤ 3× nginx, short"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	data, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep overheadReport
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatal(err)
	}
	nginx := findNginx() != ""
	if (rep.Nginx != "") != nginx || rep.CPUs < 1 || rep.Machine.CPUs != rep.CPUs || !rep.Quick {
		t.Errorf("header: %+v", rep)
	}
	var names []string
	for _, r := range rep.Rows {
		names = append(names, r.Scenario)
		lo, hi := int64(r.TargetTokens)*6/10, int64(r.TargetTokens)*15/10
		if r.Store != "memory" || r.PromptTokens < lo || r.PromptTokens > hi {
			t.Errorf("%s: %d prompt tokens, want %d..%d", r.Scenario, r.PromptTokens, lo, hi)
		}
		if r.Seen && r.CachedTokens < r.PromptTokens/2 || !r.Seen && r.CachedTokens > r.PromptTokens/4 {
			t.Errorf("%s: %d of %d tokens cached", r.Scenario, r.CachedTokens, r.PromptTokens)
		}
		if r.DirectP50 <= 0 || r.GatewayP50 <= 0 || r.GatewayP99 < r.GatewayP50 || r.GatewayCPU <= 0 || r.GatewayCPU > 1e6 ||
			r.GatewayReqs < 5 || r.Rounds < 8 {
			t.Errorf("%s: implausible kvgate figures %+v", r.Scenario, r)
		}
		if nginx && (r.NginxP50 <= 0 || r.NginxCPU <= 0 || r.NginxCPU > 1e5 || r.NginxReqs < 5) {
			t.Errorf("%s: nginx installed but no plausible nginx figures %+v", r.Scenario, r)
		}
	}
	if want := []string{"short", "512 seen", "512 fresh", "2k seen", "2k fresh"}; !slices.Equal(names, want) {
		t.Errorf("scenarios %q, want %q", names, want)
	}
	if len(rep.Turns) < 2 || rep.Turns[len(rep.Turns)-1].PromptTokens < 2500 {
		t.Errorf("multi-turn curve %+v", rep.Turns)
	}
	for _, tr := range rep.Turns {
		if tr.NewTokens < 300 || tr.NewTokens > 1000 || tr.CPU <= 0 || tr.P50 <= 0 {
			t.Errorf("turns %s: %+v", tr.Turns, tr)
		}
	}
	if len(rep.Failed) > 0 {
		t.Errorf("failed scenarios: %q", rep.Failed)
	}
	if len(rep.Verdicts) != 4 {
		t.Fatalf("verdicts %+v", rep.Verdicts)
	}
	for _, v := range rep.Verdicts {
		ok := strings.HasPrefix(v.Result, "met") || strings.HasPrefix(v.Result, "NOT met") ||
			!nginx && strings.HasPrefix(v.Result, "not judged")
		if !ok || nginx && v.Value == "" {
			t.Errorf("verdict %+v", v)
		}
	}
}
