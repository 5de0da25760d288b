package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"text/tabwriter"
	"time"

	"github.com/kvgate/kvgate/cmd/kvgate-bench/harness"
	"github.com/kvgate/kvgate/gateway/config"
)

// Overhead targets of issue 6 (memory store, prefix seen before).
const (
	targetAddedP50 = 300 * time.Microsecond
	targetCPU      = 400 * time.Microsecond
)

// overheadRow is one store × scenario measurement.
type overheadRow struct {
	Store, Scenario      string
	PromptTokens, Cached int64            // of the gateway path's answers (mean cached tokens)
	Direct, Gateway      [3]time.Duration // p50, p90, p99 end-to-end latency seen by the client
	PairedP50            time.Duration    // median over pairs of (gateway − direct)
	// Gateway CPU per request: CPUGross over the request block only; CPUNet over the block plus a settle
	// period (deferred event ingestion) less the idle background rate (CPUIdle, per request) for that time.
	CPUGross, CPUNet, CPUIdle time.Duration
	// Settle is how long the gateway kept working after the CPU block's last answer (KV events indexed).
	Settle time.Duration
}

func (r overheadRow) added() time.Duration { return r.Gateway[0] - r.Direct[0] }
func (r overheadRow) cpu() time.Duration   { return r.CPUNet }

// scenario makes the i-th request body of a workload.
type scenario struct {
	name string
	body func(i int) []byte
}

func (b *bench) overhead(ctx context.Context) error {
	// One simulator that never sleeps (--time-scale 0): its answer time is its own CPU work, identical on
	// both paths because both send the same token IDs.
	engines, err := b.engines(ctx, "direct", 1, harness.EngineOptions{Args: []string{"--time-scale", "0"}})
	if err != nil {
		return err
	}
	e := engines[0]
	model := b.base.Name
	prefixWords, err := wordsFor(ctx, e, model, 1800)
	if err != nil {
		return err
	}
	tailWords, _ := wordsFor(ctx, e, model, 200)
	coldWords, _ := wordsFor(ctx, e, model, 2000)
	r := rand.New(rand.NewPCG(1, 1))
	prefix := "You are a careful assistant. Reference material follows. " + text(r, prefixWords)
	var redisAddr string
	var rows []overheadRow
	for si, store := range b.o.stores {
		if store == config.StoreRedis && redisAddr == "" {
			rd, err := harness.StartRedis(ctx, b.dir)
			if err != nil {
				return err
			}
			b.track(rd.Proc)
			redisAddr = rd.Addr
		}
		g, err := b.gateway(ctx, "overhead-"+store, engines, store, redisAddr)
		if err != nil {
			return err
		}
		seed := uint64(100 * (si + 1))
		scenarios := []scenario{
			{"1.8k seen + 200 new", func(i int) []byte {
				rr := rand.New(rand.NewPCG(seed, uint64(i)))
				return chatBody(model, prefix, fmt.Sprintf("Request %d. ", i)+text(rr, tailWords), 1)
			}},
			{"2k new", func(i int) []byte {
				rr := rand.New(rand.NewPCG(seed+1, uint64(i)))
				return chatBody(model, "", fmt.Sprintf("Fresh %d/%d. ", seed, i)+text(rr, coldWords), 1)
			}},
		}
		// The prefix is seen once through the gateway before measuring.
		if _, err := post(ctx, newClient(), g.URL(), chatBody(model, prefix, "warm-up", 1)); err != nil {
			return err
		}
		time.Sleep(300 * time.Millisecond) // KV events reach the gateway's index
		for _, sc := range scenarios {
			row, err := b.measure(ctx, store, sc, e, g)
			if err != nil {
				return err
			}
			rows = append(rows, row)
			fmt.Fprintf(b.out, "  measured %s / %s\n", store, sc.name)
		}
		g.Stop(5 * time.Second)
	}
	b.printOverhead(rows)
	return nil
}

