package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Regression tests for defects a new-user trial found (issue 6 / issue 3), on real simulated engines and a
// real gateway.

// scrape returns the value of one sample of the gateway's /metrics (name and labels as exposed), or -1.
func scrape(t *testing.T, g *Gateway, sample string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + g.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return -1
}

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
	if g.Router().StoreStatus().Down {
		t.Fatal("router reports the memory store down")
	}
}
