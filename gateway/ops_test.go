package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/kvgate/kvgate/cmd/enginesim/sim"
)

// logBuffer collects a gateway's JSON log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// lines returns the decoded log lines whose attributes include every key=value of match.
func (l *logBuffer) lines(match map[string]any) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(l.b.Bytes()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
next:
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			continue
		}
		for k, v := range match {
			if m[k] != v {
				continue next
			}
		}
		out = append(out, m)
	}
	return out
}

// startGatewayLog is startGateway with the gateway's logs (level info) written to logs.
func startGatewayLog(t testing.TB, yaml string, logs *logBuffer) *Gateway {
	t.Helper()
	return startGatewayTo(t, yaml, logs, slog.LevelInfo)
}

// recordingProxy is a real HTTP reverse proxy in front of an engine that records the X-Request-Id of every
// request it forwards.
type recordingProxy struct {
	mu   sync.Mutex
	ids  []string
	hdrs []http.Header
}

func (p *recordingProxy) start(t *testing.T, target string) string {
	t.Helper()
	u, _ := url.Parse("http://" + target)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The body is read whole before proxying: net/http's server closes an unread request body when the
		// handler writes its response header, and the reverse proxy's transport may still be reading it to
		// send it on; that read then fails, the transport closes the engine connection mid-stream, and the
		// gateway sees a stream cut ("ReverseProxy read error during body copy: use of closed network
		// connection"; failed CI once).
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		r.ContentLength = int64(len(b))
		if strings.HasPrefix(r.URL.Path, "/v1/") {
			p.mu.Lock()
			p.ids = append(p.ids, r.Header.Get("X-Request-Id"))
			p.hdrs = append(p.hdrs, r.Header.Clone())
			p.mu.Unlock()
		}
		rp.ServeHTTP(w, r)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func (p *recordingProxy) last() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.ids) == 0 {
		return ""
	}
	return p.ids[len(p.ids)-1]
}

