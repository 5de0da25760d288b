// Package threetieras tests the AssemblyScript port of the default three-tier policy (assembly/index.ts,
// built into three-tier-as.wasm; see README.md): loaded through the real host as an uploaded module, it
// must rank like the native Go three-tier.
package threetieras

import (
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/plugins"
	"github.com/kvgate/kvgate/sdk"
)

func newHost(t testing.TB) *plugins.Host {
	t.Helper()
	h, err := plugins.New(context.Background(), plugins.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		CallTimeout: time.Second, ValidationTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	wasm, err := os.ReadFile("three-tier-as.wasm")
	if err != nil {
		t.Fatal(err)
	}
	v, rep, err := h.Load("three-tier-as", wasm)
	if err != nil {
		t.Fatalf("%v\n%s", err, rep.String())
	}
	if len(rep.Imports) != 0 {
		t.Fatalf("imports %v", rep.Imports)
	}
	if err := h.Activate("m", v, nil); err != nil {
		t.Fatal(err)
	}
	return h
}

func native(s *sdk.Snapshot) []int {
	idx := plugins.RankThreeTier(plugins.DefaultThreeTierConfig(), s, nil)
	out := make([]int, len(idx))
	for i, v := range idx {
		out[i] = int(v)
	}
	return out
}

// TestMatchesNative10k: 10,000 random snapshots (0–64 endpoints, every branch) rank identically.
func TestMatchesNative10k(t *testing.T) {
	h := newHost(t)
	for i := 0; i < 10000; i++ {
		s := plugins.RandomSnapshot(uint64(i)+1, i%65)
		want := native(&s)
		got, info := h.Rank(context.Background(), "m", &s)
		if info.Fallback || !slices.Equal(got, want) {
			t.Fatalf("snapshot %d: AssemblyScript %v %+v, Go %v", i, got, info, want)
		}
	}
}

// TestHandWorked: vllm-project/router PR #238 (loads [100,0,0], prefix on idle endpoint 2 → [2,1,0]) and the
// balance draw for seed 42 over 4 endpoints (positions 2 and 0, from an independent Python SplitMix64).
func TestHandWorked(t *testing.T) {
	h := newHost(t)
	ep := func(gpu, waiting uint32) sdk.Endpoint {
		return sdk.Endpoint{Flags: sdk.FlagHealthy, GPUBlocks: gpu, Waiting: waiting}
	}
	req := sdk.Request{PromptTokens: 256, PromptBlocks: 16, BlockSize: 16, Seed: 42}
	for _, c := range []struct {
		eps  []sdk.Endpoint
		want []int
	}{
		{[]sdk.Endpoint{ep(0, 100), ep(0, 0), ep(16, 0)}, []int{2, 1, 0}},
		{[]sdk.Endpoint{ep(16, 40), ep(0, 2), ep(0, 0), ep(0, 5)}, []int{2, 0, 1, 3}},
	} {
		s := sdk.Snapshot{Request: req, Endpoints: c.eps}
		if got, info := h.Rank(context.Background(), "m", &s); info.Fallback || !slices.Equal(got, c.want) {
			t.Errorf("got %v %+v, want %v", got, info, c.want)
		}
	}
	v, _ := h.Active("m")
	if err := h.Activate("m2", v, []byte(`{"match_threshold": 0.5}`)); err == nil {
		t.Error("a config was accepted")
	}
}

// BenchmarkRank: the AssemblyScript policy as an uploaded module (interruption on), 16 endpoints.
func BenchmarkRank(b *testing.B) {
	h := newHost(b)
	snaps := make([]plugins.Snapshot, 64)
	for i := range snaps {
		snaps[i] = plugins.RandomSnapshot(uint64(16000+i), 16)
	}
	lat := make([]time.Duration, 0, 1<<16)
	i := 0
	for b.Loop() {
		t0 := time.Now()
		h.Rank(context.Background(), "m", &snaps[i%len(snaps)])
		if len(lat) < cap(lat) {
			lat = append(lat, time.Since(t0))
		}
		i++
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
}
