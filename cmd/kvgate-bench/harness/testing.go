package harness

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/gateway/config"
)

// DefaultModel is the served model name of the harness's engines and configs.
const DefaultModel = "qwen3"

// Env is one test's processes. Create with NewEnv; every process it starts is stopped at the test's
// cleanup, after the last lines of every log were printed if the test failed.
type Env struct {
	// T is the test the environment belongs to; processes are stopped at its cleanup.
	T testing.TB
	// Bins are the kvgate and enginesim binaries it starts.
	Bins Binaries
	// Root is the repository root (tokenizer directories are resolved against it).
	Root string
	// Dir holds this test's configs and logs.
	Dir string

	mu    sync.Mutex
	procs []*Proc
	n     int
}

// NewEnv returns an Env for t.
func NewEnv(t testing.TB, bins Binaries, root string) *Env {
	e := &Env{T: t, Bins: bins, Root: root, Dir: t.TempDir()}
	t.Cleanup(e.cleanup)
	return e
}

func (e *Env) track(p *Proc) {
	e.mu.Lock()
	e.procs = append(e.procs, p)
	e.mu.Unlock()
}

func (e *Env) cleanup() {
	e.mu.Lock()
	procs := append([]*Proc(nil), e.procs...)
	e.mu.Unlock()
	if e.T.Failed() {
		for _, p := range procs {
			e.T.Logf("--- last log lines of %s (%s):\n%s", p.Name, p.LogPath, p.Tail(25))
		}
	}
	// Gateways (started later) first, then engines.
	var wg sync.WaitGroup
	for i := len(procs) - 1; i >= 0; i-- {
		wg.Go(func() { procs[i].Stop(3 * time.Second) })
	}
	wg.Wait()
}

// ModelDir is the Qwen3 demo model directory shipped in the repository (tokenizer.json.gz and
// tokenizer_config.json with its chat template).
func (e *Env) ModelDir() string { return filepath.Join(e.Root, "examples", "models", "qwen3") }

// Engines starts n enginesim processes serving DefaultModel from ModelDir, named prefix0..prefix(n-1)
// (prefix "e" when empty); o's Bin, ID, LogDir, Model and ServedModelName are filled in.
func (e *Env) Engines(prefix string, n int, o EngineOptions) []*Engine {
	e.T.Helper()
	if prefix == "" {
		prefix = "e"
	}
	out := make([]*Engine, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		oi := o
		oi.Bin, oi.ID, oi.LogDir = e.Bins.EngineSim, fmt.Sprintf("%s%d", prefix, i), e.Dir
		if oi.Model == "" {
			oi.Model = e.ModelDir()
		}
		if oi.ServedModelName == "" {
			oi.ServedModelName = DefaultModel
		}
		wg.Go(func() { out[i], errs[i] = StartEngine(context.Background(), oi) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			e.T.Fatalf("start engine %d: %v", i, err)
		}
		e.track(out[i].Proc)
	}
	return out
}

// Model returns a model config for DefaultModel over engines, each with the given in-flight limits.
func (e *Env) Model(engines []*Engine, maxRequests, maxTokens int64) config.Model {
	m := config.Model{Name: DefaultModel, Tokenizer: e.ModelDir(), BlockSize: 16}
	for _, en := range engines {
		m.Endpoints = append(m.Endpoints, EndpointConfig(en, maxRequests, maxTokens))
	}
	return m
}

// Gateway starts a kvgate process with cfg (Listen and the admin token are set by the harness) and waits
// until it is ready.
func (e *Env) Gateway(name string, cfg config.Config) *Gateway {
	e.T.Helper()
	if name == "" {
		e.mu.Lock()
		name = fmt.Sprintf("g%d", e.n)
		e.n++
		e.mu.Unlock()
	}
	g, err := StartGateway(context.Background(), GatewayOptions{Bin: e.Bins.KVGate, Name: name, Dir: e.Dir, Config: cfg})
	if g != nil {
		e.track(g.Proc)
	}
	if err != nil {
		e.T.Fatalf("start gateway %s: %v", name, err)
	}
	return g
}

// Gateways starts n kvgate processes named g0..g(n-1) with the same cfg, concurrently, and waits until
// every one is ready.
func (e *Env) Gateways(n int, cfg config.Config) []*Gateway {
	e.T.Helper()
	out := make([]*Gateway, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			out[i], errs[i] = StartGateway(context.Background(), GatewayOptions{Bin: e.Bins.KVGate,
				Name: fmt.Sprintf("g%d", i), Dir: e.Dir, Config: cfg})
		})
	}
	wg.Wait()
	for i := range n {
		if out[i] != nil {
			e.track(out[i].Proc)
		}
	}
	for i, err := range errs {
		if err != nil {
			e.T.Fatalf("start gateway g%d: %v", i, err)
		}
	}
	return out
}
