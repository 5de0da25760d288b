package main

import (
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/cmd/kvgate-bench/harness"
	"github.com/kvgate/kvgate/gateway/textmodel"
)

// result is one policy at one load level: one object of results.json. Durations are seconds (wall clock
// at the client); rates are fractions in [0,1]; hit rates are cached prompt tokens over prompt tokens of
// the answered requests.
type result struct {
	Workload string  `json:"workload"`
	Policy   string  `json:"policy"`
	Load     float64 `json:"load"` // multiple of SaturationRPS (0: closed loop)
	Seed     uint64  `json:"seed"`
	Error    string  `json:"error,omitempty"` // the run could not start (policy not activated)

	SaturationRPS float64 `json:"saturation_rps"` // round-robin's calibrated throughput
	OfferedRPS    float64 `json:"offered_rps"`    // arrival rate of the run (load × saturation)

	Requests  int `json:"requests"`   // sent
	Completed int `json:"completed"`  // answered in full
	Errors    int `json:"errors"`     // not answered (429 included)
	Status429 int `json:"status_429"` // refused with 429 (no endpoint had capacity for queue_timeout)

	TTFTP50 float64 `json:"ttft_p50_seconds"`
	TTFTP90 float64 `json:"ttft_p90_seconds"`
	TTFTP99 float64 `json:"ttft_p99_seconds"`
	ITLP50  float64 `json:"itl_p50_seconds"`
	ITLP90  float64 `json:"itl_p90_seconds"`
	E2EP50  float64 `json:"e2e_p50_seconds"`
	E2EP90  float64 `json:"e2e_p90_seconds"`
	E2EP99  float64 `json:"e2e_p99_seconds"`

	ThroughputRPS    float64 `json:"throughput_rps"`     // answered requests per second of the run
	OutputTokensRate float64 `json:"output_tokens_rate"` // output tokens per second of the run
	WallSeconds      float64 `json:"wall_seconds"`

	PromptTokens  int64   `json:"prompt_tokens"`        // engine-reported, answered requests
	CachedTokens  int64   `json:"cached_tokens"`        // engine-reported
	HitRate       float64 `json:"hit_rate"`             // CachedTokens / PromptTokens
	OracleHitRate float64 `json:"oracle_hit_rate"`      // one infinite cache, same requests, same times
	LRUHitRate    float64 `json:"lru_ceiling_hit_rate"` // one LRU cache of the fleet's total GPU blocks
	OfOracle      float64 `json:"hit_rate_of_oracle"`   // HitRate / OracleHitRate

	// Warm figures: the requests after the first --warmup share (by send time).
	WarmRequests      int     `json:"warm_requests"`
	WarmTTFTP50       float64 `json:"warm_ttft_p50_seconds"`
	WarmTTFTP90       float64 `json:"warm_ttft_p90_seconds"`
	WarmHitRate       float64 `json:"warm_hit_rate"`
	WarmOracleHitRate float64 `json:"warm_oracle_hit_rate"`

	RequestsPerEndpoint map[string]int `json:"requests_per_endpoint"`
	MaxOverMean         float64        `json:"max_over_mean_requests"` // busiest endpoint's requests / mean
	// MaxOverMeanRunning is the mean over samples of (max / mean running requests per endpoint).
	MaxOverMeanRunning float64 `json:"max_over_mean_running"`

	// Misses classifies the answered requests that got less than the oracle (by more than a block): why.
	Misses missCounts `json:"misses"`
	// Gateway counters over the run: reservations refused (each retry while queued counts), requests
	// answered 429 after queue_timeout, and the share of prompt tokens the gateway's index said the chosen
	// endpoint held (what the policy saw; the engines' hit rate is what was there).
	ReservationRefusals int64   `json:"reservation_refusals"`
	QueueTimeouts       int64   `json:"queue_timeouts"`
	GatewayMatchRate    float64 `json:"gateway_match_rate"`
	PolicyFallbacks     int64   `json:"policy_fallbacks"`
	// KVUsageMean is the mean over samples and endpoints of the engines' KV-cache utilization; KVUsageHigh
	// the share of samples with an endpoint at ≥ 0.95 (running requests' blocks leave little for cached
	// prefixes).
	KVUsageMean float64 `json:"kv_usage_mean"`
	KVUsageHigh float64 `json:"kv_usage_high_share"`

	RoutingStages map[string]stageStat `json:"routing_stages,omitempty"` // gateway's kvgate_routing_stage_seconds
	Box           boxDelta             `json:"machine"`
}