// measure runs one scenario: warm-up, N interleaved direct/gateway pairs (latency), then N back-to-back
// gateway requests (CPU) followed by an idle period of the same length (background CPU).
func (b *bench) measure(ctx context.Context, store string, sc scenario, e *harness.Engine, g *harness.Gateway) (overheadRow, error) {
	const warm = 30
	n := b.o.requests
	row := overheadRow{Store: store, Scenario: sc.name}
	// Bodies: direct ones carry the token IDs (the engine's own tokenization) as the gateway would send them.
	total := 2 * (warm + n)
	bodies := make([][]byte, total)
	for i := range total {
		bodies[i] = sc.body(i)
		if i%2 == 0 {
			ids, err := e.Tokenize(ctx, bodies[i])
			if err != nil {
				return row, err
			}
			bodies[i] = withTokenIDs(bodies[i], ids)
		}
	}
	dc, gc := newClient(), newClient()
	var dl, gl, diff []time.Duration
	var cached int64
	for p := range warm + n {
		d, gb := bodies[2*p], bodies[2*p+1]
		var da, ga answer
		var err error
		if p%2 == 0 { // alternate which path goes first
			if da, err = post(ctx, dc, e.URL(), d); err == nil {
				ga, err = post(ctx, gc, g.URL(), gb)
			}
		} else {
			if ga, err = post(ctx, gc, g.URL(), gb); err == nil {
				da, err = post(ctx, dc, e.URL(), d)
			}
		}
		if err != nil {
			return row, err
		}
		if p < warm {
			continue
		}
		dl, gl, diff = append(dl, da.Latency), append(gl, ga.Latency), append(diff, ga.Latency-da.Latency)
		cached += ga.CachedTokens
		row.PromptTokens = ga.PromptTokens
	}
	row.Cached = cached / int64(n)
	row.Direct = [3]time.Duration{quantile(dl, .5), quantile(dl, .9), quantile(dl, .99)}
	row.Gateway = [3]time.Duration{quantile(gl, .5), quantile(gl, .9), quantile(gl, .99)}
	row.PairedP50 = quantile(diff, .5)

	// CPU: wait until the gateway is quiet (the latency phase's KV events indexed), measure its idle rate
	// (scrapes, probes, lease renewals), then run n fresh requests back to back and keep counting until it
	// is quiet again (work the requests cause after answering). Net CPU per request = (CPU from the block's
	// start to quiet − idle rate × that time) / n.
	cpuBodies := make([][]byte, n)
	for i := range n {
		cpuBodies[i] = sc.body(total + i)
	}
	if _, err := waitQuiet(g, -1); err != nil {
		return row, err
	}
	ci0, err := g.CPUTime()
	if err != nil {
		return row, err
	}
	time.Sleep(idleWindow)
	ci1, _ := g.CPUTime()
	idleRate := float64(ci1-ci0) / float64(idleWindow)
	c0, _ := g.CPUTime()
	t0 := time.Now()
	for _, body := range cpuBodies {
		if _, err := post(ctx, gc, g.URL(), body); err != nil {
			return row, err
		}
	}
	c1, _ := g.CPUTime()
	blockEnd := time.Now()
	if _, err := waitQuiet(g, idleRate); err != nil {
		return row, err
	}
	c2, _ := g.CPUTime()
	elapsed := time.Since(t0)
	row.Settle = time.Since(blockEnd) - quietWindow
	row.CPUGross = (c1 - c0) / time.Duration(n)
	idle := time.Duration(idleRate * float64(elapsed))
	row.CPUNet = (c2 - c0 - idle) / time.Duration(n)
	row.CPUIdle = idle / time.Duration(n)
	return row, nil
}

// CPU measurement windows (the /proc tick is 10 ms, so each window spans many ticks).
const (
	quietWindow = 500 * time.Millisecond
	quietMax    = 30 * time.Second
	idleWindow  = 2 * time.Second
)

// waitQuiet waits until one quietWindow of the gateway uses at most idleRate of a CPU plus 2 ticks
// (idleRate < 0: 2 ticks alone), at most quietMax, and returns how long it waited.
func waitQuiet(g *harness.Gateway, idleRate float64) (time.Duration, error) {
	start := time.Now()
	limit := 20*time.Millisecond + time.Duration(max(idleRate, 0)*float64(quietWindow))
	for {
		c0, err := g.CPUTime()
		if err != nil {
			return 0, err
		}
		time.Sleep(quietWindow)
		c1, err := g.CPUTime()
		if err != nil {
			return 0, err
		}
		if c1-c0 <= limit || time.Since(start) > quietMax {
			return time.Since(start), nil
		}
	}
}

func (b *bench) printOverhead(rows []overheadRow) {
	fmt.Fprintf(b.out, "\nGateway overhead (%d interleaved pairs per row; 1 output token; engine at --time-scale 0)\n", b.o.requests)
	w := tabwriter.NewWriter(b.out, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "store\tscenario\tprompt tok\tcached tok\tdirect p50\tgateway p50\tadded p50\tpaired p50\tdirect p99\tgateway p99\tCPU/req\tin block\tidle share\tsettle\t")
	for _, r := range rows {
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Store, r.Scenario, r.PromptTokens, r.Cached,
			us(r.Direct[0]), us(r.Gateway[0]), us(r.added()), us(r.PairedP50), us(r.Direct[2]), us(r.Gateway[2]),
			us(r.cpu()), us(r.CPUGross), us(r.CPUIdle), r.Settle.Round(10*time.Millisecond))
	}
	w.Flush()
	for _, r := range rows {
		if r.Store == config.StoreMemory && r.Scenario == "1.8k seen + 200 new" {
			verdict := func(ok bool) string {
				if ok {
					return "met"
				}
				return "NOT met"
			}
			fmt.Fprintf(b.out, "targets (memory, prefix seen): added p50 %s ≤ %s: %s; CPU/request %s ≤ %s: %s\n",
				us(r.added()), us(targetAddedP50), verdict(r.added() <= targetAddedP50), us(r.cpu()), us(targetCPU),
				verdict(r.cpu() <= targetCPU))
			if b.o.requests < 300 {
				fmt.Fprintln(b.out, "(CPU per request is counted in 10 ms ticks: below 300 requests it is noise)")
			}
		}
	}
}
