package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/kvgate/kvgate/cmd/kvgate-bench/harness"
)

// message is one chat message of a conversation being replayed.
type message struct {
	Role, Content string
}

// record is one sent request as the client saw it. Times are offsets from the run's start, wall clock.
type record struct {
	Session, Turn int
	Group         int // the session's Group
	Start, Finish time.Duration
	TTFT          time.Duration   // to the first content chunk (0: none arrived)
	Gaps          []time.Duration // between content chunks (inter-token latencies)
	OutputTokens  int64
	PromptTokens  int64 // usage.prompt_tokens (engine-reported)
	CachedTokens  int64 // usage.prompt_tokens_details.cached_tokens (engine-reported)
	Endpoint      string
	Status        int // HTTP status; 0 for a transport error
	Err           string
	Chat          bool
	Messages      []message // chat: what was sent
	Prompt        string    // completions: what was sent
	Answer        string
}

// OK reports whether the request was answered in full.
func (r *record) OK() bool { return r.Status == http.StatusOK && r.Err == "" }

// target is where requests go: a gateway (one base URL) or, direct, the engines in rotation.
type target struct {
	name    string
	clients []openai.Client
	ids     []string // direct: endpoint IDs of clients; gateway: nil (the x-kvgate-endpoint header names it)
	model   string
	next    atomic.Uint64
}

func newOpenAIClient(base string) openai.Client {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512, MaxConnsPerHost: 0,
		IdleConnTimeout: time.Minute, DisableCompression: true}}
	return openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0),
		option.WithRequestTimeout(180*time.Second), option.WithHTTPClient(hc))
}

func gatewayTarget(url, model string) *target {
	return &target{name: "gateway", clients: []openai.Client{newOpenAIClient(url)}, model: model}
}

func directTarget(engines []*harness.Engine, model string) *target {
	t := &target{name: "direct", model: model}
	for _, e := range engines {
		t.clients = append(t.clients, newOpenAIClient(e.URL()))
		t.ids = append(t.ids, e.ID)
	}
	return t
}

// send streams one request (chat when rec.Chat, else completions) and fills rec.
func (t *target) send(ctx context.Context, t0 time.Time, rec *record, maxTokens int) {
	i := int(t.next.Add(1)-1) % len(t.clients)
	c := t.clients[i]
	var raw *http.Response
	opts := []option.RequestOption{option.WithResponseInto(&raw)}
	start := time.Now()
	rec.Start = start.Sub(t0)
	var text strings.Builder
	last := time.Time{}
	onContent := func(s string) {
		if s == "" {
			return
		}
		now := time.Now()
		if last.IsZero() {
			rec.TTFT = now.Sub(start)
		} else {
			rec.Gaps = append(rec.Gaps, now.Sub(last))
		}
		last = now
		text.WriteString(s)
	}
	usage := func(u openai.CompletionUsage) {
		if u.PromptTokens > 0 {
			rec.PromptTokens, rec.CachedTokens, rec.OutputTokens = u.PromptTokens, u.PromptTokensDetails.CachedTokens, u.CompletionTokens
		}
	}
	var err error
	if rec.Chat {
		msgs := make([]openai.ChatCompletionMessageParamUnion, len(rec.Messages))
		for j, m := range rec.Messages {
			switch m.Role {
			case "system":
				msgs[j] = openai.SystemMessage(m.Content)
			case "assistant":
				msgs[j] = openai.AssistantMessage(m.Content)
			default:
				msgs[j] = openai.UserMessage(m.Content)
			}
		}
		s := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: t.model, Messages: msgs,
			MaxTokens:     openai.Int(int64(maxTokens)),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}}, opts...)
		for s.Next() {
			ch := s.Current()
			if len(ch.Choices) > 0 {
				onContent(ch.Choices[0].Delta.Content)
			}
			usage(ch.Usage)
		}
		err = s.Err()
		s.Close()
	} else {
		s := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{Model: openai.CompletionNewParamsModel(t.model),
			Prompt:        openai.CompletionNewParamsPromptUnion{OfString: openai.String(rec.Prompt)},
			MaxTokens:     openai.Int(int64(maxTokens)),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}}, opts...)
		for s.Next() {
			ch := s.Current()
			if len(ch.Choices) > 0 {
				onContent(ch.Choices[0].Text)
			}
			usage(ch.Usage)
		}
		err = s.Err()
		s.Close()
	}
	rec.Finish = time.Since(t0)
	rec.Answer = text.String()
	if raw != nil {
		rec.Status = raw.StatusCode
		rec.Endpoint = raw.Header.Get("x-kvgate-endpoint")
	}
	if t.ids != nil {
		rec.Endpoint = t.ids[i]
	}
	if err != nil {
		var ae *openai.Error
		if errors.As(err, &ae) {
			rec.Status = ae.StatusCode
		}
		if !errors.Is(err, io.EOF) {
			rec.Err = firstLine(err.Error())
		}
	}
}