var generatedID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// Issue 17 item 2: the official client reads the request ID from every answer (success, the gateway's own
// errors, a refused key); a valid client ID is kept and reaches the engine, an invalid one is replaced; one
// access-log line per request at info carries the ID, model, endpoint, policy, status, the engine's usage
// (the same numbers the client got), TTFT for streams, the duration in seconds and the retries, and the
// warning about a retried engine carries the same ID.
func TestRequestIDAndAccessLog(t *testing.T) {
	engines := startSims(t, 2, nil)
	var rec recordingProxy
	front := rec.start(t, engines[0].HTTPAddr())
	eps := "      - {id: e0, engine: enginesim, url: \"http://" + front + "\", max_inflight_requests: 64}\n" +
		"      - {id: e1, engine: enginesim, url: \"http://" + engines[1].HTTPAddr() + "\", max_inflight_requests: 64}\n"
	var logs logBuffer
	g := startGatewayLog(t, gwYAML(eps, "client_api_keys_env: KVGATE_TEST_KEYS\n"), &logs)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gateway log:\n%s", logs.String())
		}
	})
	c := openai.NewClient(option.WithBaseURL("http://"+g.Addr()+"/v1"), option.WithAPIKey("ck1"), option.WithMaxRetries(0))
	ctx := context.Background()
	sys := longSystemPrompt(30)
	params := openai.ChatCompletionNewParams{Model: "qwen3", MaxTokens: openai.Int(5),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(sys), openai.UserMessage("Where is my parcel?")}}

	// A valid client ID is kept, returned and sent to the engine; the access line matches the response.
	var resp *http.Response
	var answers []*openai.ChatCompletion
	for i, id := range []string{"client-req-0001", "client-req-0002"} {
		cc, err := c.Chat.Completions.New(ctx, params, option.WithHeader("X-Request-Id", id), option.WithResponseInto(&resp))
		if err != nil {
			t.Fatal(err)
		}
		answers = append(answers, cc)
		if got := resp.Header.Get("X-Request-Id"); got != id {
			t.Fatalf("request %d: X-Request-Id %q, want %q", i, got, id)
		}
		ep := resp.Header.Get("X-Kvgate-Endpoint")
		if ep == "e0" && rec.last() != id {
			t.Fatalf("the engine got X-Request-Id %q, want %q", rec.last(), id)
		}
		ls := logs.lines(map[string]any{"msg": "request", "request_id": id})
		if len(ls) != 1 {
			t.Fatalf("request %d: %d access lines, want 1: %v", i, len(ls), ls)
		}
		l := ls[0]
		u := cc.Usage
		if l["level"] != "INFO" || l["model"] != "qwen3" || l["endpoint_id"] != ep || l["policy"] != resp.Header.Get("X-Kvgate-Policy") ||
			l["status"] != 200.0 || l["stream"] != false || l["retries"] != 0.0 ||
			l["prompt_tokens"] != float64(u.PromptTokens) || l["completion_tokens"] != float64(u.CompletionTokens) ||
			l["cached_tokens"] != float64(u.PromptTokensDetails.CachedTokens) {
			t.Fatalf("request %d: access line %v, usage %+v", i, l, u)
		}
		if d, _ := l["duration_seconds"].(float64); d <= 0 || d > 30 {
			t.Fatalf("duration_seconds %v: not a duration in seconds", l["duration_seconds"])
		}
		if _, ok := l["duration"]; ok {
			t.Fatal("a duration without its unit")
		}
	}
	if answers[1].Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatal("the second identical request found no cached tokens (affinity broken?)")
	}

	// A request reaching e0 (through the recording proxy) sends the gateway's ID upstream. A new prompt
	// may be ranked on either endpoint, so e1's engine refuses the next request once: ranked on e1 first,
	// it is retried on e0.
	if code, _, b := post(t, "http://"+engines[1].HTTPAddr()+"/sim/faults", `{"fail_status":503,"fail_count":1}`); code != 200 {
		t.Fatalf("arm faults: %d %s", code, b)
	}
	p0 := params
	p0.Messages = []openai.ChatCompletionMessageParamUnion{openai.UserMessage("route me to e0")}
	if _, err := c.Chat.Completions.New(ctx, p0, option.WithResponseInto(&resp)); err != nil || resp.Header.Get("X-Kvgate-Endpoint") != "e0" {
		t.Fatalf("a request refused by e1 was not served by e0: %v (endpoint %q)", err, resp.Header.Get("X-Kvgate-Endpoint"))
	}
	if code, _, b := post(t, "http://"+engines[1].HTTPAddr()+"/sim/faults", `{}`); code != 200 {
		t.Fatalf("disarm faults: %d %s", code, b)
	}
	if !generatedID.MatchString(rec.last()) && !strings.HasPrefix(rec.last(), "client-req-") {
		t.Fatalf("engine saw X-Request-Id %q", rec.last())
	}

	// Invalid IDs (bad characters, too long) are replaced by generated ones; no ID gets a fresh one each time.
	seen := map[string]bool{}
	for _, id := range []string{"has space", "quote\"", strings.Repeat("a", 129), ""} {
		var opts []option.RequestOption
		if id != "" {
			opts = append(opts, option.WithHeader("X-Request-Id", id))
		}
		opts = append(opts, option.WithResponseInto(&resp))
		if _, err := c.Chat.Completions.New(ctx, params, opts...); err != nil {
			t.Fatal(err)
		}
		got := resp.Header.Get("X-Request-Id")
		if !generatedID.MatchString(got) || seen[got] {
			t.Fatalf("client ID %q: answered X-Request-Id %q", id, got)
		}
		seen[got] = true
		if n := len(logs.lines(map[string]any{"msg": "request", "request_id": got})); n != 1 {
			t.Fatalf("%d access lines for %s", n, got)
		}
	}

	// Errors carry it too: the gateway's own 404 and a refused key.
	p := params
	p.Model = "no-such-model"
	_, err := c.Chat.Completions.New(ctx, p, option.WithHeader("X-Request-Id", "err-404"))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Response.Header.Get("X-Request-Id") != "err-404" {
		t.Fatalf("404: %v", err)
	}
	if ls := logs.lines(map[string]any{"msg": "request", "request_id": "err-404"}); len(ls) != 1 || ls[0]["status"] != 404.0 ||
		ls[0]["model"] != "no-such-model" || ls[0]["endpoint_id"] != "" {
		t.Fatalf("404 access line: %v", ls)
	}
	bad := openai.NewClient(option.WithBaseURL("http://"+g.Addr()+"/v1"), option.WithAPIKey("wrong"), option.WithMaxRetries(0))
	_, err = bad.Chat.Completions.New(ctx, params, option.WithHeader("X-Request-Id", "err-401"))
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Response.Header.Get("X-Request-Id") != "err-401" {
		t.Fatalf("401: %v", err)
	}
	if ls := logs.lines(map[string]any{"msg": "request", "request_id": "err-401"}); len(ls) != 1 || ls[0]["status"] != 401.0 {
		t.Fatalf("401 access line: %v", ls)
	}

	// A stream: its usage event's numbers and a TTFT below the duration.
	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "qwen3", Messages: params.Messages,
		MaxTokens: openai.Int(6), StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}},
		option.WithHeader("X-Request-Id", "stream-1"))
	var su openai.CompletionUsage
	for stream.Next() {
		if ch := stream.Current(); ch.Usage.CompletionTokens > 0 {
			su = ch.Usage
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	ls := logs.lines(map[string]any{"msg": "request", "request_id": "stream-1"})
	if len(ls) != 1 || su.CompletionTokens != 6 {
		t.Fatalf("stream: lines %v, usage %+v", ls, su)
	}
	l := ls[0]
	ttft, _ := l["ttft_seconds"].(float64)
	dur, _ := l["duration_seconds"].(float64)
	if l["stream"] != true || l["completion_tokens"] != 6.0 || l["prompt_tokens"] != float64(su.PromptTokens) ||
		l["cached_tokens"] != float64(su.PromptTokensDetails.CachedTokens) || ttft <= 0 || ttft > dur {
		t.Fatalf("stream access line %v, usage %+v", l, su)
	}

	// Retries: the engine of the endpoint a new prompt is ranked on first answers 503 to everything, so the
	// request is retried on the other one; its line says how many retries, and each warning about a refusal
	// carries its request ID. Which endpoint a new prompt is ranked on first depends on load ties, so the
	// gateway's explain route names it and that engine is the one armed (the other one is disarmed).
	sims := map[string]string{"e0": engines[0].HTTPAddr(), "e1": engines[1].HTTPAddr()}
	other := map[string]string{"e0": "e1", "e1": "e0"}
	retried := 0
	for i := 0; i < 8 && retried == 0; i++ {
		text := strings.Repeat("retry me ", i+3)
		eb, _ := json.Marshal(map[string]any{"model": "qwen3", "messages": []map[string]string{{"role": "user", "content": text}}})
		var ex struct {
			Ranking []string `json:"ranking"`
		}
		st, _, b := post(t, "http://"+g.Addr()+"/admin/v1/route", string(eb), "Authorization", "Bearer admintok")
		if st != 200 || json.Unmarshal(b, &ex) != nil || len(ex.Ranking) == 0 || sims[ex.Ranking[0]] == "" {
			t.Fatalf("explain: %d %s", st, b)
		}
		first := ex.Ranking[0]
		for ep, f := range map[string]string{first: `{"fail_status":503,"fail_count":-1}`, other[first]: `{}`} {
			if code, _, b := post(t, "http://"+sims[ep]+"/sim/faults", f); code != 200 {
				t.Fatalf("arm faults on %s: %d %s", ep, code, b)
			}
		}
		id := fmt.Sprintf("retry-%d", i)
		metric := `kvgate_upstream_retries_total{endpoint="` + first + `"}`
		before := scrapeMetric(t, "http://"+g.Addr()+"/metrics", metric)
		p := params
		p.Messages = []openai.ChatCompletionMessageParamUnion{openai.UserMessage(text)}
		if _, err := c.Chat.Completions.New(ctx, p, option.WithHeader("X-Request-Id", id), option.WithResponseInto(&resp)); err != nil {
			t.Fatal(err)
		}
		delta := scrapeMetric(t, "http://"+g.Addr()+"/metrics", metric) - before
		ls := logs.lines(map[string]any{"msg": "request", "request_id": id})
		if len(ls) != 1 || ls[0]["retries"] != delta || ls[0]["endpoint_id"] != other[first] {
			t.Fatalf("%s (ranked on %s first): access line %v, retries counted %v", id, first, ls, delta)
		}
		warns := logs.lines(map[string]any{"level": "WARN", "request_id": id})
		if int(delta) != len(warns) {
			t.Fatalf("%s: %d retries, %d warnings with its ID", id, int(delta), len(warns))
		}
		retried += int(delta)
	}
	if retried == 0 {
		t.Fatal("no request ranked on the failing endpoint first was retried (8 prompts explained)")
	}
}

// access_log: off writes no line; a fraction logs every error and about that share of successes.
func TestAccessLogSampling(t *testing.T) {
	engines := startSims(t, 1, nil)
	eps := "      - {id: e0, engine: enginesim, url: \"http://" + engines[0].HTTPAddr() + "\", max_inflight_requests: 64}\n"
	var offLogs, sampledLogs logBuffer
	off := startGatewayLog(t, gwYAML(eps, "access_log: off\n"), &offLogs)
	sampled := startGatewayLog(t, gwYAML(eps, "access_log: 0.25\n"), &sampledLogs)
	const n = 200
	for _, g := range []*Gateway{off, sampled} {
		for i := range n {
			body := `{"model":"qwen3","max_tokens":1,"prompt":"sample ` + strings.Repeat("x ", i%7) + `"}`
			if code, _, b := post(t, "http://"+g.Addr()+"/v1/completions", body); code != 200 {
				t.Fatalf("%d %s", code, b)
			}
		}
		for range 10 {
			post(t, "http://"+g.Addr()+"/v1/completions", `{"model":"nope","prompt":"x"}`)
		}
	}
	if ls := offLogs.lines(map[string]any{"msg": "request"}); len(ls) != 0 {
		t.Fatalf("access_log off wrote %d lines", len(ls))
	}
	ok := len(sampledLogs.lines(map[string]any{"msg": "request", "status": 200.0}))
	errs := len(sampledLogs.lines(map[string]any{"msg": "request", "status": 404.0}))
	// 200 draws at 0.25: mean 50, sd ≈ 6.1; 20..80 is beyond ±4.9 sd.
	if errs != 10 || ok < 20 || ok > 80 {
		t.Fatalf("sampled 0.25: %d of %d successes and %d of 10 errors logged", ok, n, errs)
	}
}

// Issue 17 item 3: after real requests through the official client, /metrics has TTFT and ITL for the two
// streams (an engine at 25 ms a step: ITL about 25 ms, TTFT at least one step and below the duration), a
// duration for each of the three requests, and usage counters equal to the sums of the usage the client
// got (the stream that asked for no usage adds none).
func TestRequestMetrics(t *testing.T) {
	const step = 25 * time.Millisecond
	engines := startSims(t, 1, func(c *sim.Config) {
		c.TimeScale, c.StepOverhead, c.DecodePerSeq, c.PrefillPerToken = 1, step, 0, 0
	})
	g := startGateway(t, gwYAML("      - {id: e0, engine: enginesim, url: \"http://"+engines[0].HTTPAddr()+"\"}\n", ""))
	c := client(g)
	ctx := context.Background()
	msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(longSystemPrompt(20)), openai.UserMessage("Count to ten.")}
	var prompt, cached, completion int64
	add := func(u openai.CompletionUsage) {
		prompt, cached, completion = prompt+u.PromptTokens, cached+u.PromptTokensDetails.CachedTokens, completion+u.CompletionTokens
	}
	cc, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen3", Messages: msgs, MaxTokens: openai.Int(4)})
	if err != nil {
		t.Fatal(err)
	}
	add(cc.Usage)
	// A stream with usage (its prompt now cached), then one without.
	st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "qwen3", Messages: msgs, MaxTokens: openai.Int(10),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}})
	var su openai.CompletionUsage
	for st.Next() {
		if u := st.Current().Usage; u.CompletionTokens > 0 {
			su = u
		}
	}
	if st.Err() != nil || su.CompletionTokens != 10 || su.PromptTokensDetails.CachedTokens == 0 {
		t.Fatalf("stream: %v %+v", st.Err(), su)
	}
	add(su)
	st = c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "qwen3", Messages: msgs, MaxTokens: openai.Int(10)})
	chunks := 0
	for st.Next() {
		chunks++
	}
	if st.Err() != nil || chunks != 11 { // the role chunk and ten tokens
		t.Fatalf("stream without usage: %v, %d chunks", st.Err(), chunks)
	}
	m := func(name string) float64 {
		return scrapeSample(t, g, name+`{endpoint="e0",model="qwen3"}`)
	}
	if n := m("kvgate_request_duration_seconds_count"); n != 3 {
		t.Fatalf("durations observed: %v, want 3", n)
	}
	if n := m("kvgate_time_to_first_token_seconds_count"); n != 2 {
		t.Fatalf("TTFTs observed: %v, want 2", n)
	}
	if n := m("kvgate_inter_token_latency_seconds_count"); n != 2 {
		t.Fatalf("ITLs observed: %v, want 2", n)
	}
	itl := m("kvgate_inter_token_latency_seconds_sum") / 2
	if itl < 0.8*step.Seconds() || itl > 4*step.Seconds() {
		t.Fatalf("mean ITL %.4f s for an engine at %v a token", itl, step)
	}
	ttft := m("kvgate_time_to_first_token_seconds_sum") / 2
	if ttft < step.Seconds() || ttft*2 > m("kvgate_request_duration_seconds_sum") {
		t.Fatalf("mean TTFT %.4f s (one step is %v; durations sum %.3f s)", ttft, step, m("kvgate_request_duration_seconds_sum"))
	}
	// Each stream takes at least its ten steps; the TTFT buckets say none waited 10 s.
	if m("kvgate_request_duration_seconds_sum") < 24*step.Seconds() {
		t.Fatalf("durations sum %.3f s: under the streams' 24 steps", m("kvgate_request_duration_seconds_sum"))
	}
	if b := scrapeSample(t, g, `kvgate_time_to_first_token_seconds_bucket{endpoint="e0",model="qwen3",le="10"}`); b != 2 {
		t.Fatalf("TTFT le=10 bucket %v", b)
	}
	if p, ca, co := m("kvgate_usage_prompt_tokens_total"), m("kvgate_usage_cached_tokens_total"), m("kvgate_usage_completion_tokens_total"); p != float64(prompt) ||
		ca != float64(cached) || co != float64(completion) || co != 14 {
		t.Fatalf("usage counters prompt %v cached %v completion %v; the client got %d %d %d", p, ca, co, prompt, cached, completion)
	}
}
