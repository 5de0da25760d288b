package threetier

import (
	"errors"
	"testing"

	"github.com/kvgate/kvgate/sdk"
)

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig(nil)
	if err != nil || c != (Config{ImbalanceThreshold: 8, MatchThreshold: 0.10, CPUWeight: 0.8}) {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	c, err = ParseConfig([]byte(`{"imbalance_threshold": 10, "cpu_weight": 0.5}`))
	if err != nil || c != (Config{ImbalanceThreshold: 10, MatchThreshold: 0.10, CPUWeight: 0.5}) {
		t.Fatalf("%+v %v", c, err)
	}
	for _, bad := range []string{`{"match_threshold": 1.5}`, `{"cpu_weight": -0.1}`, `{"imbalance": 3}`, `{`} {
		var ce *sdk.ConfigError
		if _, err := ParseConfig([]byte(bad)); !errors.As(err, &ce) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

func TestMatchRate(t *testing.T) {
	for _, c := range []struct {
		gpu, cpu, bs, tokens uint32
		w, want              float64
	}{
		{16, 0, 16, 256, 0.8, 1},
		{2, 10, 16, 256, 0.8, 0.625}, // (2 + 8) · 16 / 256
		{1, 0, 16, 256, 0.8, 0.0625},
		{3, 0, 16, 160, 0.8, 0.3},
		{5, 5, 16, 0, 0.8, 0}, // empty prompt
	} {
		if got := MatchRate(c.gpu, c.cpu, c.bs, c.tokens, c.w); got != c.want {
			t.Errorf("%+v: %v", c, got)
		}
	}
}

// TestRankDoesNotAllocate: once the scratch has grown, ranking allocates nothing (the guest's GC).
func TestRankDoesNotAllocate(t *testing.T) {
	r := New(DefaultConfig())
	s := &sdk.Snapshot{Request: sdk.Request{PromptTokens: 256, BlockSize: 16, Seed: 1}}
	for i := range 16 {
		s.Endpoints = append(s.Endpoints, sdk.Endpoint{Index: uint32(i), Flags: sdk.FlagHealthy, GPUBlocks: uint32(i), Waiting: uint32(i % 5)})
	}
	out := make([]uint32, 0, 16)
	out, _ = r.Rank(s, out)
	if n := testing.AllocsPerRun(100, func() { out, _ = r.Rank(s, out[:0]) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}