// arrivals says when sessions start: open loop at Rate sessions per second (Poisson), at the workload's
// own offsets divided by Speedup, or closed loop with Concurrency sessions at a time.
type arrivals struct {
	Kind        string // "rate", "trace", "closed"
	Rate        float64
	Speedup     float64
	Concurrency int
	Seed        uint64
	NoThink     bool // closed-loop calibration: turns back to back
}

// runStats are the samples taken while a run went on.
type runStats struct {
	Records []*record
	Wall    time.Duration
	// Running is the per-endpoint running requests (engine-reported) sampled every sampleEvery.
	Running map[string][]float64
	Waiting map[string][]float64
	KVUsage map[string][]float64 // vllm:kv_cache_usage_perc, fraction
}

const sampleEvery = 250 * time.Millisecond

// runWorkload sends w's sessions to t with the given arrivals; nonce prefixes every system prompt or
// prompt head so the run starts with caches that hold nothing of it. engines (may be nil) are sampled for
// running and waiting requests; progress (may be nil) is called with done/total after each tick.
func runWorkload(ctx context.Context, w *workload, t *target, a arrivals, nonce string, engines []*harness.Engine,
	progress func(done, total int, elapsed time.Duration)) *runStats {
	total := w.Requests()
	recs := make([][]*record, len(w.Sessions))
	var done atomic.Int64
	t0 := time.Now()
	runSession := func(si int) {
		s := w.Sessions[si]
		var hist []message
		if w.Chat {
			if s.System != "" {
				hist = append(hist, message{"system", nonce + s.System})
			}
		}
		for ti, tn := range s.Turns {
			if ctx.Err() != nil {
				return
			}
			rec := &record{Session: si, Turn: ti, Group: s.Group, Chat: w.Chat}
			if w.Chat {
				hist = append(hist, message{"user", tn.User})
				rec.Messages = append([]message(nil), hist...)
			} else {
				rec.Prompt = nonce + s.System + tn.User
			}
			t.send(ctx, t0, rec, tn.MaxTokens)
			recs[si] = append(recs[si], rec)
			done.Add(1)
			if !rec.OK() {
				done.Add(int64(len(s.Turns) - ti - 1))
				return // a refused turn ends the conversation (its answer is missing)
			}
			if w.Chat {
				hist = append(hist, message{"assistant", rec.Answer})
			} else if len(s.Turns) > 1 {
				s.System = s.System + tn.User + rec.Answer
			}
			if ti < len(s.Turns)-1 && !a.NoThink && s.Think > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(s.Think):
				}
			}
		}
	}
	stats := &runStats{Running: map[string][]float64{}, Waiting: map[string][]float64{}, KVUsage: map[string][]float64{}}
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		tick := time.NewTicker(sampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			var mu sync.Mutex
			var wg sync.WaitGroup
			run, wait, kv := map[string]float64{}, map[string]float64{}, map[string]float64{}
			for _, e := range engines {
				wg.Go(func() {
					sctx, cancel := context.WithTimeout(ctx, sampleEvery)
					defer cancel()
					m, err := e.Metrics(sctx)
					if err != nil {
						return
					}
					mu.Lock()
					run[e.ID], wait[e.ID] = m.Sum(harness.MetricRunning), m.Sum(harness.MetricWaiting)
					kv[e.ID] = m.Sum("vllm:kv_cache_usage_perc")
					mu.Unlock()
				})
			}
			wg.Wait()
			for _, e := range engines {
				stats.Running[e.ID] = append(stats.Running[e.ID], run[e.ID])
				stats.Waiting[e.ID] = append(stats.Waiting[e.ID], wait[e.ID])
				stats.KVUsage[e.ID] = append(stats.KVUsage[e.ID], kv[e.ID])
			}
			if progress != nil {
				progress(int(done.Load()), total, time.Since(t0))
			}
		}
	})
	var wg sync.WaitGroup
	switch a.Kind {
	case "closed":
		next := atomic.Int64{}
		for range max(a.Concurrency, 1) {
			wg.Go(func() {
				for {
					i := int(next.Add(1) - 1)
					if i >= len(w.Sessions) || ctx.Err() != nil {
						return
					}
					runSession(i)
				}
			})
		}
	default:
		var starts []time.Duration
		if a.Kind == "trace" {
			starts = make([]time.Duration, len(w.Sessions))
			for i, s := range w.Sessions {
				starts[i] = time.Duration(float64(s.At) / a.Speedup)
			}
		} else {
			starts = poissonStarts(len(w.Sessions), a.Rate, a.Seed)
		}
		for i := range w.Sessions {
			if d := starts[i] - time.Since(t0); d > 0 {
				select {
				case <-ctx.Done():
				case <-time.After(d):
				}
			}
			if ctx.Err() != nil {
				break
			}
			wg.Go(func() { runSession(i) })
		}
	}
	wg.Wait()
	stats.Wall = time.Since(t0)
	close(stop)
	sampler.Wait()
	if progress != nil {
		progress(int(done.Load()), total, stats.Wall)
	}
	for _, rs := range recs {
		stats.Records = append(stats.Records, rs...)
	}
	return stats
}

