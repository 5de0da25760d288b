package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/cmd/kvgate-bench/harness"
	"github.com/kvgate/kvgate/gateway"
	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/gateway/textmodel"
)

// compareOptions are the flags of --mode compare (the policy comparison at calibrated load levels).
type compareOptions struct {
	sim         int
	gatewayURL  string
	adminToken  string
	direct      bool
	quick       bool
	out         string
	workload    string
	api         string
	tracePath   string
	genTrace    string
	blockTokens int
	maxOutput   int
	arrival     string
	rate        float64
	concurrency int
	loads       []float64
	seeds       []uint64
	warmup      float64
	timeScale   float64
	gpuBlocks   int
	simArgs     []string
	maxInflight int64
	maxTokens   int64
	policyDir   string
	calConc     int
	limit       int
	progress    bool
	variants    map[string]variant // extra rows: a policy under another config, by label
	shared      sharedPrefixShape
	multi       multiTurnShape
	traceGen    traceShape
}

// variant is a policy activated with a config of its own (--variant LABEL=POLICY:JSON).
type variant struct {
	Policy string
	Config json.RawMessage
}

// defaultComparePolicies are the policies compared unless --policies says otherwise: the built-in
// three-tier, then every example policy (the AssemblyScript port of three-tier only in full runs, where it
// measures run-to-run noise: it ranks exactly like the built-in).
var defaultComparePolicies = []string{"three-tier", "round-robin", "least-loaded", "power-of-two-choices",
	"llmd-weighted", "sglang-cache-aware", "dynamo-cost"}

// peerPolicies are the example policies that mirror another project's router ("best peer" ratios).
var peerPolicies = []string{"llmd-weighted", "sglang-cache-aware", "dynamo-cost"}