// missCounts splits the answered requests that the oracle would have served at least one block more:
// Cold, the first of its group (shared-prefix) or nothing earlier shared it; Moved, sent to an endpoint
// that had served none of its group (or, without groups, of the requests the oracle matched) before;
// Evicted, sent to an endpoint that had answered one of its group before it started, yet the blocks were
// gone; InFlight, the endpoint had only unfinished requests of its group (their blocks not yet cached).
type missCounts struct {
	Answered int `json:"answered"`
	Short    int `json:"short_of_oracle"`
	Cold     int `json:"cold"`
	Moved    int `json:"moved"`
	Evicted  int `json:"evicted"`
	InFlight int `json:"in_flight"`
}

// classifyMisses fills missCounts for recs (sorted by start) with the oracle's cached tokens per record.
func classifyMisses(recs []*record, oracle []int64, blockSize int, grouped bool) missCounts {
	var mc missCounts
	type served struct{ finish time.Duration }
	byGroup := map[int]map[string][]served{} // group → endpoint → earlier requests' finish times
	for i, r := range recs {
		if !r.OK() {
			continue
		}
		mc.Answered++
		g := r.Group
		if !grouped {
			g = 0
		}
		eps := byGroup[g]
		if eps == nil {
			eps = map[string][]served{}
			byGroup[g] = eps
		}
		if r.CachedTokens+int64(blockSize) < oracle[i] {
			mc.Short++
			prev := eps[r.Endpoint]
			switch {
			case len(eps) == 0 || oracle[i] == 0:
				mc.Cold++
			case len(prev) == 0:
				mc.Moved++
			default:
				done := false
				for _, p := range prev {
					done = done || p.finish <= r.Start
				}
				if done {
					mc.Evicted++
				} else {
					mc.InFlight++
				}
			}
		}
		eps[r.Endpoint] = append(eps[r.Endpoint], served{r.Finish})
	}
	return mc
}

// stageStat is one routing stage over a run, from the gateway's histogram (bucket bounds: p99 is the
// upper bound of the bucket holding it).
type stageStat struct {
	Count       int64   `json:"count"`
	MeanSeconds float64 `json:"mean_seconds"`
	P99Seconds  float64 `json:"p99_seconds"`
}

func seconds(d time.Duration) float64 { return d.Seconds() }

