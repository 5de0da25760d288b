package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/kvgate/kvgate/cmd/enginesim/sim"
	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/gateway/internal/admin"
	"github.com/kvgate/kvgate/kvstore"
)

// writeFile replaces path's content in one rename (as an editor or a ConfigMap update does).
func writeFile(t testing.TB, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// startGatewayFile starts a gateway from the config file at path, watching it.
func startGatewayFile(t testing.TB, path string) *Gateway {
	t.Helper()
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"KVGATE_ADMIN_TOKEN": "admintok"}
	logLevel := slog.LevelWarn
	if testing.Verbose() {
		logLevel = slog.LevelInfo
	}
	g, err := Start(context.Background(), Options{Config: cfg, Secrets: cfg.Secrets(func(k string) string { return env[k] }),
		LoadEncoder: testEncoder, Listener: ln, PolicyCacheDir: policyCache, ConfigPath: path,
		Log: slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		g.Close(ctx)
	})
	return g
}

// epYAML is one endpoint line for engine e named id.
func epYAML(id string, e *sim.Engine) string {
	return fmt.Sprintf("      - {id: %s, engine: enginesim, url: \"http://%s\", kv_events: %q, kv_replay: %q, max_inflight_requests: 64}\n",
		id, e.HTTPAddr(), e.EventsAddr(), e.ReplayAddr())
}

func fileYAML(extra, endpoints string) string {
	return gwYAML(endpoints, "config_watch_interval: 100ms\n"+extra)
}

// adminCall sends an admin request with the test token and decodes the JSON answer into out (if not nil).
func adminCall(t testing.TB, g *Gateway, method, path, body string, out any) int {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+g.Addr()+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer admintok")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, b, err)
		}
	}
	return resp.StatusCode
}

func listEndpoints(t testing.TB, g *Gateway) admin.EndpointList {
	t.Helper()
	var l admin.EndpointList
	if code := adminCall(t, g, http.MethodGet, "/admin/v1/endpoints", "", &l); code != 200 {
		t.Fatalf("GET /admin/v1/endpoints: %d", code)
	}
	return l
}

// tryStates is states(listEndpoints(t, g)) for a wait: a non-200 answer (a 503 while the store is lost
// or before this gateway follows a re-seeded one) renders as "HTTP <code>" instead of failing the test.
func tryStates(t testing.TB, g *Gateway) string {
	t.Helper()
	var l admin.EndpointList
	if code := adminCall(t, g, http.MethodGet, "/admin/v1/endpoints", "", &l); code != 200 {
		return fmt.Sprintf("HTTP %d", code)
	}
	return states(l)
}

// states renders a list as "id:state" sorted by ID, with "(removing)" and "+routed" when set here.
func states(l admin.EndpointList) string {
	var out []string
	for _, v := range l.Endpoints {
		s := v.ID + ":" + v.State
		if v.Removing {
			s += "(removing)"
		}
		if v.Here != nil && v.Here.Routed {
			s += "+routed"
		}
		out = append(out, s)
	}
	return strings.Join(out, " ")
}

// readyEndpoints returns /readyz's "endpoints" detail (admin token).
func readyEndpoints(t testing.TB, g *Gateway) map[string]any {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+g.Addr()+"/readyz", nil)
	req.Header.Set("Authorization", "Bearer admintok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	d, _ := body["endpoints"].(map[string]any)
	return d
}

func mismatchOf(t testing.TB, g *Gateway) []string {
	var out []string
	for _, x := range readyEndpoints(t, g)["config_mismatch"].([]any) {
		out = append(out, x.(string))
	}
	return out
}

// matchOn returns the blocks of prompt's keys that endpoint ep holds in g's index.
func matchOn(t testing.TB, g *Gateway, prompt string, ep string) int {
	t.Helper()
	enc, _ := testEncoder("")
	keys := kvstore.Hasher{}.Keys(enc.EncodeCompletion(prompt), 16, kvstore.ExtraKeys{})
	ms, err := g.Index().Match(context.Background(), "qwen3", keys)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if string(m.Endpoint) == ep {
			return m.GPUBlocks + m.CPUBlocks
		}
	}
	return 0
}

