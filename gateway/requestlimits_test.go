package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore"
)

// Request limits and refusals: token counts and n in the reservation cost, the in-flight limit's 429,
// the prompt-length limit, client error messages, and a store refusal that is not an outage (on real
// simulated engines and a real gateway).

// readyStore returns /readyz's store section.
func readyStore(t *testing.T, g *Gateway) (down bool, loadOnly uint64) {
	t.Helper()
	resp, err := http.Get("http://" + g.Addr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Degraded bool `json:"degraded"`
		Store    struct {
			Down             bool   `json:"down"`
			LoadOnlyRequests uint64 `json:"load_only_requests"`
		} `json:"store"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return body.Store.Down || body.Degraded, body.Store.LoadOnlyRequests
}

// A max_tokens near MaxInt64 once panicked the simulator and overflowed the gateway's reservation cost (a
// negative cost, refused by the store as an invalid argument, which switched the memory store "down" for
// good). Now the engine answers its own 400, the store stays up and routing keeps using the index; integral
// floats such as 2.0 are accepted as OpenAI and vLLM accept them.
func TestHugeMaxTokens(t *testing.T) {
	engines := startSims(t, 1, nil)
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), ""))
	base := "http://" + g.Addr()
	for _, field := range []string{"max_tokens", "max_completion_tokens"} {
		for _, v := range []string{"9223372036854775807", "9223372036854775808", "1e300"} {
			st, h, b := post(t, base+"/v1/chat/completions",
				`{"model":"qwen3","messages":[{"role":"user","content":"x"}],"`+field+`":`+v+`}`)
			if st != 400 || h.Get("x-kvgate-endpoint") != "e0" || !strings.Contains(string(b), "maximum context length") {
				t.Fatalf("%s=%s: %d %s %v", field, v, st, b, h)
			}
		}
		st, h, b := post(t, base+"/v1/chat/completions",
			`{"model":"qwen3","messages":[{"role":"user","content":"x"}],"`+field+`":-1}`)
		if st != 400 || h.Get("x-kvgate-endpoint") != "" || !strings.Contains(string(b), `"param":"`+field+`"`) {
			t.Fatalf("%s=-1: %d %s", field, st, b)
		}
	}
	if down, loadOnly := readyStore(t, g); down || loadOnly != 0 {
		t.Fatalf("store down %v, load-only requests %d after huge max_tokens", down, loadOnly)
	}
	for _, field := range []string{"max_tokens", "max_completion_tokens"} {
		st, h, b := post(t, base+"/v1/chat/completions",
			`{"model":"qwen3","messages":[{"role":"user","content":"x"}],"`+field+`":2.0}`)
		var out struct {
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if st != 200 || json.Unmarshal(b, &out) != nil || out.Usage.CompletionTokens != 2 {
			t.Fatalf("%s=2.0: %d %s", field, st, b)
		}
		if pol := h.Get("x-kvgate-policy"); pol == "three-tier@native" {
			t.Fatalf("%s=2.0 routed load-only (%s)", field, pol)
		}
	}
	if down, loadOnly := readyStore(t, g); down || loadOnly != 0 {
		t.Fatalf("store down %v, load-only requests %d", down, loadOnly)
	}
}

// A store error that is a refused argument is not an outage: with the memory store (which nothing probes
// back up) it once switched the gateway to load-only routing for good. An endpoint ID with a tab is refused
// by the index's Record (kvstore.ErrInvalidArgument) on every request; routing must stay index-based.
func TestStoreRefusalIsNotAnOutage(t *testing.T) {
	engines := startSims(t, 1, nil)
	yaml := gwYAML(`      - {id: "e\t0", engine: enginesim, url: "http://`+engines[0].HTTPAddr()+`", max_inflight_requests: 8, max_inflight_tokens: 1000000}
`, "")
	g := startGateway(t, yaml)
	base := "http://" + g.Addr()
	for i := range 3 {
		st, h, b := post(t, base+"/v1/completions", `{"model":"qwen3","prompt":"`+longSystemPrompt(3)+`","max_tokens":1}`)
		if st != 200 || h.Get("x-kvgate-policy") == "three-tier@native" {
			t.Fatalf("request %d: %d %s policy %q", i, st, b, h.Get("x-kvgate-policy"))
		}
	}
	if !waitFor(5*time.Second, func() bool {
		return scrape(t, g, `kvgate_store_errors_total{op="record"}`) >= 3
	}) {
		t.Fatal("the index never refused the speculative records")
	}
	if down, loadOnly := readyStore(t, g); down || loadOnly != 0 {
		t.Fatalf("store down %v, load-only requests %d after refused records", down, loadOnly)
	}
	if g.StoreStatus().Down {
		t.Fatal("router reports the memory store down")
	}
}

// A request with n choices reserves prompt + n × max_tokens tokens on its endpoint (n was ignored: a request
// with n=3 reserved one choice's output). The engine here is a real HTTP server that holds each request until
// the test lets it answer, so the reservation can be read from the store while the request runs.
func TestReservationCountsN(t *testing.T) {
	release := make(chan struct{})
	eng := newFakeEngine(t, 0, func(w http.ResponseWriter, r *http.Request, b []byte) {
		<-release
		okCompletion(w, r, b)
	})
	g := startGateway(t, gwYAML(fmt.Sprintf("      - {id: f0, engine: vllm, url: %q, max_inflight_tokens: 1000000}\n", eng.srv.URL), ""))
	// Each of n choices runs as its own sequence on the engine: n requests are reserved (issue 10).
	held := func(body string, reqs int64) int64 {
		t.Helper()
		done := make(chan int, 1)
		go func() {
			st, _, _ := post(t, "http://"+g.Addr()+"/v1/chat/completions", body)
			done <- st
		}()
		var tokens int64
		if !waitFor(3*time.Second, func() bool {
			m, err := g.Reservations().InFlight(context.Background(), []kvstore.EndpointID{"f0"})
			tokens = m["f0"].Tokens
			return err == nil && m["f0"].Requests == reqs
		}) {
			close(release)
			t.Fatalf("request never reserved as %d requests", reqs)
		}
		release <- struct{}{}
		if st := <-done; st != 200 {
			t.Fatalf("status %d", st)
		}
		return tokens
	}
	msgs := `"messages":[{"role":"user","content":"count the reservation of this prompt"}]`
	one := held(`{"model":"qwen3","max_tokens":300,`+msgs+`}`, 1)
	three := held(`{"model":"qwen3","max_tokens":300,"n":3,`+msgs+`}`, 3)
	if three-one != 600 || one <= 300 {
		t.Fatalf("reserved tokens: n=1 %d, n=3 %d (want a difference of 2 × 300)", one, three)
	}
	// Without max_tokens the configured default output estimate counts once per choice too.
	def := held(`{"model":"qwen3",`+msgs+`}`, 1)
	defN := held(`{"model":"qwen3","n":2.0,`+msgs+`}`, 2)
	if defN-def != def-(one-300) {
		t.Fatalf("default output: n=1 %d, n=2 %d (prompt %d)", def, defN, one-300)
	}
}

// A 429 (every endpoint full for the queue timeout) tells the client when to retry.
func TestTooManyRequestsRetryAfter(t *testing.T) {
	release := make(chan struct{})
	eng := newFakeEngine(t, 0, func(w http.ResponseWriter, r *http.Request, b []byte) {
		<-release
		okCompletion(w, r, b)
	})
	g := startGateway(t, gwYAML(fmt.Sprintf("      - {id: f0, engine: vllm, url: %q, max_inflight_requests: 1}\n", eng.srv.URL), ""))
	done := make(chan int, 1)
	go func() {
		st, _, _ := post(t, "http://"+g.Addr()+"/v1/completions", `{"model":"qwen3","prompt":"hold","max_tokens":1}`)
		done <- st
	}()
	if !waitFor(3*time.Second, func() bool { return eng.calls.Load() == 1 }) {
		t.Fatal("first request never reached the engine")
	}
	st, h, b := post(t, "http://"+g.Addr()+"/v1/completions", `{"model":"qwen3","prompt":"hi","max_tokens":1}`)
	close(release)
	if st != 429 || h.Get("Retry-After") != "1" || !strings.Contains(string(b), `"code":"no_capacity"`) {
		t.Fatalf("full: %d %s Retry-After %q", st, b, h.Get("Retry-After"))
	}
	if st := <-done; st != 200 {
		t.Fatalf("held request: %d", st)
	}
}

// Client-facing error messages carry no internal package prefixes ("chattemplate: request: ..."), engine
// URLs or socket errors; a malformed chat request names the offending JSON path as param.
func TestClientErrorMessages(t *testing.T) {
	flaky := newFakeEngine(t, 0, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	})
	g := startGateway(t, gwYAML(fmt.Sprintf("      - {id: f0, engine: vllm, url: %q}\n", flaky.srv.URL), ""))
	for _, tc := range []struct{ body, param, message string }{
		{`{"model":"qwen3","messages":[{"content":"x"}]}`, "messages[0].role", "messages[0].role: field required (a string)"},
		{`{"model":"qwen3","messages":["x"]}`, "messages[0]", "messages[0]: must be an object"},
		{`{"model":"qwen3","messages":[{"role":"user","content":"x"}],"tools":5}`, "tools", "tools: must be a list"},
	} {
		st, _, b := post(t, "http://"+g.Addr()+"/v1/chat/completions", tc.body)
		var e struct {
			Error struct {
				Message string `json:"message"`
				Param   string `json:"param"`
			} `json:"error"`
		}
		if st != 400 || json.Unmarshal(b, &e) != nil || e.Error.Message != tc.message || e.Error.Param != tc.param {
			t.Errorf("%s: %d %s", tc.body, st, b)
		}
	}
	st, _, b := post(t, "http://"+g.Addr()+"/v1/chat/completions", `{"model":"qwen3","messages":[{"role":"user","content":"x"}]}`)
	// The engine read the request and dropped the connection: it may have started it, so it is not re-sent
	// (issue 10) and the client learns only that the engine failed.
	if st != 502 || !strings.Contains(string(b), "The engine failed before responding.") ||
		strings.Contains(string(b), "127.0.0.1") || strings.Contains(string(b), "upstream:") {
		t.Fatalf("all endpoints failing: %d %s", st, b)
	}
}

// max_prompt_tokens: a longer prompt is refused with 400 before routing (no endpoint chosen, nothing
// forwarded); a prompt at the limit is served.
func TestMaxPromptTokens(t *testing.T) {
	engines := startSims(t, 1, nil)
	g := startGateway(t, strings.Replace(gwYAML(simEndpointsYAML(engines, 64), ""), "    queue_timeout: 400ms\n",
		"    queue_timeout: 400ms\n    max_prompt_tokens: 10\n", 1))
	base := "http://" + g.Addr()
	// "Hello!" as a chat renders to 10 tokens with Qwen3's template (the README's curl reports prompt_tokens 10).
	if st, h, b := post(t, base+"/v1/chat/completions", `{"model":"qwen3","messages":[{"role":"user","content":"Hello!"}],"max_tokens":1}`); st != 200 || h.Get("x-kvgate-endpoint") != "e0" {
		t.Fatalf("at the limit: %d %s", st, b)
	}
	st, h, b := post(t, base+"/v1/chat/completions", `{"model":"qwen3","messages":[{"role":"user","content":"Hello there!"}],"max_tokens":1}`)
	if st != 400 || h.Get("x-kvgate-endpoint") != "" ||
		!strings.Contains(string(b), `"message":"This model's maximum prompt length is 10 tokens; the prompt has 11 tokens."`) ||
		!strings.Contains(string(b), `"code":"prompt_too_long"`) {
		t.Fatalf("over the limit: %d %s %v", st, b, h)
	}
	st, _, b = post(t, base+"/v1/completions", `{"model":"qwen3","prompt":[1,2,3,4,5,6,7,8,9,10,11],"max_tokens":1}`)
	if st != 400 || !strings.Contains(string(b), `"param":"prompt"`) {
		t.Fatalf("completions over the limit: %d %s", st, b)
	}
	if n := scrape(t, g, `kvgate_requests_total{endpoint="",model="qwen3",status="400"}`); n != 2 {
		t.Fatalf("400s counted %v", n)
	}
}
