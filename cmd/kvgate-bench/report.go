package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// runEnv describes the run for the report's header.
type runEnv struct {
	Workload, Desc    string
	Engines           int
	GPUBlocks         int
	CPUs              int
	Started, Finished time.Time
	Args              []string
}

func chatMessagesBody(msgs []message) []byte {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	out := make([]msg, len(msgs))
	for i, m := range msgs {
		out[i] = msg{m.Role, m.Content}
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": out})
	return b
}

// writeOutputs writes results.json, timeseries.json, report.md and the charts into dir.
func writeOutputs(dir string, env runEnv, rs []result, ts []timeSeries, log io.Writer) error {
	if rs == nil {
		rs = []result{}
	}
	if err := writeJSON(filepath.Join(dir, "results.json"), rs); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(dir, "timeseries.json"), ts); err != nil {
		return err
	}
	charts, err := writeCharts(filepath.Join(dir, "charts"), rs, ts)
	if err != nil {
		return err
	}
	var b strings.Builder
	writeReport(&b, env, rs, charts)
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(log, "wrote %s (results.json, timeseries.json, report.md, %d charts)\n", dir, len(charts))
	return nil
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// loadsOf returns the distinct load levels of rs in order of appearance.
func loadsOf(rs []result) []float64 {
	var out []float64
	for _, r := range rs {
		if !slices.Contains(out, r.Load) {
			out = append(out, r.Load)
		}
	}
	return out
}

func policiesOf(rs []result) []string {
	var out []string
	for _, r := range rs {
		if !slices.Contains(out, r.Policy) {
			out = append(out, r.Policy)
		}
	}
	return out
}

func seedsOf(rs []result) []uint64 {
	var out []uint64
	for _, r := range rs {
		if !slices.Contains(out, r.Seed) {
			out = append(out, r.Seed)
		}
	}
	return out
}

func pick(rs []result, policy string, load float64, seed uint64) *result {
	for i := range rs {
		if rs[i].Policy == policy && rs[i].Load == load && rs[i].Seed == seed && rs[i].Error == "" {
			return &rs[i]
		}
	}
	return nil
}

// bestPeer returns the peer policy's result with the best value of f (lower or higher better).
func bestPeer(rs []result, load float64, seed uint64, f func(*result) float64, lower bool) *result {
	var best *result
	for _, p := range peerPolicies {
		r := pick(rs, p, load, seed)
		if r == nil {
			continue
		}
		if best == nil || (lower && f(r) < f(best)) || (!lower && f(r) > f(best)) {
			best = r
		}
	}
	return best
}

func ratioCell(a, b float64) string {
	if b == 0 || math.IsNaN(a/b) {
		return "–"
	}
	return fmt.Sprintf("%.2f", a/b)
}

func writeReport(w io.Writer, env runEnv, rs []result, charts []string) {
	fmt.Fprintf(w, "# kvgate-bench: %s\n\n", env.Workload)
	fmt.Fprintf(w, "- Workload: %s.\n", env.Desc)
	fmt.Fprintf(w, "- Fleet: %d enginesim processes × %d GPU blocks, one kvgate (memory store).\n", env.Engines, env.GPUBlocks)
	fmt.Fprintf(w, "- Machine: %d CPUs (%s); run %s – %s UTC.\n", env.CPUs, cpuModel(),
		env.Started.Format("2006-01-02 15:04"), env.Finished.Format("15:04"))
	fmt.Fprintf(w, "- Command: `kvgate-bench %s`\n", strings.Join(env.Args, " "))
	fmt.Fprintf(w, "- Times are wall-clock seconds at the client. *hit* is Σ cached / Σ prompt tokens as the engines report them; *oracle* is one infinite cache over the same requests at the same times; *LRU* one LRU cache of the fleet's total GPU blocks. Ratios *vs RR* divide by round-robin's figure, *vs peer* by the best peer policy's (llmd-weighted, sglang-cache-aware, dynamo-cost) on that figure. *load avg* is the machine's 1-minute load average at the run's end, *busy*/*steal* its CPU shares during the run: a busy share near 1 means the box, not the simulated fleet, may have saturated.\n\n")
	seeds := seedsOf(rs)
	for _, seed := range seeds {
		if len(seeds) > 1 {
			fmt.Fprintf(w, "## Seed %d\n\n", seed)
		}
		for _, load := range loadsOf(rs) {
			rr := pick(rs, "round-robin", load, seed)
			var sat, offered float64
			for _, r := range rs {
				if r.Load == load && r.Seed == seed {
					sat, offered = r.SaturationRPS, r.OfferedRPS
					break
				}
			}
			fmt.Fprintf(w, "### Load %g× (%.2f requests/s offered; round-robin saturates at %.2f)\n\n", load, offered, sat)
			fmt.Fprintln(w, "| policy | req | err | 429 | TTFT p50 | TTFT p90 | TTFT p99 | ITL p50 | e2e p90 | req/s | tok/s | hit | oracle | LRU | of oracle | warm hit | warm TTFT p90 | max/mean | TTFT p90 vs RR | hit vs RR | TTFT p90 vs peer | hit vs peer | load avg | busy | steal |")
			fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
			pT := bestPeer(rs, load, seed, func(r *result) float64 { return r.TTFTP90 }, true)
			pH := bestPeer(rs, load, seed, func(r *result) float64 { return r.HitRate }, false)
			for _, p := range policiesOf(rs) {
				r := pick(rs, p, load, seed)
				if r == nil {
					fmt.Fprintf(w, "| %s | error | | | | | | | | | | | | | | | | | | | | | | | |\n", p)
					continue
				}
				vs := func(o *result, f func(*result) float64) string {
					if o == nil {
						return "–"
					}
					return ratioCell(f(r), f(o))
				}
				t90 := func(x *result) float64 { return x.TTFTP90 }
				hit := func(x *result) float64 { return x.HitRate }
				fmt.Fprintf(w, "| %s | %d | %d | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f | %.0f | %.3f | %.3f | %.3f | %.2f | %.3f | %.3f | %.2f | %s | %s | %s | %s | %.2f | %.2f | %.3f |\n",
					p, r.Requests, r.Errors, r.Status429, r.TTFTP50, r.TTFTP90, r.TTFTP99, r.ITLP50, r.E2EP90,
					r.ThroughputRPS, r.OutputTokensRate, r.HitRate, r.OracleHitRate, r.LRUHitRate, r.OfOracle,
					r.WarmHitRate, r.WarmTTFTP90, r.MaxOverMean, vs(rr, t90), vs(rr, hit), vs(pT, t90), vs(pH, hit),
					r.Box.LoadEnd[0], r.Box.Busy, r.Box.Steal)
			}
			fmt.Fprintln(w)
			fmt.Fprintln(w, "Why requests got less than the oracle (answered requests short of it by more than a block: first of their group or conversation; sent to an endpoint that had served none of it; sent to one that had, yet its blocks were evicted; or only unfinished siblings there), what the gateway's index promised (*gateway saw*: matched GPU tokens / prompt tokens of the chosen endpoints), reservations refused and 429s after the queue timeout, and the engines' KV-cache utilization (mean; share of samples with an endpoint ≥ 0.95):")
			fmt.Fprintln(w)
			fmt.Fprintln(w, "| policy | short of oracle | cold | moved | evicted | in flight | hit | gateway saw | refusals | queue 429s | KV use | KV ≥ 0.95 |")
			fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
			for _, p := range policiesOf(rs) {
				r := pick(rs, p, load, seed)
				if r == nil {
					continue
				}
				m := r.Misses
				fmt.Fprintf(w, "| %s | %d / %d | %d | %d | %d | %d | %.3f | %.3f | %d | %d | %.2f | %.2f |\n", p, m.Short, m.Answered,
					m.Cold, m.Moved, m.Evicted, m.InFlight, r.HitRate, r.GatewayMatchRate, r.ReservationRefusals,
					r.QueueTimeouts, r.KVUsageMean, r.KVUsageHigh)
			}
			fmt.Fprintln(w)
			if tt := pick(rs, "three-tier", load, seed); tt != nil && len(tt.RoutingStages) > 0 {
				fmt.Fprint(w, "Gateway routing stages under three-tier (mean / p99 bucket bound, µs): ")
				var names []string
				for st := range tt.RoutingStages {
					names = append(names, st)
				}
				slices.Sort(names)
				for i, st := range names {
					s := tt.RoutingStages[st]
					if i > 0 {
						fmt.Fprint(w, ", ")
					}
					fmt.Fprintf(w, "%s %.0f / %.0f", st, s.MeanSeconds*1e6, s.P99Seconds*1e6)
				}
				fmt.Fprint(w, "\n\n")
			}
		}
	}
	if len(seeds) > 1 {
		writeSeedSpread(w, rs, seeds)
	}
	if len(charts) > 0 {
		fmt.Fprintln(w, "## Charts")
		fmt.Fprintln(w)
		for _, c := range charts {
			fmt.Fprintf(w, "![%s](charts/%s)\n", strings.TrimSuffix(c, ".png"), c)
		}
	}
}

// writeSeedSpread reports, per load and policy, the median and range over seeds of the hit rate's share
// of the oracle, TTFT p90 and the policy's rank by hit rate.
func writeSeedSpread(w io.Writer, rs []result, seeds []uint64) {
	fmt.Fprintf(w, "## Across %d seeds (median [min–max])\n\n", len(seeds))
	for _, load := range loadsOf(rs) {
		fmt.Fprintf(w, "### Load %g×\n\n| policy | hit of oracle | TTFT p90 | rank by hit rate | 429 |\n|---|--:|--:|--:|--:|\n", load)
		ranks := map[string][]float64{}
		for _, seed := range seeds {
			var ps []*result
			for _, p := range policiesOf(rs) {
				if r := pick(rs, p, load, seed); r != nil {
					ps = append(ps, r)
				}
			}
			slices.SortStableFunc(ps, func(a, b *result) int {
				switch {
				case a.HitRate > b.HitRate:
					return -1
				case a.HitRate < b.HitRate:
					return 1
				}
				return 0
			})
			for i, r := range ps {
				ranks[r.Policy] = append(ranks[r.Policy], float64(i+1))
			}
		}
		for _, p := range policiesOf(rs) {
			var of, t90, e []float64
			for _, seed := range seeds {
				if r := pick(rs, p, load, seed); r != nil {
					of, t90, e = append(of, r.OfOracle), append(t90, r.TTFTP90), append(e, float64(r.Status429))
				}
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", p, spread(of, "%.2f"), spread(t90, "%.3f"),
				spread(ranks[p], "%.0f"), spread(e, "%.0f"))
		}
		fmt.Fprintln(w)
	}
}

func spread(v []float64, f string) string {
	if len(v) == 0 {
		return "–"
	}
	s := slices.Clone(v)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return fmt.Sprintf(f+" ["+f+"–"+f+"]", med, s[0], s[len(s)-1])
}