// The file is watched: removing e0 and adding e1 under a running stream on e0 drains e0 (no new requests,
// the stream finishes, then its KV-event subscription stops and its index entries are dropped) and brings
// e1 in with health checks, scraping and KV-event ingestion.
func TestEndpointsFileReloadDrains(t *testing.T) {
	slow := startSims(t, 1, func(c *sim.Config) { c.TimeScale = 1; c.StepOverhead = 15 * time.Millisecond })
	fast := startSims(t, 1, nil)
	e0, e1 := slow[0], fast[0]
	path := filepath.Join(t.TempDir(), "kvgate.yaml")
	writeFile(t, path, fileYAML("", epYAML("e0", e0)))
	g := startGatewayFile(t, path)
	waitSubscribed(t, []*sim.Engine{e0}, g)

	prompt := strings.Repeat("the drained endpoint's cached prefix ", 12)
	if code, hdr, b := post(t, "http://"+g.Addr()+"/v1/completions", `{"model":"qwen3","max_tokens":1,"prompt":"`+prompt+`"}`); code != 200 ||
		hdr.Get("x-kvgate-endpoint") != "e0" {
		t.Fatalf("first request: %d %s %s", code, hdr.Get("x-kvgate-endpoint"), b)
	}
	if !waitFor(3*time.Second, func() bool { return matchOn(t, g, prompt, "e0") >= 3 }) {
		t.Fatalf("e0 never indexed the prompt: %d blocks", matchOn(t, g, prompt, "e0"))
	}

	// A stream of ~120 tokens at 15 ms each runs on e0 while the file changes.
	streamDone := make(chan string, 1)
	started := make(chan struct{})
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+g.Addr()+"/v1/chat/completions", strings.NewReader(
			`{"model":"qwen3","stream":true,"max_tokens":120,"messages":[{"role":"user","content":"tell a long story"}]}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			streamDone <- err.Error()
			return
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		var last string
		n := 0
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "data: ") {
				if n++; n == 2 {
					close(started)
				}
				last = sc.Text()
			}
		}
		streamDone <- fmt.Sprintf("%d %s %s %d", resp.StatusCode, resp.Header.Get("x-kvgate-endpoint"), last, n)
	}()
	select {
	case <-started:
	case s := <-streamDone:
		t.Fatalf("stream: %s", s)
	case <-time.After(5 * time.Second):
		t.Fatal("the stream never started")
	}
	writeFile(t, path, fileYAML("", epYAML("e1", e1)))

	if !waitFor(5*time.Second, func() bool { return states(listEndpoints(t, g)) == "e0:draining(removing) e1:active+routed" }) {
		t.Fatalf("after the reload: %s", states(listEndpoints(t, g)))
	}
	if !waitFor(5*time.Second, func() bool { return g.eps.Load("e1").Healthy }) {
		t.Fatal("e1 never became healthy")
	}
	for i := range 6 {
		code, hdr, b := post(t, "http://"+g.Addr()+"/v1/completions", fmt.Sprintf(`{"model":"qwen3","max_tokens":1,"prompt":"%s %d"}`, prompt, i))
		if code != 200 || hdr.Get("x-kvgate-endpoint") != "e1" {
			t.Fatalf("request %d during the drain: %d %q %s", i, code, hdr.Get("x-kvgate-endpoint"), b)
		}
	}
	// The stream still runs: e0 is still draining, still ingested and indexed.
	if s := states(listEndpoints(t, g)); !strings.Contains(s, "e0:draining(removing)") || len(e0.EventSubscriptions()) == 0 ||
		matchOn(t, g, prompt, "e0") == 0 {
		t.Fatalf("e0 finished draining under a running stream: %s, subscriptions %v, %d blocks", s, e0.EventSubscriptions(), matchOn(t, g, prompt, "e0"))
	}
	select {
	case s := <-streamDone:
		if !strings.HasPrefix(s, "200 e0 data: [DONE]") {
			t.Fatalf("the stream on the draining endpoint: %s", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream never ended")
	}
	if !waitFor(5*time.Second, func() bool { return states(listEndpoints(t, g)) == "e1:active+routed" }) {
		t.Fatalf("e0 never went: %s", states(listEndpoints(t, g)))
	}
	if !waitFor(3*time.Second, func() bool { return len(e0.EventSubscriptions()) == 0 }) {
		t.Fatalf("e0's KV-event subscription still open: %v", e0.EventSubscriptions())
	}
	if n := matchOn(t, g, prompt, "e0"); n != 0 {
		t.Fatalf("e0's index entries kept: %d blocks", n)
	}
	// e1 runs like a configured endpoint: probed, scraped and ingested under its lease.
	if !waitFor(5*time.Second, func() bool { return len(e1.EventSubscriptions()) == 1 }) {
		t.Fatalf("e1 has no KV-event subscriber")
	}
	var ids []string
	for _, s := range g.IngestStats() {
		ids = append(ids, string(s.Endpoint))
	}
	if !slices.Equal(ids, []string{"e1"}) {
		t.Fatalf("ingesters: %v", ids)
	}
	if l := g.eps.Load("e1"); l.Scraped.IsZero() {
		t.Fatalf("e1 never scraped: %+v", l)
	}
	if mm := mismatchOf(t, g); len(mm) != 0 {
		t.Fatalf("file and store disagree: %v", mm)
	}
}

// The admin API: add, change, drain, delete, in the OpenAI error shape; a drain of an endpoint the file
// lists makes /readyz say that the file and the store disagree.
func TestEndpointsAdminAPI(t *testing.T) {
	t.Parallel() // waits on its own engines and gateway only; asserts no latency bound
	engines := startSims(t, 2, nil)
	path := filepath.Join(t.TempDir(), "kvgate.yaml")
	writeFile(t, path, fileYAML("endpoint_drain_timeout: 1m\n", epYAML("e0", engines[0])))
	g := startGatewayFile(t, path)
	type apiErr struct {
		Error struct {
			Type, Code, Param, Message string
		} `json:"error"`
	}
	for _, c := range []struct {
		method, path, body string
		status             int
		code, param        string
	}{
		{"POST", "/admin/v1/endpoints", `{"id":"e1","engine":"enginesim","url":"http://x:1"}`, 400, "invalid_endpoint", "model"},
		{"POST", "/admin/v1/endpoints", `{"model":"qwen3","id":"e1","engine":"enginesim","url":"http://x:1","bogus":1}`, 400, "invalid_endpoint", "endpoint.bogus"},
		{"POST", "/admin/v1/endpoints", `{"model":"qwen3","id":"e1","engine":"tgi","url":"http://x:1"}`, 400, "invalid_endpoint", "endpoint.engine"},
		{"POST", "/admin/v1/endpoints", `{"model":"qwen3","id":"e1","engine":"enginesim","url":"http://x:1","data_parallel_size":99}`, 400, "invalid_endpoint", "endpoint.data_parallel_size"},
		{"POST", "/admin/v1/endpoints", `{"model":"llama","id":"e1","engine":"enginesim","url":"http://x:1"}`, 404, "model_not_found", "model"},
		{"POST", "/admin/v1/endpoints", `not json`, 400, "invalid_argument", ""},
		{"POST", "/admin/v1/endpoints/nope/drain", ``, 404, "endpoint_not_found", "id"},
		{"DELETE", "/admin/v1/endpoints/nope", ``, 404, "endpoint_not_found", "id"},
	} {
		var e apiErr
		if got := adminCall(t, g, c.method, c.path, c.body, &e); got != c.status || e.Error.Code != c.code || e.Error.Param != c.param || e.Error.Message == "" {
			t.Errorf("%s %s %s: %d %+v, want %d %s param %q", c.method, c.path, c.body, got, e.Error, c.status, c.code, c.param)
		}
	}
	// Without the token: 401 before anything is read.
	req, _ := http.NewRequest(http.MethodGet, "http://"+g.Addr()+"/admin/v1/endpoints", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 401 {
		t.Fatalf("no token: %v %v", resp, err)
	}

	e1 := fmt.Sprintf(`{"model":"qwen3","id":"e1","engine":"enginesim","url":"http://%s","kv_events":%q,"max_inflight_requests":8}`,
		engines[1].HTTPAddr(), engines[1].EventsAddr())
	var v admin.EndpointView
	if code := adminCall(t, g, "POST", "/admin/v1/endpoints", e1, &v); code != 201 || v.State != "active" || v.Source != "admin" || v.Model != "qwen3" {
		t.Fatalf("add: %d %+v", code, v)
	}
	if code := adminCall(t, g, "POST", "/admin/v1/endpoints", strings.Replace(e1, `"max_inflight_requests":8`, `"max_inflight_requests":9`, 1), &v); code != 200 ||
		!strings.Contains(string(v.Endpoint), `"max_inflight_requests":9`) {
		t.Fatalf("change: %d %+v", code, v)
	}
	e0 := fmt.Sprintf(`{"model":"qwen3","id":"e0","engine":"enginesim","url":"http://%s","kv_events":%q,"kv_replay":%q,"max_inflight_requests":64}`,
		engines[0].HTTPAddr(), engines[0].EventsAddr(), engines[0].ReplayAddr())
	var e apiErr
	if code := adminCall(t, g, "POST", "/admin/v1/endpoints", strings.Replace(e0, `"max_inflight_requests":64`, `"max_inflight_requests":7`, 1), &e); code != 200 {
		t.Fatalf("changing e0 by the admin API: %d %+v", code, e)
	}
	if !waitFor(5*time.Second, func() bool { return len(engines[1].EventSubscriptions()) == 1 && g.eps.Load("e1").Healthy }) {
		t.Fatal("the added endpoint is not probed or ingested")
	}
	// e0 has other limits in the store than in the file: /readyz says so.
	if mm := mismatchOf(t, g); len(mm) != 1 || !strings.HasPrefix(mm[0], "e0: configured differently in the store") {
		t.Fatalf("mismatch: %v", mm)
	}
	// Drain e1 (no requests in flight): drained after the settle time, kept in the list, not routed.
	if code := adminCall(t, g, "POST", "/admin/v1/endpoints/e1/drain", "", &v); code != 202 || v.State != "draining" || v.Removing || v.DrainSince == "" {
		t.Fatalf("drain: %d %+v", code, v)
	}
	if !waitFor(5*time.Second, func() bool { return states(listEndpoints(t, g)) == "e0:active+routed e1:drained" }) {
		t.Fatalf("after the drain: %s", states(listEndpoints(t, g)))
	}
	if !waitFor(3*time.Second, func() bool { return len(engines[1].EventSubscriptions()) == 0 }) {
		t.Fatalf("a drained endpoint is still ingested: %v", engines[1].EventSubscriptions())
	}
	// Active again, then deleted: a drained endpoint's record goes at once.
	if code := adminCall(t, g, "POST", "/admin/v1/endpoints", e1, &v); code != 200 || v.State != "active" {
		t.Fatalf("re-activate: %d %+v", code, v)
	}
	if code := adminCall(t, g, "POST", "/admin/v1/endpoints/e1/drain", "", &v); code != 202 {
		t.Fatalf("drain again: %d", code)
	}
	if code := adminCall(t, g, "DELETE", "/admin/v1/endpoints/e1", "", &v); code != 202 || !v.Removing {
		t.Fatalf("delete while draining: %d %+v", code, v)
	}
	if !waitFor(5*time.Second, func() bool { return states(listEndpoints(t, g)) == "e0:active+routed" }) {
		t.Fatalf("after the delete: %s", states(listEndpoints(t, g)))
	}
	// Putting the file's own e0 back clears the mismatch.
	if code := adminCall(t, g, "POST", "/admin/v1/endpoints", e0, &v); code != 200 {
		t.Fatalf("restore e0: %d", code)
	}
	if mm := mismatchOf(t, g); len(mm) != 0 {
		t.Fatalf("mismatch after restoring e0: %v", mm)
	}
}

// trafficCounts are the official client's results under a fleet change.
type trafficCounts struct {
	ok, failed, streamOK, streamFailed atomic.Int64
	mu                                 sync.Mutex
	byEndpoint                         map[string]int
	errs                               []string
}

func (c *trafficCounts) note(ep string, err error, stream bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		if len(c.errs) < 5 {
			c.errs = append(c.errs, err.Error())
		}
		if stream {
			c.streamFailed.Add(1)
		} else {
			c.failed.Add(1)
		}
		return
	}
	if stream {
		c.streamOK.Add(1)
	} else {
		c.ok.Add(1)
	}
	c.byEndpoint[ep]++
}

// served counts the requests served so far (streamed and not).
func (c *trafficCounts) served() int64 { return c.ok.Load() + c.streamOK.Load() }

// await waits until cond holds of the counts (called with c.mu held): a load window measured in requests
// served, not in time, so a loaded machine makes it longer instead of emptier.
func (c *trafficCounts) await(t testing.TB, what string, cond func(c *trafficCounts) bool) {
	t.Helper()
	if !waitFor(30*time.Second, func() bool { c.mu.Lock(); defer c.mu.Unlock(); return cond(c) }) {
		c.mu.Lock()
		defer c.mu.Unlock()
		t.Fatalf("traffic: timed out waiting for %s: %d ok, %d streamed ok, %d failed, by endpoint %v, errors %q",
			what, c.ok.Load(), c.streamOK.Load(), c.failed.Load()+c.streamFailed.Load(), c.byEndpoint, c.errs)
	}
}

// steadyTraffic runs workers sending chat completions (every other one streamed) through the gateways in
// turn with the official openai-go client, until stop is closed.
func steadyTraffic(gws []*Gateway, workers int, stop <-chan struct{}) (*trafficCounts, *sync.WaitGroup) {
	c := &trafficCounts{byEndpoint: map[string]int{}}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				cl := client(gws[(w+i)%len(gws)])
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				// A new conversation every 4 requests: its first request is a prefix miss (least load), the
				// next ones follow it (affinity).
				msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(fmt.Sprintf("Conversation %d of worker %d. ", i/4, w) + longSystemPrompt(4)),
					openai.UserMessage(fmt.Sprintf("question %d of worker %d", i, w))}
				var hdr *http.Response
				if i%2 == 0 {
					_, err := cl.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen3", Messages: msgs,
						MaxTokens: openai.Int(4)}, option.WithResponseInto(&hdr))
					ep := ""
					if hdr != nil {
						ep = hdr.Header.Get("x-kvgate-endpoint")
					}
					c.note(ep, err, false)
				} else {
					st := cl.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "qwen3", Messages: msgs,
						MaxTokens: openai.Int(6)}, option.WithResponseInto(&hdr))
					chunks := 0
					for st.Next() {
						chunks++
					}
					err := st.Err()
					if err == nil && chunks < 2 {
						err = fmt.Errorf("stream of %d chunks", chunks)
					}
					ep := ""
					if hdr != nil {
						ep = hdr.Header.Get("x-kvgate-endpoint")
					}
					c.note(ep, err, true)
				}
				cancel()
			}
		})
	}
	return c, &wg
}

// Reload (what SIGHUP calls) applies the file at once; a file that does not parse changes nothing and is
// reported in /readyz until a good one is read.
func TestEndpointsReloadOnDemand(t *testing.T) {
	t.Parallel() // waits on its own engines and gateway only; asserts no latency bound
	engines := startSims(t, 2, nil)
	path := filepath.Join(t.TempDir(), "kvgate.yaml")
	writeFile(t, path, gwYAML(epYAML("e0", engines[0]), "config_watch_interval: 1h\n"))
	g := startGatewayFile(t, path)
	if !waitFor(10*time.Second, func() bool { return states(listEndpoints(t, g)) == "e0:active+routed" }) {
		t.Fatalf("at start: %s", states(listEndpoints(t, g)))
	}
	writeFile(t, path, gwYAML(epYAML("e0", engines[0])+epYAML("e1", engines[1]), "config_watch_interval: 1h\n"))
	time.Sleep(300 * time.Millisecond)
	if s := states(listEndpoints(t, g)); s != "e0:active+routed" {
		t.Fatalf("changed without a reload: %s", s)
	}
	if err := g.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := states(listEndpoints(t, g)); s != "e0:active+routed e1:active+routed" {
		t.Fatalf("after Reload: %s", s)
	}
	writeFile(t, path, "models: [\n")
	var ce *config.Error
	if err := g.Reload(context.Background()); !errors.As(err, &ce) {
		t.Fatalf("reload of a broken file: %v", err)
	}
	if d := readyEndpoints(t, g); d["reload_error"] == nil || states(listEndpoints(t, g)) != "e0:active+routed e1:active+routed" {
		t.Fatalf("after a broken file: %v, %s", d, states(listEndpoints(t, g)))
	}
	writeFile(t, path, gwYAML(epYAML("e1", engines[1]), "config_watch_interval: 1h\n"))
	if err := g.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := readyEndpoints(t, g); d["reload_error"] != nil {
		t.Fatalf("reload error kept: %v", d)
	}
	if !waitFor(5*time.Second, func() bool { return states(listEndpoints(t, g)) == "e1:active+routed" }) {
		t.Fatalf("e0 not removed: %s", states(listEndpoints(t, g)))
	}
}