// addCompareFlags registers the comparison's flags on fs; finish validates them after parsing.
func addCompareFlags(fs *flag.FlagSet, c *compareOptions) (finish func() error) {
	fs.IntVar(&c.sim, "sim", 0, "compare: start the gateway and N enginesim processes (one per engine)")
	fs.StringVar(&c.gatewayURL, "gateway", "", "compare: a running gateway's base URL (policies activated with $KVGATE_ADMIN_TOKEN)")
	fs.BoolVar(&c.direct, "direct", false, "compare: also send round-robin straight to the engines (needs --sim)")
	fs.BoolVar(&c.quick, "quick", false, "compare: the small workloads and the policies without three-tier-as (make bench); overhead: prompts up to 8k tokens, multi-turn to 8k, shorter CPU blocks")
	fs.StringVar(&c.out, "out", "bench-out", "compare: output directory (results.json, timeseries.json, report.md, charts)")
	fs.StringVar(&c.workload, "workload", "shared-prefix", "compare: shared-prefix, multi-turn or trace")
	fs.StringVar(&c.api, "api", "", "compare: chat or completions (default: chat; trace: completions)")
	fs.StringVar(&c.tracePath, "trace", "", "compare: Mooncake-format JSONL trace to replay (default: a generated one)")
	fs.StringVar(&c.genTrace, "gen-trace", "", "write the generated trace (Mooncake format) to this file and exit")
	fs.IntVar(&c.blockTokens, "block-tokens", 32, "trace: tokens per 512-token trace block (lengths scale by block-tokens/512)")
	fs.IntVar(&c.maxOutput, "max-output", 64, "trace: output tokens cap per request after scaling")
	fs.IntVar(&c.limit, "trace-limit", 0, "trace: replay only the first N records (0: all)")
	fs.StringVar(&c.arrival, "arrival", "", "compare: rate (open loop, Poisson), trace (the trace's timestamps, scaled) or closed (default: trace for traces, else rate)")
	fs.Float64Var(&c.rate, "rate", 0, "compare: requests per second at load 1 (0: calibrate round-robin's saturation throughput)")
	fs.IntVar(&c.concurrency, "concurrency", 0, "compare: closed loop: sessions in flight (with --arrival closed)")
	loads := fs.String("loads", "0.8,1.5,2", "compare: load levels, multiples of the calibrated rate")
	seeds := fs.String("seeds", "1", "compare: workload seeds; each seed is one full repetition")
	fs.Float64Var(&c.warmup, "warmup", 0.25, "compare: share of each run's first requests left out of the warm figures")
	fs.Float64Var(&c.timeScale, "time-scale", 10, "sim: enginesim --time-scale, wall seconds per simulated second (10: a fleet of 8 saturates at a rate a 2-core box can send)")
	fs.IntVar(&c.gpuBlocks, "gpu-blocks", 0, "sim: GPU KV blocks per engine (0: sized to the workload)")
	simArgs := fs.String("sim-args", "", "sim: extra enginesim flags, space separated (e.g. \"--prefill-per-token 400us\")")
	fs.Int64Var(&c.maxInflight, "max-inflight", 64, "sim: gateway max_inflight_requests per endpoint")
	fs.Int64Var(&c.maxTokens, "max-inflight-tokens", 0, "sim: gateway max_inflight_tokens per endpoint (0: unlimited, -1: the engine's KV capacity)")
	fs.StringVar(&c.policyDir, "policy-dir", "", "directory of prebuilt <policy>.wasm (make policies writes bin/policies)")
	fs.IntVar(&c.calConc, "calibration-concurrency", 0, "closed-loop concurrency of the calibration (0: 6 per engine)")
	fs.BoolVar(&c.progress, "progress", true, "draw a progress bar on stderr")
	c.variants = map[string]variant{}
	fs.Func("variant", "compare: an extra row LABEL=POLICY:JSON, the policy activated with that config (repeatable), e.g. 'tt-it32=three-tier:{\"imbalance_threshold\":32}'",
		func(v string) error {
			label, rest, ok := strings.Cut(v, "=")
			name, cfg, ok2 := strings.Cut(rest, ":")
			if !ok || !ok2 || label == "" || name == "" || !json.Valid([]byte(cfg)) {
				return fmt.Errorf("want LABEL=POLICY:JSON, got %q", v)
			}
			c.variants[label] = variant{Policy: name, Config: json.RawMessage(cfg)}
			return nil
		})
	fs.IntVar(&c.shared.Groups, "groups", 0, "shared-prefix: groups (0: the shape's)")
	fs.IntVar(&c.shared.Users, "users", 0, "shared-prefix: users per group")
	fs.IntVar(&c.shared.System, "system-tokens", 0, "shared-prefix, multi-turn: system prompt tokens")
	fs.IntVar(&c.shared.Question, "question-tokens", 0, "shared-prefix, multi-turn: question tokens")
	fs.IntVar(&c.shared.Output, "output-tokens", 0, "shared-prefix, multi-turn: output tokens")
	fs.IntVar(&c.multi.Sessions, "sessions", 0, "multi-turn: sessions")
	fs.IntVar(&c.multi.Turns, "turns", 0, "multi-turn: most turns per session")
	fs.DurationVar(&c.multi.Think, "think", 0, "multi-turn: think time between turns")
	fs.IntVar(&c.traceGen.Requests, "trace-requests", 0, "generated trace: requests")
	return func() error {
		for s := range strings.SplitSeq(*loads, ",") {
			v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
			if err != nil || v <= 0 {
				return fmt.Errorf("--loads: %q is not a positive number", s)
			}
			c.loads = append(c.loads, v)
		}
		for s := range strings.SplitSeq(*seeds, ",") {
			v, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
			if err != nil {
				return fmt.Errorf("--seeds: %q", s)
			}
			c.seeds = append(c.seeds, v)
		}
		c.simArgs = strings.Fields(*simArgs)
		switch c.workload {
		case "shared-prefix", "multi-turn", "trace":
		default:
			return fmt.Errorf("--workload %q: want shared-prefix, multi-turn or trace", c.workload)
		}
		if c.api == "" {
			c.api = "chat"
			if c.workload == "trace" {
				c.api = "completions"
			}
		}
		if c.api != "chat" && c.api != "completions" {
			return fmt.Errorf("--api %q: want chat or completions", c.api)
		}
		if c.arrival == "" {
			c.arrival = "rate"
			if c.workload == "trace" {
				c.arrival = "trace"
			}
		}
		switch c.arrival {
		case "rate", "closed":
		case "trace":
			if c.workload != "trace" {
				return errors.New("--arrival trace needs --workload trace")
			}
		default:
			return fmt.Errorf("--arrival %q: want rate, trace or closed", c.arrival)
		}
		if c.arrival == "closed" && c.concurrency < 1 {
			return errors.New("--arrival closed needs --concurrency N")
		}
		if c.sim < 0 || (c.sim > 0) == (c.gatewayURL != "") && c.genTrace == "" {
			return errors.New("compare: give exactly one of --sim N and --gateway URL")
		}
		if c.direct && c.sim == 0 {
			return errors.New("--direct needs --sim (the engines' addresses)")
		}
		if c.blockTokens < 1 || c.blockTokens > MooncakeBlockTokens {
			return fmt.Errorf("--block-tokens %d: want 1..512", c.blockTokens)
		}
		if c.warmup < 0 || c.warmup >= 1 {
			return fmt.Errorf("--warmup %v: want [0,1)", c.warmup)
		}
		return nil
	}
}