// fill computes the figures of one run from its records: the oracle replays the prompts as the gateway
// and engines see them (the model's chat template and tokenizer), answers appended at their finish.
func (res *result) fill(st *runStats, m *textmodel.Model, blockSize, lruBlocks int, warmup float64, engines []*harness.Engine) {
	recs := slices.Clone(st.Records)
	slices.SortStableFunc(recs, func(a, b *record) int { return int(a.Start - b.Start) })
	res.Requests = len(recs)
	res.WallSeconds = st.Wall.Seconds()
	or := make([]oracleRequest, len(recs))
	for i, r := range recs {
		or[i] = oracleRequest{Start: r.Start, Finish: r.Finish, Prompt: promptIDs(m, r), OK: r.OK()}
		if r.OK() {
			or[i].Answer = m.EncodeText(r.Answer)
		}
	}
	oc := oracleCached(or, blockSize, lruBlocks)
	warmFrom := int(float64(len(recs)) * warmup)
	var ttft, warmTTFT, itl, e2e []time.Duration
	var warmPrompt, warmCached, warmOracle, warmIDs, oracle, lru, promptIDsTotal int64
	var outTokens int64
	res.RequestsPerEndpoint = map[string]int{}
	for _, e := range engines {
		res.RequestsPerEndpoint[e.ID] = 0
	}
	var first, last time.Duration = -1, 0
	for i, r := range recs {
		if !r.OK() {
			res.Errors++
			if r.Status == 429 {
				res.Status429++
			}
			continue
		}
		res.Completed++
		if first < 0 || r.Start < first {
			first = r.Start
		}
		last = max(last, r.Finish)
		ttft = append(ttft, r.TTFT)
		itl = append(itl, r.Gaps...)
		e2e = append(e2e, r.Finish-r.Start)
		res.PromptTokens += r.PromptTokens
		res.CachedTokens += r.CachedTokens
		outTokens += r.OutputTokens
		oracle += oc.Infinite[i]
		lru += oc.LRU[i]
		promptIDsTotal += int64(len(or[i].Prompt))
		if r.Endpoint != "" {
			res.RequestsPerEndpoint[r.Endpoint]++
		}
		if i >= warmFrom {
			res.WarmRequests++
			warmTTFT = append(warmTTFT, r.TTFT)
			warmPrompt += r.PromptTokens
			warmCached += r.CachedTokens
			warmOracle += oc.Infinite[i]
			warmIDs += int64(len(or[i].Prompt))
		}
	}
	q := func(ds []time.Duration, p float64) float64 { return seconds(quantile(ds, p)) }
	res.TTFTP50, res.TTFTP90, res.TTFTP99 = q(ttft, .5), q(ttft, .9), q(ttft, .99)
	res.ITLP50, res.ITLP90 = q(itl, .5), q(itl, .9)
	res.E2EP50, res.E2EP90, res.E2EP99 = q(e2e, .5), q(e2e, .9), q(e2e, .99)
	res.WarmTTFTP50, res.WarmTTFTP90 = q(warmTTFT, .5), q(warmTTFT, .9)
	if span := (last - first).Seconds(); span > 0 {
		res.ThroughputRPS = float64(res.Completed) / span
		res.OutputTokensRate = float64(outTokens) / span
	}
	res.HitRate = ratio(res.CachedTokens, res.PromptTokens)
	res.OracleHitRate = ratio(oracle, promptIDsTotal)
	res.LRUHitRate = ratio(lru, promptIDsTotal)
	res.OfOracle = safeDiv(res.HitRate, res.OracleHitRate)
	res.WarmHitRate = ratio(warmCached, warmPrompt)
	res.WarmOracleHitRate = ratio(warmOracle, warmIDs)
	maxN, sum := 0, 0
	for _, v := range res.RequestsPerEndpoint {
		maxN = max(maxN, v)
		sum += v
	}
	if sum > 0 && len(res.RequestsPerEndpoint) > 0 {
		res.MaxOverMean = float64(maxN) / (float64(sum) / float64(len(res.RequestsPerEndpoint)))
	}
	res.MaxOverMeanRunning = runningSpread(st.Running)
	grouped := false
	for _, r := range recs {
		grouped = grouped || r.Group != 0
	}
	res.Misses = classifyMisses(recs, oc.Infinite, blockSize, grouped)
	var kvSum float64
	var kvN, kvHigh, samples int
	for _, s := range st.KVUsage {
		samples = max(samples, len(s))
	}
	for i := range samples {
		high := false
		for _, s := range st.KVUsage {
			if i < len(s) {
				kvSum += s[i]
				kvN++
				high = high || s[i] >= 0.95
			}
		}
		if high {
			kvHigh++
		}
	}
	if kvN > 0 {
		res.KVUsageMean = kvSum / float64(kvN)
		res.KVUsageHigh = float64(kvHigh) / float64(samples)
	}
}

// gatewayCounters fills the gateway's counter deltas between two scrapes.
func (res *result) gatewayCounters(before, after harness.Samples) {
	d := func(name string, match ...string) float64 {
		return after.Sum(name, match...) - before.Sum(name, match...)
	}
	res.ReservationRefusals = int64(d("kvgate_reservation_refusals_total"))
	res.QueueTimeouts = int64(d("kvgate_queue_timeouts_total"))
	res.PolicyFallbacks = int64(d("kvgate_policy_fallbacks_total"))
	if p := d("kvgate_prompt_tokens_total"); p > 0 {
		res.GatewayMatchRate = d("kvgate_matched_tokens_total", "tier", "GPU") / p
	}
}

