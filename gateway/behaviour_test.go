package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/cmd/enginesim/sim"
	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/plugins"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func chatBody(stream bool, maxTokens int, content string) string {
	return fmt.Sprintf(`{"model":"qwen3","stream":%v,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, stream, maxTokens, content)
}

func inflight(t *testing.T, g *Gateway) int64 {
	t.Helper()
	var ids []kvstore.EndpointID
	for _, e := range g.eps.Endpoints() {
		ids = append(ids, kvstore.EndpointID(e.ID))
	}
	m, err := g.Reservations().InFlight(context.Background(), ids)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, c := range m {
		n += c.Requests
	}
	return n
}

// SSE events are forwarded as the engine produces them, not buffered: with 60 ms engine steps the events
// of one response arrive spread over time.
func TestStreamIsPaced(t *testing.T) {
	engines := startSims(t, 1, func(c *sim.Config) { c.TimeScale = 1; c.StepOverhead = 60 * time.Millisecond })
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), ""))
	resp, err := http.Post("http://"+g.Addr()+"/v1/chat/completions", "application/json",
		strings.NewReader(chatBody(true, 10, "count to ten")))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("content type %q", ct)
	}
	var arrivals []time.Time
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			arrivals = append(arrivals, time.Now())
			done = done || sc.Text() == "data: [DONE]"
		}
	}
	if !done || len(arrivals) < 10 {
		t.Fatalf("%d events, done=%v", len(arrivals), done)
	}
	// 10 tokens at ≥ 60 ms per step: a buffered proxy would deliver them all at once.
	if spread := arrivals[len(arrivals)-1].Sub(arrivals[0]); spread < 300*time.Millisecond {
		t.Fatalf("events arrived within %v: not streamed", spread)
	}
	// stream_options were not forced on: no usage chunk was requested, so none came (checked by count of
	// JSON chunks carrying "usage" being zero is engine-specific; the body is passed through as sent).
}

// A client that disconnects stops the engine's generation and releases its lease within 1 s, streaming and
// not.
func TestClientDisconnectCancelsUpstream(t *testing.T) {
	engines := startSims(t, 1, func(c *sim.Config) { c.TimeScale = 1; c.StepOverhead = 20 * time.Millisecond })
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), ""))
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+g.Addr()+"/v1/chat/completions",
				strings.NewReader(chatBody(stream, 2000, "write a very long story")))
			req.Header.Set("Content-Type", "application/json")
			errc := make(chan error, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					// read one event, then go away
					br := bufio.NewReader(resp.Body)
					br.ReadString('\n')
					cancel()
					resp.Body.Close()
				}
				errc <- err
			}()
			if !waitFor(3*time.Second, func() bool { return engines[0].Stats().Running == 1 }) {
				t.Fatal("engine never started the request")
			}
			if inflight(t, g) != 1 {
				t.Fatalf("in flight %d", inflight(t, g))
			}
			time.Sleep(150 * time.Millisecond)
			cancel()
			gone := time.Now()
			<-errc
			if !waitFor(time.Second, func() bool { return engines[0].Stats().Running == 0 && inflight(t, g) == 0 }) {
				t.Fatalf("after 1 s: engine running %d, leases %d", engines[0].Stats().Running, inflight(t, g))
			}
			t.Logf("engine stopped and lease released %v after the disconnect", time.Since(gone))
		})
	}
	if n := metricValue(g.Metrics().ClientDisconnects.WithLabelValues("qwen3", "false")); n != 1 {
		t.Errorf("non-streaming disconnects counted %v", n)
	}
}

// 429 after queue_timeout when the only endpoint is full; a queued request proceeds when capacity frees.
func TestQueueTimeoutAndQueueing(t *testing.T) {
	engines := startSims(t, 1, func(c *sim.Config) { c.TimeScale = 1; c.StepOverhead = 20 * time.Millisecond })
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 1), ""))
	base := "http://" + g.Addr()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hold := func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions",
			strings.NewReader(chatBody(true, 2000, "hold the slot")))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	go hold()
	if !waitFor(3*time.Second, func() bool { return inflight(t, g) == 1 }) {
		t.Fatal("first request never reserved")
	}
	start := time.Now()
	st, _, b := post(t, base+"/v1/completions", `{"model":"qwen3","prompt":"hi","max_tokens":1}`)
	waited := time.Since(start)
	if st != 429 || !strings.Contains(string(b), `"code":"no_capacity"`) {
		t.Fatalf("full: %d %s", st, b)
	}
	if waited < 350*time.Millisecond {
		t.Fatalf("answered 429 after %v, before the 400ms queue timeout", waited)
	}
	// Queue a request, then free the slot: the queued one is served.
	type res struct {
		st int
		b  []byte
	}
	rc := make(chan res, 1)
	go func() {
		st, _, b := post(t, base+"/v1/completions", `{"model":"qwen3","prompt":"hi","max_tokens":1}`)
		rc <- res{st, b}
	}()
	// Free the slot once the second request is queued (refused, waiting), not after a guessed sleep.
	if !waitFor(3*time.Second, func() bool { return metricValue(g.Metrics().Queued.WithLabelValues("qwen3")) == 1 }) {
		t.Fatal("the second request never queued")
	}
	cancel()
	if r := <-rc; r.st != 200 {
		t.Fatalf("queued request: %d %s", r.st, r.b)
	}
	if n := metricValue(g.Metrics().QueueTimeouts.WithLabelValues("qwen3")); n != 1 {
		t.Fatalf("queue timeouts %v", n)
	}
	if n := metricValue(g.Metrics().Queued.WithLabelValues("qwen3")); n != 0 {
		t.Fatalf("%v requests still counted as queued after both ended", n)
	}
}

func TestNoHealthyEndpoint(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	g := startGateway(t, gwYAML(fmt.Sprintf("      - {id: dead, engine: vllm, url: \"http://%s\"}\n", addr), ""))
	st, _, b := post(t, "http://"+g.Addr()+"/v1/chat/completions", chatBody(false, 1, "x"))
	if st != 503 || !strings.Contains(string(b), "no_healthy_endpoint") {
		t.Fatalf("%d %s", st, b)
	}
	resp, err := http.Get("http://" + g.Addr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Fatalf("readyz %d", resp.StatusCode)
	}
}

// fakeEngine is a real HTTP server speaking just enough of vLLM for the proxy tests: it records bodies.
type fakeEngine struct {
	srv     *httptest.Server
	waiting int
	mu      sync.Mutex
	bodies  []string
	calls   atomic.Int32
	handler func(w http.ResponseWriter, r *http.Request, body []byte)
}

func newFakeEngine(t *testing.T, waiting int, h func(w http.ResponseWriter, r *http.Request, body []byte)) *fakeEngine {
	return newFakeEngineIdle(t, waiting, 0, h)
}

// newFakeEngineIdle is newFakeEngine whose server closes keep-alive connections idle for idle (0: never).
func newFakeEngineIdle(t *testing.T, waiting int, idle time.Duration, h func(w http.ResponseWriter, r *http.Request, body []byte)) *fakeEngine {
	f := &fakeEngine{waiting: waiting, handler: h}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			return
		case "/tokenize", "/v1/tokenize":
			// No tokenize route: the drift guard never verifies a fake engine, so its chat requests keep
			// their original bodies (TestChatTokenIDs* cover token IDs on chat with real simulated engines).
			http.NotFound(w, r)
			return
		case "/metrics":
			fmt.Fprintf(w, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"q\"} %d\nvllm:num_requests_running{model_name=\"q\"} 0\nvllm:kv_cache_usage_perc{model_name=\"q\"} 0.25\n", f.waiting)
			return
		}
		b, _ := io.ReadAll(r.Body)
		f.calls.Add(1)
		f.mu.Lock()
		f.bodies = append(f.bodies, string(b))
		f.mu.Unlock()
		f.handler(w, r, b)
	}))
	f.srv.Config.IdleTimeout = idle
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

func okCompletion(w http.ResponseWriter, _ *http.Request, _ []byte) {
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
}

// An engine's refusal (503) before the first response byte is retried on the next ranked endpoint (a
// request an engine received and then dropped is not: TestNoDuplicateGenerations); vLLM chat to an engine
// the drift guard has not verified (this fake has no /tokenize) gets the client's bytes untouched, vLLM
// completions get a token-ID prompt spliced in with the rest kept as sent.
func TestRetryAndBodiesPerEngineKind(t *testing.T) {
	flaky := newFakeEngine(t, 0, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	good := newFakeEngine(t, 5, okCompletion)
	eps := fmt.Sprintf("      - {id: flaky, engine: vllm, url: %q}\n      - {id: good, engine: vllm, url: %q}\n", flaky.srv.URL, good.srv.URL)
	g := startGateway(t, gwYAML(eps, ""))
	chat := `{"model":"qwen3",  "messages":[{"role":"user","content":"hi"}], "x_vendor":{"keep": [1, 2.50]}}`
	st, h, b := post(t, "http://"+g.Addr()+"/v1/chat/completions", chat)
	if st != 200 || h.Get("x-kvgate-endpoint") != "good" {
		t.Fatalf("%d %s %v", st, b, h)
	}
	if flaky.calls.Load() < 1 {
		t.Fatal("the less loaded endpoint was not tried first")
	}
	if n := metricValue(g.Metrics().UpstreamRetries.WithLabelValues("flaky")); n < 1 {
		t.Fatalf("retries %v", n)
	}
	good.mu.Lock()
	got := good.bodies[0]
	good.mu.Unlock()
	if got != chat {
		t.Fatalf("vllm chat body changed:\n got %s\nwant %s", got, chat)
	}
	comp := `{"model":"qwen3","prompt":"Hello world","x_vendor":{"keep":true},"stream_options":{"include_usage":false}}`
	if st, _, b := post(t, "http://"+g.Addr()+"/v1/completions", comp); st != 200 {
		t.Fatalf("%d %s", st, b)
	}
	good.mu.Lock()
	got = good.bodies[len(good.bodies)-1]
	good.mu.Unlock()
	ids := qwen.EncodeCompletion("Hello world")
	want := strings.Replace(comp, `"Hello world"`, strings.ReplaceAll(fmt.Sprint(ids), " ", ","), 1)
	if got != want {
		t.Fatalf("vllm completions body:\n got %s\nwant %s", got, want)
	}
}

// Upstream 4xx bodies pass through; a stale keep-alive connection closed by the engine is not an error.
func TestUpstreamStatusAndStaleConnections(t *testing.T) {
	eng := newFakeEngineIdle(t, 0, 30*time.Millisecond, func(w http.ResponseWriter, _ *http.Request, b []byte) {
		if strings.Contains(string(b), "bad") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(422)
			io.WriteString(w, `{"object":"error","message":"engine says no","type":"BadRequestError","code":422}`)
			return
		}
		okCompletion(w, nil, b)
	})
	g := startGateway(t, gwYAML(fmt.Sprintf("      - {id: e, engine: sglang, url: %q}\n", eng.srv.URL), ""))
	st, _, b := post(t, "http://"+g.Addr()+"/v1/chat/completions", chatBody(false, 1, "bad"))
	if st != 422 || string(b) != `{"object":"error","message":"engine says no","type":"BadRequestError","code":422}` {
		t.Fatalf("%d %s", st, b)
	}
	for range 4 {
		time.Sleep(80 * time.Millisecond) // the engine closes the idle connection meanwhile
		if st, _, b := post(t, "http://"+g.Addr()+"/v1/chat/completions", chatBody(false, 1, "fine")); st != 200 {
			t.Fatalf("after idle close: %d %s", st, b)
		}
	}
}

// Explain returns the decision without forwarding; policy upload, activation and rollback change the
// x-kvgate-policy header.
func TestExplainAndPolicies(t *testing.T) {
	t.Parallel() // waits on its own engines and gateway only; asserts no latency bound
	engines := startSims(t, 3, nil)
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), ""))
	waitSubscribed(t, engines, g)
	base := "http://" + g.Addr()
	body := `{"model":"qwen3","max_tokens":2,"messages":[{"role":"system","content":` + fmt.Sprintf("%q", longSystemPrompt(30)) + `},{"role":"user","content":"hi"}]}`
	blocksBefore := map[string]uint64{} // blocks each endpoint's events have added to the index so far
	for _, s := range g.IngestStats() {
		blocksBefore[string(s.Endpoint)] = s.Blocks
	}
	st, h, _ := post(t, base+"/v1/chat/completions", body)
	if st != 200 {
		t.Fatal(st)
	}
	ep := h.Get("x-kvgate-endpoint")
	auth := []string{"Authorization", "Bearer admintok"}
	var ex struct {
		PromptTokens int    `json:"prompt_tokens"`
		Blocks       int    `json:"blocks"`
		Chosen       string `json:"chosen"`
		Policy       string `json:"policy"`
		Ranking      []string
		Endpoints    []struct {
			ID        string  `json:"id"`
			GPUBlocks int     `json:"gpu_blocks"`
			MatchRate float64 `json:"match_rate"`
		} `json:"endpoints"`
	}
	// Wait for the engine's events to confirm the prompt's blocks: the serving endpoint's ingester has
	// added at least that many blocks to the index since the request (the speculative entry alone would
	// already give the match below, so the wait is on the events themselves).
	_, promptIDs, _ := qwen.EncodeChat([]byte(body))
	if !waitFor(10*time.Second, func() bool {
		for _, s := range g.IngestStats() {
			if string(s.Endpoint) == ep {
				return s.Blocks-blocksBefore[ep] >= uint64(len(promptIDs)/16)
			}
		}
		return false
	}) {
		t.Fatalf("the engine's events never confirmed the %d blocks on %s: %+v", len(promptIDs)/16, ep, g.IngestStats())
	}
	st, _, b := post(t, base+"/admin/v1/route", body, auth...)
	if st != 200 || json.Unmarshal(b, &ex) != nil {
		t.Fatalf("%d %s", st, b)
	}
	_, ids, _ := qwen.EncodeChat([]byte(body))
	if ex.PromptTokens != len(ids) || ex.Blocks != len(ids)/16 || ex.Chosen != ep || len(ex.Ranking) != 3 || ex.Ranking[0] != ep {
		t.Fatalf("explain %+v (prompt %d tokens, routed to %s)\n%s", ex, len(ids), ep, b)
	}
	for _, e := range ex.Endpoints {
		if (e.ID == ep) != (e.GPUBlocks == ex.Blocks) {
			t.Fatalf("match for %s: %+v", ep, ex.Endpoints)
		}
	}
	t.Logf("explain: %s", b)

	// Upload the built-in module under another name, activate it, roll back.
	req, _ := http.NewRequest(http.MethodPut, base+"/admin/v1/policies/tt2", strings.NewReader(string(plugins.BuiltinWasm)))
	req.Header.Set("Authorization", "Bearer admintok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var up struct {
		Version  string `json:"version"`
		Accepted bool   `json:"accepted"`
	}
	json.NewDecoder(resp.Body).Decode(&up)
	resp.Body.Close()
	if resp.StatusCode != 201 || !up.Accepted || !strings.HasPrefix(up.Version, "tt2@") {
		t.Fatalf("upload %d %+v", resp.StatusCode, up)
	}
	req, _ = http.NewRequest(http.MethodPut, base+"/admin/v1/policies/junk", strings.NewReader("not wasm at all"))
	req.Header.Set("Authorization", "Bearer admintok")
	resp, _ = http.DefaultClient.Do(req)
	resp.Body.Close()
	if resp.StatusCode != 422 {
		t.Fatalf("junk upload %d", resp.StatusCode)
	}
	st, _, b = post(t, base+"/admin/v1/policies/activate", `{"model":"qwen3","version":"`+up.Version[:4+10]+`","config":{"imbalance_threshold":4}}`, auth...)
	if st != 200 {
		t.Fatalf("activate %d %s", st, b)
	}
	_, h, _ = post(t, base+"/v1/completions", `{"model":"qwen3","prompt":"x","max_tokens":1}`)
	if got := h.Get("x-kvgate-policy"); got != up.Version[:4+12] {
		t.Fatalf("policy header %q, want %q", got, up.Version[:16])
	}
	st, _, b = post(t, base+"/admin/v1/policies/rollback", `{"model":"qwen3"}`, auth...)
	if st != 200 || !strings.Contains(string(b), "three-tier@") {
		t.Fatalf("rollback %d %s", st, b)
	}
	_, h, _ = post(t, base+"/v1/completions", `{"model":"qwen3","prompt":"x","max_tokens":1}`)
	if got := h.Get("x-kvgate-policy"); !strings.HasPrefix(got, "three-tier@") {
		t.Fatalf("after rollback %q", got)
	}
	req, _ = http.NewRequest(http.MethodGet, base+"/admin/v1/policies", nil)
	req.Header.Set("Authorization", "Bearer admintok")
	resp, _ = http.DefaultClient.Do(req)
	lb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(lb), up.Version) {
		t.Fatalf("list: %s", lb)
	}
}

// A multi-MB long-context body passes with the default body limit.
func TestLargeBody(t *testing.T) {
	eng := newFakeEngine(t, 0, okCompletion)
	g := startGateway(t, gwYAML(fmt.Sprintf("      - {id: e, engine: sglang, url: %q}\n", eng.srv.URL), ""))
	big := strings.Repeat("lorem ipsum dolor sit amet ", 200000) // 5.4 MB
	st, _, b := post(t, "http://"+g.Addr()+"/v1/completions", fmt.Sprintf(`{"model":"qwen3","prompt":%q,"max_tokens":1}`, big))
	if st != 200 {
		t.Fatalf("%d %.200s", st, b)
	}
	eng.mu.Lock()
	n := len(eng.bodies[0])
	eng.mu.Unlock()
	if n < 5_000_000 {
		t.Fatalf("engine got %d bytes", n)
	}
}

// metricValue reads a counter or gauge.
func metricValue(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

// Every kvgate_* metric the Grafana dashboard queries is exported by a running gateway.
func TestGrafanaDashboardMetrics(t *testing.T) {
	dash, err := os.ReadFile("../examples/grafana/kvgate.json")
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal(dash, &v); err != nil {
		t.Fatal(err)
	}
	engines := startSims(t, 1, nil)
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), ""))
	post(t, "http://"+g.Addr()+"/v1/completions", `{"model":"qwen3","prompt":"warm up the counters","max_tokens":1}`)
	waitFor(2*time.Second, func() bool { return len(g.IngestStats()) == 1 })
	resp, err := http.Get("http://" + g.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	names := regexp.MustCompile(`kvgate_[a-z_]+`).FindAllString(string(dash), -1)
	for _, n := range names {
		base := strings.TrimSuffix(n, "_bucket")
		if !strings.Contains(string(page), "# TYPE "+base+" ") {
			t.Errorf("dashboard queries %s; /metrics has no %s", n, base)
		}
	}
	// The policy host's own counters are exported beside the gateway's (one routed request: one call).
	if !regexp.MustCompile(`(?m)^kvgate_policy_calls_total [1-9]`).Match(page) {
		t.Errorf("/metrics lacks the policy host's kvgate_policy_calls_total > 0")
	}
	if len(names) < 15 {
		t.Fatalf("only %d metric references", len(names))
	}
}

// An engine that dies mid-stream: the client sees the chunks sent so far, then one error event and the end
// of the stream (no [DONE]); the request is not retried and its lease is released.
func TestEngineDiesMidStream(t *testing.T) {
	engines := startSims(t, 2, func(c *sim.Config) {
		c.Faults = sim.Faults{CloseAfterChunks: 3, CloseCount: -1}
	})
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), ""))
	resp, err := http.Post("http://"+g.Addr()+"/v1/chat/completions", "application/json",
		strings.NewReader(chatBody(true, 50, "tell me a story")))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("client read: %v", err)
	}
	events := strings.Split(strings.TrimSpace(string(b)), "\n\n")
	last := events[len(events)-1]
	if resp.StatusCode != 200 || len(events) != 4 || !strings.Contains(last, `"code":"upstream_error"`) ||
		strings.Contains(string(b), "[DONE]") {
		t.Fatalf("status %d, %d events:\n%s", resp.StatusCode, len(events), b)
	}
	if !waitFor(time.Second, func() bool { return inflight(t, g) == 0 }) {
		t.Fatal("lease not released")
	}
	if n := metricValue(g.Metrics().Requests.WithLabelValues("qwen3", resp.Header.Get("x-kvgate-endpoint"), "502")); n != 1 {
		t.Fatalf("502 count %v", n)
	}
}