// fleet is what a comparison sends to: the gateway, and the engines when the bench started them.
type fleet struct {
	versions map[string]string // uploaded policy versions by name
	gw       *harness.Gateway
	engines  []*harness.Engine
	blocks   int // GPU blocks per engine (0: unknown)
}

// compare runs the policy comparison and writes its outputs.
func (b *bench) compare(ctx context.Context) error {
	c := &b.o.cmp
	if c.genTrace != "" {
		sh := traceGenFull
		if c.quick {
			sh = traceGenQuick
		}
		if c.traceGen.Requests > 0 {
			sh.Requests = c.traceGen.Requests
		}
		f, err := os.Create(c.genTrace)
		if err != nil {
			return err
		}
		defer f.Close()
		return writeTrace(f, generateTrace(sh, c.seeds[0]))
	}
	if err := os.MkdirAll(filepath.Join(c.out, "charts"), 0o755); err != nil {
		return err
	}
	m, err := textmodel.Load(b.base.Tokenizer)
	if err != nil {
		return err
	}
	src, err := newTextSource(m)
	if err != nil {
		return err
	}
	policies := b.o.policies
	if !b.o.policiesSet {
		policies = slices.Clone(defaultComparePolicies)
		if !c.quick {
			policies = append(policies, "three-tier-as")
		}
	}
	modules := slices.Clone(policies)
	for label, v := range c.variants {
		policies = append(policies, label)
		if !slices.Contains(modules, v.Policy) {
			modules = append(modules, v.Policy)
		}
	}
	slices.Sort(policies[len(policies)-len(c.variants):])
	wasm, err := b.policyModules(ctx, modules)
	if err != nil {
		return err
	}
	var all []result
	var series []timeSeries
	env := runEnv{CPUs: numCPU(), Started: time.Now().UTC()}
	// One fleet for every seed (the workload's shape, and so the cache size, does not depend on the seed):
	// each run starts cold anyway.
	var fl *fleet
	var runErr error
	for si, seed := range c.seeds {
		w, err := b.buildWorkload(src, seed)
		if err != nil {
			return err
		}
		if fl == nil {
			if fl, err = b.startFleet(ctx, w, si); err != nil {
				return err
			}
		}
		fmt.Fprintf(b.out, "workload %s (seed %d): %s; %d requests\n", w.Name, seed, w.Desc, w.Requests())
		rs, ts, err := b.compareSeed(ctx, fl, w, seed, policies, wasm, m, si)
		all = append(all, rs...)
		series = append(series, ts...)
		env.Workload, env.Desc, env.Engines, env.GPUBlocks = w.Name, w.Desc, len(fl.engines), fl.blocks
		if err != nil {
			runErr = err
			break
		}
	}
	env.Finished = time.Now().UTC()
	env.Args = os.Args[1:]
	// A failed run still leaves what was measured before it.
	if err := writeOutputs(c.out, env, all, series, b.out); err != nil {
		return err
	}
	return runErr
}