// progressBar draws "label [#####.....] done/total elapsed" on stderr, rewriting one line on a terminal
// (elsewhere, a log file, only the finished line).
func progressBar(label string) func(done, total int, elapsed time.Duration) {
	fi, err := os.Stderr.Stat()
	tty := err == nil && fi.Mode()&os.ModeCharDevice != 0
	return func(done, total int, elapsed time.Duration) {
		if !tty && done < total {
			return
		}
		const width = 30
		n := 0
		if total > 0 {
			n = min(width, done*width/total)
		}
		fmt.Fprintf(os.Stderr, "\r%-34s [%s%s] %4d/%-4d %5.1fs", label, strings.Repeat("#", n),
			strings.Repeat(".", width-n), done, total, elapsed.Seconds())
		if done >= total {
			fmt.Fprintln(os.Stderr)
		}
	}
}

// boxSample is the machine's state at one moment: load averages and cumulative CPU ticks (/proc).
type boxSample struct {
	Load         [3]float64
	Total, Steal uint64 // all ticks of the "cpu" line, and its steal ticks
	Idle         uint64 // idle + iowait ticks
}

func readBox() boxSample {
	var b boxSample
	if raw, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(raw))
		for i := 0; i < 3 && i < len(f); i++ {
			b.Load[i], _ = strconv.ParseFloat(f[i], 64)
		}
	}
	if raw, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(raw), "\n")
		f := strings.Fields(line)
		if len(f) > 8 && f[0] == "cpu" {
			for i, v := range f[1:] {
				x, _ := strconv.ParseUint(v, 10, 64)
				if i >= 8 { // guest and guest_nice are already inside user and nice
					break
				}
				b.Total += x
				switch i {
				case 3, 4:
					b.Idle += x
				case 7:
					b.Steal += x
				}
			}
		}
	}
	return b
}

// boxDelta is the machine over one run: load averages at its end and the CPU shares in between.
type boxDelta struct {
	LoadStart, LoadEnd [3]float64
	Busy, Steal        float64 // fractions of all CPU time: not idle, stolen by the hypervisor
}

func box(a, b boxSample) boxDelta {
	d := boxDelta{LoadStart: a.Load, LoadEnd: b.Load}
	if t := float64(b.Total - a.Total); t > 0 {
		d.Busy = 1 - float64(b.Idle-a.Idle)/t
		d.Steal = float64(b.Steal-a.Steal) / t
	}
	return d
}
