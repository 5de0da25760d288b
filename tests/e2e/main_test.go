// Package e2e holds kvgate's end-to-end tests: real `kvgate serve` and `enginesim` processes (built once per
// `go test` run by TestMain), a real redis-server, and the official openai-go client. Assertions read the
// values the simulator reports (usage.cached_tokens, its /metrics gauges and counters) rather than
// wall-clock gaps; where time is asserted the bound is at least 3 s.
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvgate/kvgate/cmd/kvgate-bench/harness"
)

var (
	bins harness.Binaries
	root string
	// roundRobinWasm is examples/policies/round-robin built for wasip1 (nil with roundRobinErr set).
	roundRobinWasm []byte
	roundRobinErr  error
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if root, err = harness.RepoRoot(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "kvgate-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if bins, err = harness.Build(ctx, root, dir); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	wasm := filepath.Join(dir, "round-robin.wasm")
	if roundRobinErr = harness.BuildWasm(ctx, root, "examples/policies/round-robin", wasm); roundRobinErr == nil {
		roundRobinWasm, roundRobinErr = os.ReadFile(wasm)
	}
	return m.Run()
}

// newEnv returns a harness environment for t.
func newEnv(t *testing.T) *harness.Env {
	return harness.NewEnv(t, bins, root)
}