// runningSpread is the mean over samples with anything running of max/mean running per endpoint.
func runningSpread(running map[string][]float64) float64 {
	n := 0
	for _, s := range running {
		n = max(n, len(s))
	}
	var acc float64
	var k int
	for i := range n {
		var mx, sum float64
		for _, s := range running {
			if i < len(s) {
				mx = max(mx, s[i])
				sum += s[i]
			}
		}
		if sum > 0 {
			acc += mx / (sum / float64(len(running)))
			k++
		}
	}
	if k == 0 {
		return 0
	}
	return acc / float64(k)
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func safeDiv(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// promptIDs is the token IDs the engine computes for r's prompt: the chat template over the messages
// (chat) or the encoded prompt (completions).
func promptIDs(m *textmodel.Model, r *record) []uint32 {
	if !r.Chat {
		return m.EncodeCompletion(r.Prompt)
	}
	body := chatMessagesBody(r.Messages)
	_, ids, err := m.EncodeChat(body)
	if err != nil {
		return nil
	}
	return ids
}

// stageDelta turns two scrapes of the gateway's kvgate_routing_stage_seconds into per-stage figures.
func stageDelta(before, after harness.Samples) map[string]stageStat {
	const name = "kvgate_routing_stage_seconds"
	type agg struct {
		sum, count float64
		buckets    map[float64]float64
	}
	read := func(s harness.Samples) map[string]*agg {
		out := map[string]*agg{}
		for _, x := range s {
			st := x.Labels["stage"]
			switch x.Name {
			case name + "_sum", name + "_count", name + "_bucket":
			default:
				continue
			}
			a := out[st]
			if a == nil {
				a = &agg{buckets: map[float64]float64{}}
				out[st] = a
			}
			switch x.Name {
			case name + "_sum":
				a.sum += x.Value
			case name + "_count":
				a.count += x.Value
			default:
				le, err := strconv.ParseFloat(x.Labels["le"], 64)
				if err == nil {
					a.buckets[le] += x.Value
				}
			}
		}
		return out
	}
	b, a := read(before), read(after)
	out := map[string]stageStat{}
	for st, x := range a {
		y := b[st]
		if y == nil {
			y = &agg{buckets: map[float64]float64{}}
		}
		n := x.count - y.count
		if n <= 0 {
			continue
		}
		s := stageStat{Count: int64(n), MeanSeconds: (x.sum - y.sum) / n}
		les := make([]float64, 0, len(x.buckets))
		for le := range x.buckets {
			les = append(les, le)
		}
		slices.Sort(les)
		for _, le := range les {
			if x.buckets[le]-y.buckets[le] >= 0.99*n {
				s.P99Seconds = le
				if math.IsInf(le, 1) {
					s.P99Seconds = -1
				}
				break
			}
		}
		out[st] = s
	}
	return out
}

// timeSeries is one run's figures over time (timeseries.json; the charts): per window of the run, the
// hit rate of the requests sent in it (engine-reported and oracle), and per endpoint its running
// requests at every sample.
type timeSeries struct {
	Workload      string               `json:"workload"`
	Policy        string               `json:"policy"`
	Load          float64              `json:"load"`
	Seed          uint64               `json:"seed"`
	WindowSeconds float64              `json:"window_seconds"`
	HitRate       []float64            `json:"hit_rate"` // per window (NaN-free: -1 when nothing answered)
	SampleSeconds float64              `json:"sample_seconds"`
	Running       map[string][]float64 `json:"running"`
	Waiting       map[string][]float64 `json:"waiting"`
	TTFT          []float64            `json:"ttft_seconds"` // every answered request's, sorted (the CDF)
}

func makeSeries(res *result, st *runStats, m *textmodel.Model, blockSize int) timeSeries {
	ts := timeSeries{Workload: res.Workload, Policy: res.Policy, Load: res.Load, Seed: res.Seed,
		SampleSeconds: sampleEvery.Seconds(), Running: st.Running, Waiting: st.Waiting}
	win := max(time.Second, st.Wall/30)
	ts.WindowSeconds = win.Seconds()
	n := int(st.Wall/win) + 1
	prompt, cached := make([]int64, n), make([]int64, n)
	for _, r := range st.Records {
		if !r.OK() {
			continue
		}
		i := min(int(r.Start/win), n-1)
		prompt[i] += r.PromptTokens
		cached[i] += r.CachedTokens
		ts.TTFT = append(ts.TTFT, r.TTFT.Seconds())
	}
	slices.Sort(ts.TTFT)
	for i := range n {
		if prompt[i] == 0 {
			ts.HitRate = append(ts.HitRate, -1)
			continue
		}
		ts.HitRate = append(ts.HitRate, ratio(cached[i], prompt[i]))
	}
	return ts
}
