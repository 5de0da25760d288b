package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/cmd/kvgate-bench/harness"
	"github.com/kvgate/kvgate/gateway/textmodel"
)

func qwen3(t *testing.T) *textmodel.Model {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	m, err := textmodel.Load(filepath.Join(root, "examples", "models", "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestParseCompareFlags(t *testing.T) {
	o, err := parseFlags([]string{"--sim", "8", "--quick", "--out", "x", "--loads", "0.8,1.5,2", "--seeds", "1,2"})
	if err != nil {
		t.Fatal(err)
	}
	if o.mode != "compare" || o.cmp.sim != 8 || !o.cmp.quick || !slices.Equal(o.cmp.loads, []float64{0.8, 1.5, 2}) ||
		!slices.Equal(o.cmp.seeds, []uint64{1, 2}) || o.cmp.api != "chat" || o.cmp.arrival != "rate" {
		t.Fatalf("%+v", o.cmp)
	}
	o, err = parseFlags([]string{"--sim", "2", "--workload", "trace"})
	if err != nil || o.cmp.api != "completions" || o.cmp.arrival != "trace" {
		t.Fatalf("trace defaults: %+v %v", o.cmp, err)
	}
	for _, bad := range [][]string{
		{"--sim", "2", "--gateway", "http://x"}, {"--mode", "compare"}, {"--gateway", "http://x", "--direct"},
		{"--sim", "2", "--loads", "0"}, {"--sim", "2", "--workload", "nope"}, {"--sim", "2", "--arrival", "trace"},
		{"--sim", "2", "--arrival", "closed"}, {"--sim", "2", "--block-tokens", "600"}, {"--sim", "2", "--api", "x"},
	} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestBlockCacheAndOracle(t *testing.T) {
	a := []uint32{1, 2, 3, 4, 5, 6, 7}
	b := []uint32{1, 2, 3, 4, 9, 9, 9}
	ka, kb := blockChain(a, 2), blockChain(b, 2)
	if len(ka) != 3 || ka[0] != kb[0] || ka[1] != kb[1] || ka[2] == kb[2] {
		t.Fatalf("chains %v %v", ka, kb)
	}
	// Block keys chain: equal block 1 contents after different block 0 differ.
	if c := blockChain([]uint32{0, 0, 3, 4}, 2); c[1] == ka[1] {
		t.Fatal("block key ignores its parent")
	}
	lru := newBlockCache(3)
	lru.Add(ka)
	if lru.Hits(kb) != 2 {
		t.Fatalf("hits %d", lru.Hits(kb))
	}
	lru.Add(kb[2:]) // evicts the least recent: a's tail block, not its head
	if lru.Hits(ka) != 2 || lru.Hits(kb) != 3 {
		t.Fatalf("after eviction: a %d b %d", lru.Hits(ka), lru.Hits(kb))
	}
	s := time.Second
	reqs := []oracleRequest{
		{Start: 0, Finish: 3 * s, Prompt: a, Answer: []uint32{8}, OK: true},
		{Start: s, Finish: 2 * s, Prompt: b, OK: true},
		{Start: 4 * s, Finish: 5 * s, Prompt: []uint32{1, 2, 3, 4, 5, 6, 7, 8, 0}, OK: true}, // hits a's answer block
		{Start: 6 * s, Prompt: []uint32{5, 5}, OK: false},
		{Start: 7 * s, Finish: 8 * s, Prompt: []uint32{5, 5, 1}, OK: true}, // the refused one cached nothing
	}
	got := oracleCached(reqs, 2, 100)
	if !slices.Equal(got.Infinite, []int64{0, 4, 8, 0, 0}) {
		t.Fatalf("infinite %v", got.Infinite)
	}
	got = oracleCached(reqs, 2, 1) // one block: only the last one added survives
	if !slices.Equal(got.LRU, []int64{0, 2, 2, 0, 0}) {
		t.Fatalf("lru %v", got.LRU)
	}
}

// Trace blocks: equal hash IDs give equal tokens (block for block, with the real tokenizer), the last
// block is cut to the scaled length, and the text of n blocks is n × block-tokens tokens.
func TestTraceWorkloadTokens(t *testing.T) {
	m := qwen3(t)
	src, err := newTextSource(m)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := readTrace(strings.NewReader(`{"timestamp": 0, "input_length": 1500, "output_length": 100, "hash_ids": [7, 8, 9]}

{"timestamp": 250, "input_length": 1100, "output_length": 3, "hash_ids": [7, 8, 4]}
{"timestamp": 900, "input_length": 600, "output_length": 40, "hash_ids": [5, 8]}
`))
	if err != nil {
		t.Fatal(err)
	}
	const bt = 32
	w := traceWorkload(src, recs, bt, 64, 1, 0)
	if w.Requests() != 3 || !w.Timed || w.Sessions[2].At != 900*time.Millisecond {
		t.Fatalf("%+v", w)
	}
	ids := make([][]uint32, 3)
	for i, s := range w.Sessions {
		ids[i] = m.EncodeCompletion(s.System + s.Turns[0].User)
	}
	// 1500 × 32/512 = 93.75 → 94 tokens: two blocks and 30.
	if len(ids[0]) != 94 || len(ids[1]) != 69 || len(ids[2]) != 38 {
		t.Fatalf("lengths %d %d %d", len(ids[0]), len(ids[1]), len(ids[2]))
	}
	if !slices.Equal(ids[0][:2*bt], ids[1][:2*bt]) || slices.Equal(ids[0][2*bt:69], ids[1][2*bt:69]) {
		t.Fatal("equal hash IDs do not give equal tokens (or different ones do)")
	}
	// Hash 8 after 5 is the same text as hash 8 after 7 (Mooncake IDs name whole prefixes, so this does
	// not happen in a real trace; the text is still per ID).
	if !slices.Equal(ids[0][bt:bt+6], ids[2][bt:]) || slices.Equal(ids[0][:bt], ids[2][:bt]) {
		t.Fatal("block text is not a function of its hash ID")
	}
	if w.Sessions[0].Turns[0].MaxTokens != 6 || w.Sessions[1].Turns[0].MaxTokens != 1 {
		t.Fatalf("output scaling: %d %d", w.Sessions[0].Turns[0].MaxTokens, w.Sessions[1].Turns[0].MaxTokens)
	}
	for _, bad := range []string{`{"timestamp":0,"input_length":600,"output_length":1,"hash_ids":[1]}`,
		`{"timestamp":0,"input_length":0,"output_length":1,"hash_ids":[]}`, `{"timestamp":0,"x":1}`, ``} {
		if _, err := readTrace(strings.NewReader(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestGeneratedTrace(t *testing.T) {
	recs := generateTrace(traceGenQuick, 3)
	if len(recs) != traceGenQuick.Requests {
		t.Fatalf("%d records", len(recs))
	}
	var buf bytes.Buffer
	if err := writeTrace(&buf, recs); err != nil {
		t.Fatal(err)
	}
	back, err := readTrace(&buf) // the generator's output passes the reader's checks
	if err != nil {
		t.Fatal(err)
	}
	shared := 0
	first := map[int64]bool{}
	for i, r := range back {
		if i > 0 && r.Timestamp < back[i-1].Timestamp {
			t.Fatal("not in timestamp order")
		}
		if first[r.HashIDs[0]] {
			shared++
		}
		first[r.HashIDs[0]] = true
	}
	if shared < len(back)/2 {
		t.Fatalf("only %d of %d requests share a first block", shared, len(back))
	}
	if !slices.EqualFunc(recs, generateTrace(traceGenQuick, 3), func(a, b traceRecord) bool {
		return a.Timestamp == b.Timestamp && slices.Equal(a.HashIDs, b.HashIDs)
	}) {
		t.Fatal("generator is not deterministic")
	}
}

// The quick comparison, tiny: real gateway and engines, two policies, two loads, results.json checked.
// It builds the binaries, so it is skipped with -short.
func TestCompareEndToEnd(t *testing.T) {
	t.Parallel() // waits on its own build, engines and gateways only; asserts shapes and plausibility, no latency bound
	if testing.Short() {
		t.Skip("builds and runs real processes")
	}
	out := t.TempDir()
	var log bytes.Buffer
	err := run([]string{"--sim", "2", "--quick", "--out", out, "--groups", "4", "--users", "3", "--loads", "0.8,2",
		"--policies", "three-tier,round-robin", "--direct", "--progress=false"}, &log)
	t.Log("\n" + log.String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	if err := json.Unmarshal(b, &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 6 { // (2 policies + direct) × 2 loads
		t.Fatalf("%d rows", len(rows))
	}
	for _, r := range rows {
		for _, k := range []string{"policy", "load", "requests", "errors", "ttft_p50_seconds", "ttft_p90_seconds",
			"hit_rate", "oracle_hit_rate", "throughput_rps", "max_over_mean_requests"} {
			if _, ok := r[k]; !ok {
				t.Fatalf("row lacks %s: %v", k, r)
			}
		}
		num := func(k string) float64 { return r[k].(float64) }
		if num("requests") != 12 || num("errors") != 0 || num("completed") != 12 {
			t.Errorf("%v load %v: requests %v errors %v", r["policy"], r["load"], r["requests"], r["errors"])
		}
		if l := num("load"); l != 0.8 && l != 2 {
			t.Errorf("load %v", l)
		}
		if h, o := num("hit_rate"), num("oracle_hit_rate"); h < 0 || o > 1 || h > o+1e-9 || o < 0.3 {
			t.Errorf("%v: hit rate %v, oracle %v", r["policy"], h, o)
		}
		if lru := num("lru_ceiling_hit_rate"); lru > num("oracle_hit_rate")+1e-9 {
			t.Errorf("LRU ceiling %v above the oracle", lru)
		}
		if p50, p90 := num("ttft_p50_seconds"), num("ttft_p90_seconds"); p50 <= 0 || p90 < p50 {
			t.Errorf("TTFT p50 %v p90 %v", p50, p90)
		}
		if m := num("max_over_mean_requests"); m < 1 || m > 2 {
			t.Errorf("max/mean %v", m)
		}
		if tp := num("throughput_rps"); tp <= 0 || math.IsInf(tp, 0) {
			t.Errorf("throughput %v", tp)
		}
		// The engines' prompt tokens are the oracle's: the bench tokenizes exactly as they do.
		per := r["requests_per_endpoint"].(map[string]any)
		if len(per) != 2 {
			t.Errorf("endpoints %v", per)
		}
		if r["policy"] == "direct-round-robin" {
			if per["e0"].(float64) != 6 || per["e1"].(float64) != 6 {
				t.Errorf("direct rotation %v", per)
			}
		}
	}
	for _, f := range []string{"report.md", "timeseries.json", "charts/shared-prefix_ttft_cdf_load2.png",
		"charts/shared-prefix_hit_vs_oracle.png"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	rep, _ := os.ReadFile(filepath.Join(out, "report.md"))
	if !strings.Contains(string(rep), "| three-tier | 12 | 0 | 0 |") {
		t.Errorf("report lacks three-tier's row:\n%s", rep)
	}
}

func TestClassifyMisses(t *testing.T) {
	s := time.Second
	ok := func(g int, ep string, start, finish time.Duration, cached int64) *record {
		return &record{Group: g, Endpoint: ep, Start: start, Finish: finish, Status: 200, CachedTokens: cached}
	}
	recs := []*record{
		ok(1, "a", 0, 5*s, 0),                                 // first of group 1: not short (the oracle has nothing either)
		ok(1, "a", 1*s, 2*s, 0),                               // a's only group-1 request is still running: in flight
		ok(1, "b", 3*s, 4*s, 0),                               // b never served group 1: moved
		ok(1, "a", 6*s, 7*s, 0),                               // a answered group 1 before: evicted
		ok(1, "a", 8*s, 9*s, 96),                              // got what the oracle got: not short
		ok(2, "b", 9*s, 10*s, 0),                              // first of group 2
		{Group: 2, Endpoint: "b", Start: 11 * s, Status: 429}, // refused: not answered
	}
	oracle := []int64{0, 96, 96, 96, 96, 0, 96}
	got := classifyMisses(recs, oracle, 16, true)
	want := missCounts{Answered: 6, Short: 3, Moved: 1, Evicted: 1, InFlight: 1}
	if got != want {
		t.Fatalf("%+v, want %+v", got, want)
	}
}