// policyModules builds or reads every non-built-in policy's Wasm module once, before anything is timed.
func (b *bench) policyModules(ctx context.Context, policies []string) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, p := range policies {
		if p == config.DefaultPolicyName {
			continue
		}
		var paths []string
		if b.o.cmp.policyDir != "" {
			paths = append(paths, filepath.Join(b.o.cmp.policyDir, p+".wasm"))
		}
		paths = append(paths, filepath.Join(b.root, "examples", "policies", p, p+".wasm"))
		for _, path := range paths {
			if wb, err := os.ReadFile(path); err == nil {
				out[p] = wb
				break
			}
		}
		if out[p] != nil {
			continue
		}
		path := filepath.Join(b.dir, p+".wasm")
		fmt.Fprintf(b.out, "building policy %s for wasip1 ...\n", p)
		if err := harness.BuildWasm(ctx, b.root, filepath.Join("examples", "policies", p), path); err != nil {
			return nil, err
		}
		wb, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		out[p] = wb
	}
	return out, nil
}

func (b *bench) buildWorkload(src *textSource, seed uint64) (*workload, error) {
	c := &b.o.cmp
	chat := c.api == "chat"
	switch c.workload {
	case "shared-prefix":
		sh := sharedPrefixFull
		if c.quick {
			sh = sharedPrefixQuick
		}
		over(&sh.Groups, c.shared.Groups)
		over(&sh.Users, c.shared.Users)
		over(&sh.System, c.shared.System)
		over(&sh.Question, c.shared.Question)
		over(&sh.Output, c.shared.Output)
		return sharedPrefix(src, sh, chat, seed), nil
	case "multi-turn":
		sh := multiTurnFull
		if c.quick {
			sh = multiTurnQuick
		}
		over(&sh.Sessions, c.multi.Sessions)
		over(&sh.Turns, c.multi.Turns)
		over(&sh.System, c.shared.System)
		over(&sh.Question, c.shared.Question)
		over(&sh.Output, c.shared.Output)
		if c.multi.Think > 0 {
			sh.Think = c.multi.Think
		}
		return multiTurn(src, sh, chat, seed), nil
	default:
		var recs []traceRecord
		if c.tracePath != "" {
			var err error
			if recs, err = readTraceFile(c.tracePath); err != nil {
				return nil, err
			}
		} else {
			sh := traceGenFull
			if c.quick {
				sh = traceGenQuick
			}
			over(&sh.Requests, c.traceGen.Requests)
			recs = generateTrace(sh, seed)
		}
		w := traceWorkload(src, recs, c.blockTokens, c.maxOutput, seed, c.limit)
		w.Chat = chat
		if chat { // the trace's text as one user message
			for i := range w.Sessions {
				w.Sessions[i].System = ""
			}
		}
		return w, nil
	}
}

func over(dst *int, v int) {
	if v > 0 {
		*dst = v
	}
}

