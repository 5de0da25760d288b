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
	if err := run([]string{"--config", cfg, "--requests", "20", "--stores", "memory", "--policies", "three-tier,round-robin"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	s := out.String()
	t.Log("\n" + s)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`memory\s+1\.8k seen \+ 200 new\s+\d{4}\s+18\d\d\s`), // ~1.8k of ~2.1k tokens cached
		regexp.MustCompile(`memory\s+2k new\s+\d{4}\s+0\s`),
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
