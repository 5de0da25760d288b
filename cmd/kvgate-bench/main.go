// Command kvgate-bench is kvgate's workload generator and report. It starts real processes (enginesim,
// `kvgate serve`, redis-server) through cmd/kvgate-bench/harness, writes their gateway configs with gateway/config's
// own types (optionally starting from the user's --config file), and measures:
//
//   - overhead: the latency and CPU the gateway adds per request against calling the simulator directly
//     and against nginx in front of the same simulator, in the same run (the paths interleaved): ~55-token
//     prompts and 512 to 128k-token prompts cut from the tokenizer's bench text, with a seen prefix and
//     fresh, then a multi-turn conversation's cost per new turn; memory and Redis stores. CPU per request is
//     utime+stime (/proc/<pid>/stat) over a block of back-to-back requests (kvgate's less its idle
//     background); the targets are judged with the machine's load average and steal (overhead.go).
//   - quality: the prefix-cache hit rate of each policy (the built-in three-tier and example policies
//     uploaded through the admin API) on a shared-prefix workload, beside the oracle hit rate (one infinite
//     cache), and the request spread over endpoints.
//
// Usage (from the repository root):
//
//	go run ./cmd/kvgate-bench [--mode overhead|quality|all] [--requests N] [--stores memory,redis]
//
// Without --kvgate/--enginesim it builds both binaries with `go build` into a temporary directory.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/cmd/kvgate-bench/harness"
	"github.com/kvgate/kvgate/gateway/config"
)

// options are the command-line flags.
type options struct {
	mode      string
	kvgate    string
	enginesim string
	configIn  string
	modelDir  string
	requests  int
	stores    []string
	policies  []string
	keep      bool
	// overheadOut is --overhead-out: where the overhead mode writes its report as JSON ("" = nowhere).
	overheadOut string
	// overheadSizes and overheadTurnsTo override the overhead plan's prompt sizes and multi-turn length.
	overheadSizes   []int
	overheadTurnsTo int
	// policiesSet is true when --policies was given; cmp holds --mode compare's flags (compare.go).
	policiesSet bool
	cmp         compareOptions
}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "kvgate-bench:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("kvgate-bench", flag.ContinueOnError)
	fs.StringVar(&o.mode, "mode", "all", "what to measure: overhead, quality, compare (implied by --sim and --gateway), all (overhead and quality) or redis (what one Redis costs the fleet)")
	fs.StringVar(&o.kvgate, "kvgate", "", "kvgate binary (default: go build ./cmd/kvgate)")
	fs.StringVar(&o.enginesim, "enginesim", "", "enginesim binary (default: go build ./cmd/enginesim)")
	fs.StringVar(&o.configIn, "config", "", "gateway config to start from (its first model's tokenizer, block size, policy config and timings; endpoints, listen and store are replaced)")
	fs.StringVar(&o.modelDir, "model", "", "model directory (default: the config's tokenizer, else examples/models/qwen3)")
	fs.IntVar(&o.requests, "requests", 300, "measured requests per path and scenario (overhead) or per policy (quality)")
	stores := fs.String("stores", "memory,redis", "stores to measure overhead with (memory, redis)")
	policies := fs.String("policies", "three-tier,round-robin,least-loaded,power-of-two-choices,sglang-cache-aware,llmd-weighted",
		"quality: policies to compare: three-tier (built in) and examples/policies/<name> directories")
	sizes := fs.String("overhead-sizes", "", "overhead: prompt sizes in tokens, comma-separated (default 512,2048,8192,32768,131072; with --quick 512,2048,8192)")
	fs.IntVar(&o.overheadTurnsTo, "overhead-turns-to", 0, "overhead: grow the multi-turn conversations to this many tokens (default 34000; with --quick 8192)")
	addRedisFlags(fs)
	fs.BoolVar(&o.keep, "keep", false, "keep the work directory (configs, process logs)")
	fs.StringVar(&o.overheadOut, "overhead-out", "", "overhead: also write the report (rows, multi-turn curve, machine load, verdicts) as JSON to this file")
	finishCompare := addCompareFlags(fs, &o.cmp)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "policies":
			o.policiesSet = true
		case "sim", "gateway", "gen-trace":
			if !setFlag(fs, "mode") {
				o.mode = "compare"
			}
		}
	})
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch o.mode {
	case "overhead", "quality", "all", "redis":
	case "compare":
		if err := finishCompare(); err != nil {
			return o, err
		}
	default:
		return o, fmt.Errorf("--mode %q: want overhead, quality, compare, all or redis", o.mode)
	}
	if o.requests < 20 {
		return o, fmt.Errorf("--requests %d: want at least 20", o.requests)
	}
	for s := range strings.SplitSeq(*stores, ",") {
		switch s = strings.TrimSpace(s); s {
		case config.StoreMemory, config.StoreRedis:
			o.stores = append(o.stores, s)
		case "":
		default:
			return o, fmt.Errorf("--stores: unknown store %q", s)
		}
	}
	for v := range strings.SplitSeq(*sizes, ",") {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 64 || n > 200_000 {
			return o, fmt.Errorf("--overhead-sizes: %q: want token counts from 64 to 200000", v)
		}
		o.overheadSizes = append(o.overheadSizes, n)
	}
	if o.overheadTurnsTo < 0 {
		return o, fmt.Errorf("--overhead-turns-to %d: want a positive token count", o.overheadTurnsTo)
	}
	for p := range strings.SplitSeq(*policies, ",") {
		if p = strings.TrimSpace(p); p != "" {
			o.policies = append(o.policies, p)
		}
	}
	return o, nil
}