// startFleet starts N engines and a gateway (--sim), or wraps --gateway. Engines' GPU caches default to
// a size the workload overflows when scattered: per engine, about twice the workload's distinct prompt
// blocks divided by the number of engines (a router that partitions the prefixes fits; one that scatters
// them thrashes).
func (b *bench) startFleet(ctx context.Context, w *workload, run int) (*fleet, error) {
	c := &b.o.cmp
	if c.gatewayURL != "" {
		tok := c.adminToken
		if tok == "" {
			tok = os.Getenv("KVGATE_ADMIN_TOKEN")
		}
		addr := strings.TrimPrefix(strings.TrimPrefix(strings.TrimRight(c.gatewayURL, "/"), "http://"), "https://")
		return &fleet{gw: &harness.Gateway{Addr: addr, AdminToken: tok}, versions: map[string]string{}}, nil
	}
	blocks := c.gpuBlocks
	if blocks == 0 {
		blocks = max(256, 2*distinctBlocks(w, b.base.BlockSize)/c.sim)
	}
	args := append([]string{"--max-num-batched-tokens", "2048"}, c.simArgs...)
	engines := make([]*harness.Engine, c.sim)
	errs := make([]error, c.sim)
	var wg sync.WaitGroup
	for i := range c.sim {
		wg.Go(func() {
			engines[i], errs[i] = harness.StartEngine(ctx, harness.EngineOptions{Bin: b.bins.EngineSim,
				ID: fmt.Sprintf("e%d", i), LogDir: b.dir, Model: b.base.Tokenizer, ServedModelName: b.base.Name,
				TimeScale: c.timeScale, NumGPUBlocks: blocks,
				Args: append([]string{"--block-size", strconv.Itoa(b.base.BlockSize)}, args...)})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if engines[i] != nil {
			b.track(engines[i].Proc)
		}
		if err != nil {
			return nil, err
		}
	}
	tokens := c.maxTokens
	if tokens < 0 {
		tokens = int64(blocks * b.base.BlockSize)
	}
	cfg := b.cfg
	m := b.base
	for _, e := range engines {
		m.Endpoints = append(m.Endpoints, harness.EndpointConfig(e, c.maxInflight, tokens))
	}
	cfg.Models = []config.Model{m}
	cfg.Store = config.Store{Kind: config.StoreMemory}
	g, err := harness.StartGateway(ctx, harness.GatewayOptions{Bin: b.bins.KVGate, Name: fmt.Sprintf("compare%d", run),
		Dir: b.dir, Config: cfg, ReadyTimeout: 90 * time.Second})
	if g != nil {
		b.track(g.Proc)
	}
	if err != nil {
		return nil, err
	}
	return &fleet{gw: g, engines: engines, blocks: blocks, versions: map[string]string{}}, nil
}

// distinctBlocks estimates the workload's distinct prompt blocks from its text (one token per word).
func distinctBlocks(w *workload, blockSize int) int {
	seen := map[string]bool{}
	n := 0
	for _, s := range w.Sessions {
		if !seen[s.System] {
			seen[s.System] = true
			n += strings.Count(s.System, " ") / blockSize
		}
		for _, t := range s.Turns {
			n += (strings.Count(t.User, " ") + t.MaxTokens) / blockSize
		}
	}
	return n
}

// compareSeed calibrates and runs every policy at every load for one workload seed.
func (b *bench) compareSeed(ctx context.Context, fl *fleet, w *workload, seed uint64, policies []string,
	wasm map[string][]byte, m *textmodel.Model, si int) ([]result, []timeSeries, error) {
	c := &b.o.cmp
	versions := fl.versions
	for _, p := range policies {
		if v, ok := c.variants[p]; ok {
			p = v.Policy
		}
		if _, ok := versions[p]; ok {
			continue
		}
		if p == config.DefaultPolicyName {
			continue
		}
		up, err := fl.gw.UploadPolicy(ctx, p, wasm[p])
		if err != nil {
			return nil, nil, fmt.Errorf("upload %s: %w", p, err)
		}
		versions[p] = string(up.Version)
	}
	for _, need := range []string{"round-robin"} {
		if _, ok := versions[need]; !ok && c.rate == 0 && c.arrival != "closed" {
			wb, err := b.policyModules(ctx, []string{need})
			if err != nil {
				return nil, nil, err
			}
			up, err := fl.gw.UploadPolicy(ctx, need, wb[need])
			if err != nil {
				return nil, nil, err
			}
			versions[need] = string(up.Version)
		}
	}
	runN := si * 1000
	nonce := func() string { runN++; return fmt.Sprintf("R%04d.", runN%10000) }
	gwTarget := gatewayTarget(fl.gw.URL(), b.base.Name)
	sat := c.rate
	if c.arrival != "closed" && sat == 0 {
		if err := b.activateVersion(ctx, fl, "round-robin", versions); err != nil {
			return nil, nil, err
		}
		sat = b.calibrate(ctx, fl, w, gwTarget, nonce())
		fmt.Fprintf(b.out, "calibration: round-robin saturates at %.2f requests/s (wall)\n", sat)
	}
	var results []result
	var series []timeSeries
	loads := c.loads
	if c.arrival == "closed" {
		loads = []float64{0}
	}
	for _, load := range loads {
		type run struct {
			name string
			t    *target
		}
		var runs []run
		for _, p := range policies {
			runs = append(runs, run{p, gwTarget})
		}
		if c.direct {
			runs = append(runs, run{"direct-round-robin", directTarget(fl.engines, b.base.Name)})
		}
		for _, r := range runs {
			res := result{Workload: w.Name, Policy: r.name, Load: load, Seed: seed, SaturationRPS: sat}
			if r.t == gwTarget {
				if err := b.activateVersion(ctx, fl, r.name, versions); err != nil {
					res.Error = err.Error()
					results = append(results, res)
					fmt.Fprintf(b.out, "  %s: %v\n", r.name, err)
					continue
				}
			}
			if err := resetEngines(ctx, fl.engines); err != nil {
				return results, series, err
			}
			a := arrivals{Kind: c.arrival, Concurrency: c.concurrency, Seed: seed*7919 + uint64(load*1000)}
			rps := load * sat
			switch c.arrival {
			case "rate":
				a.Rate = rps * float64(len(w.Sessions)) / float64(w.Requests())
			case "trace":
				span := w.Sessions[len(w.Sessions)-1].At.Seconds()
				a.Speedup = 1
				if span > 0 {
					a.Speedup = rps * span / float64(w.Requests())
				}
			}
			res.OfferedRPS = rps
			before, _ := fl.gw.Metrics(ctx)
			b0 := readBox()
			var prog func(int, int, time.Duration)
			if c.progress {
				prog = progressBar(fmt.Sprintf("%s %s load %g", w.Name, r.name, load))
			}
			st := runWorkload(ctx, w, r.t, a, nonce(), fl.engines, prog)
			b1 := readBox()
			after, _ := fl.gw.Metrics(ctx)
			if ctx.Err() != nil {
				return results, series, ctx.Err()
			}
			lruBlocks := fl.blocks * max(len(fl.engines), 1)
			if fl.blocks == 0 {
				lruBlocks = math.MaxInt32
			}
			res.fill(st, m, b.base.BlockSize, lruBlocks, c.warmup, fl.engines)
			res.Box = box(b0, b1)
			if r.t == gwTarget {
				res.RoutingStages = stageDelta(before, after)
				res.gatewayCounters(before, after)
			}
			results = append(results, res)
			series = append(series, makeSeries(&res, st, m, b.base.BlockSize))
			fmt.Fprintf(b.out, "  %-22s load %-4g %4d req  %3d err (%d×429)  TTFT p50 %.3fs p90 %.3fs  hit %.3f / oracle %.3f (gateway saw %.3f)  max/mean %.2f  misses cold/moved/evicted/in-flight %d/%d/%d/%d  refusals %d  load avg %.2f\n",
				r.name, load, res.Requests, res.Errors, res.Status429, res.TTFTP50, res.TTFTP90, res.HitRate,
				res.OracleHitRate, res.GatewayMatchRate, res.MaxOverMean, res.Misses.Cold, res.Misses.Moved,
				res.Misses.Evicted, res.Misses.InFlight, res.ReservationRefusals, res.Box.LoadEnd[0])
		}
	}
	return results, series, nil
}

// calibrate measures round-robin's saturation throughput on w: closed loop with many sessions in flight
// (turns back to back), requests answered per second after the first fifth of the answers.
func (b *bench) calibrate(ctx context.Context, fl *fleet, w *workload, t *target, nonce string) float64 {
	c := &b.o.cmp
	conc := c.calConc
	if conc == 0 {
		conc = 6 * max(len(fl.engines), 1)
	}
	_ = resetEngines(ctx, fl.engines)
	cw := *w
	n := min(len(w.Sessions), max(conc*6, len(w.Sessions)/2))
	cw.Sessions = w.Sessions[:n]
	var prog func(int, int, time.Duration)
	if c.progress {
		prog = progressBar(w.Name + " calibration (round-robin)")
	}
	st := runWorkload(ctx, &cw, t, arrivals{Kind: "closed", Concurrency: conc, NoThink: true}, nonce, fl.engines, prog)
	var fin []time.Duration
	for _, r := range st.Records {
		if r.OK() {
			fin = append(fin, r.Finish)
		}
	}
	slices.Sort(fin)
	if len(fin) < 5 {
		return 1
	}
	from := len(fin) / 5
	// The last answers come while the closed loop drains: stop counting at the last 10%.
	to := len(fin) - max(1, len(fin)/10)
	if d := (fin[to] - fin[from]).Seconds(); d > 0 {
		return float64(to-from) / d
	}
	return 1
}

func (b *bench) activateVersion(ctx context.Context, fl *fleet, p string, versions map[string]string) error {
	var cfg []byte
	if v, ok := b.o.cmp.variants[p]; ok {
		p, cfg = v.Policy, v.Config
	}
	if p == config.DefaultPolicyName {
		l, err := fl.gw.Policies(ctx)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(l.Versions, func(v gateway.AdminVersion) bool { return v.Name == p })
		if i < 0 {
			return fmt.Errorf("%s is not loaded", p)
		}
		return fl.gw.ActivatePolicy(ctx, b.base.Name, string(l.Versions[i].Version), cfg)
	}
	v, ok := versions[p]
	if !ok {
		return fmt.Errorf("policy %s not uploaded", p)
	}
	return fl.gw.ActivatePolicy(ctx, b.base.Name, v, cfg)
}

// resetEngines drops every engine's prefix cache (AllBlocksCleared reaches the gateway's index).
func resetEngines(ctx context.Context, engines []*harness.Engine) error {
	for _, e := range engines {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/reset_prefix_cache", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
	}
	time.Sleep(200 * time.Millisecond) // the clear events reach the index
	return nil
}

// newTextSource keeps the bench's vocabulary words that the model encodes as one token with a leading
// space (so n words are n tokens and concatenated texts keep their tokens).
func newTextSource(m *textmodel.Model) (*textSource, error) {
	var words []string
	seen := map[string]bool{}
	for _, w := range append(slices.Clone(vocab), commonWords...) {
		if seen[w] {
			continue
		}
		seen[w] = true
		if len(m.EncodeText(" "+w)) == 1 {
			words = append(words, " "+w)
		}
	}
	if len(words) < 32 {
		return nil, fmt.Errorf("only %d one-token words for this tokenizer", len(words))
	}
	return &textSource{words: words}, nil
}

// commonWords widen the vocabulary (English words most tokenizers hold as one token).
var commonWords = strings.Fields(`time year people way day man thing woman life child world school state
family student group country problem hand part place case week company system program question work
government number night point home water room mother area money story fact month lot right study book eye
job word business issue side kind head house service friend father power hour game line end member law car
city community name president team minute idea kid body information back parent face others level office
door health person art war history party result change morning reason research girl guy moment air teacher
force education foot boy age policy music market sense nation plan college interest death experience effect
class control care field development role effort rate heart drug show leader light voice wife police mind
price report decision son view relationship town road arm difference value building action model season
society tax director position player record paper space ground form event official matter center couple
site project activity star table need court oil situation cost industry figure street image phone data`)

// writeJSON writes v indented to path.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