// bench holds what every measurement shares: binaries, work directory, base config, started processes.
type bench struct {
	o    options
	root string
	dir  string
	bins harness.Binaries
	base config.Model // the model template (tokenizer, block size, policy, timings); endpoints replaced
	cfg  config.Config
	out  io.Writer

	mu    sync.Mutex
	procs []*harness.Proc
}

func run(args []string, out io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b := &bench{o: o, out: out}
	if b.root, err = harness.RepoRoot(); err != nil {
		return err
	}
	if b.dir, err = os.MkdirTemp("", "kvgate-bench-"); err != nil {
		return err
	}
	defer func() {
		b.stopAll()
		if o.keep {
			fmt.Fprintln(out, "work directory kept:", b.dir)
		} else {
			os.RemoveAll(b.dir)
		}
	}()
	if err := b.loadConfig(); err != nil {
		return err
	}
	if o.mode == "compare" && o.cmp.genTrace != "" {
		return b.compare(ctx) // writes the trace, starts nothing
	}
	if err := b.binaries(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "kvgate-bench: model %s, block size %d, %d CPUs, %s\n", b.base.Tokenizer, b.base.BlockSize,
		numCPU(), time.Now().UTC().Format(time.RFC3339))
	if o.mode == "overhead" || o.mode == "all" {
		if err := b.overhead(ctx); err != nil {
			return err
		}
	}
	if o.mode == "quality" || o.mode == "all" {
		if err := b.quality(ctx); err != nil {
			return err
		}
	}
	if o.mode == "redis" {
		if err := b.redisScale(ctx); err != nil {
			return err
		}
	}
	if o.mode == "compare" {
		return b.compare(ctx)
	}
	return nil
}

// setFlag reports whether the flag name was given on the command line.
func setFlag(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// loadConfig builds the config template: the user's file (parsed strictly by gateway/config) or defaults.
func (b *bench) loadConfig() error {
	if b.o.configIn != "" {
		c, err := config.Load(b.o.configIn)
		if err != nil {
			return err
		}
		b.cfg = *c
		b.base = c.Models[0]
	} else {
		b.cfg = config.Config{LogLevel: "warn", ScrapeInterval: 250 * time.Millisecond}
		b.base = config.Model{Name: harness.DefaultModel, BlockSize: config.DefaultBlockSize,
			Policy: config.Policy{Name: config.DefaultPolicyName}}
	}
	b.cfg.Simulate = nil
	switch {
	case b.o.modelDir != "":
		b.base.Tokenizer = b.o.modelDir
	case b.o.configIn == "":
		b.base.Tokenizer = filepath.Join(b.root, "examples", "models", "qwen3")
	}
	if abs, err := filepath.Abs(b.base.Tokenizer); err == nil {
		b.base.Tokenizer = abs
	}
	b.base.Endpoints = nil
	b.base.LoRAAdapters = nil
	return nil
}

func (b *bench) binaries(ctx context.Context) error {
	if b.o.kvgate != "" && b.o.enginesim != "" {
		b.bins = harness.Binaries{KVGate: b.o.kvgate, EngineSim: b.o.enginesim}
		return nil
	}
	fmt.Fprintln(b.out, "building kvgate and enginesim ...")
	bins, err := harness.Build(ctx, b.root, filepath.Join(b.dir, "bin"))
	if err != nil {
		return err
	}
	b.bins = bins
	if b.o.kvgate != "" {
		b.bins.KVGate = b.o.kvgate
	}
	if b.o.enginesim != "" {
		b.bins.EngineSim = b.o.enginesim
	}
	return nil
}

func (b *bench) track(p *harness.Proc) {
	b.mu.Lock()
	b.procs = append(b.procs, p)
	b.mu.Unlock()
}

// stopAll stops every started process, newest first.
func (b *bench) stopAll() {
	b.mu.Lock()
	procs := b.procs
	b.procs = nil
	b.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop(3 * time.Second)
	}
}

// engines starts n simulators serving the model, named prefix0.., with extra flags.
func (b *bench) engines(ctx context.Context, prefix string, n int, o harness.EngineOptions) ([]*harness.Engine, error) {
	out := make([]*harness.Engine, n)
	for i := range n {
		oi := o
		oi.Bin, oi.ID, oi.LogDir, oi.Model, oi.ServedModelName = b.bins.EngineSim, fmt.Sprintf("%s%d", prefix, i), b.dir,
			b.base.Tokenizer, b.base.Name
		oi.Args = append(append([]string(nil), o.Args...), "--block-size", fmt.Sprint(b.base.BlockSize))
		e, err := harness.StartEngine(ctx, oi)
		if err != nil {
			return nil, err
		}
		b.track(e.Proc)
		out[i] = e
	}
	return out, nil
}

// gateway starts a kvgate over engines with the given store (Redis address for "redis").
func (b *bench) gateway(ctx context.Context, name string, engines []*harness.Engine, storeKind, redisAddr string) (*harness.Gateway, error) {
	c := b.cfg
	m := b.base
	for _, e := range engines {
		m.Endpoints = append(m.Endpoints, harness.EndpointConfig(e, 0, 0))
	}
	c.Models = []config.Model{m}
	c.Store = config.Store{Kind: storeKind}
	if storeKind == config.StoreRedis {
		c.Store.Addrs = []string{redisAddr}
		c.Store.IndexLayout = redisFlags.layout // 0 (follow the store) unless --mode redis measures a layout
	}
	g, err := harness.StartGateway(ctx, harness.GatewayOptions{Bin: b.bins.KVGate, Name: name, Dir: b.dir, Config: c,
		ReadyTimeout: 90 * time.Second})
	if g != nil {
		b.track(g.Proc)
	}
	return g, err
}
