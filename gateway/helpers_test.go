package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/cmd/enginesim/sim"
	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/gateway/internal/model"
	"github.com/kvgate/kvgate/gateway/internal/route"
	"github.com/kvgate/kvgate/kvstore/testenv"
)

const qwenDir = "../examples/models/qwen3"

var (
	modelOnce sync.Once
	qwen      *model.Model
	modelErr  error
)

// testEncoder loads the Qwen3 demo model once (the production encoder: chat template + tokenizer).
func testEncoder(string) (route.Encoder, error) {
	modelOnce.Do(func() { qwen, modelErr = model.Load(qwenDir) })
	return qwen, modelErr
}

// startSims starts n simulated engines serving "qwen3" with KV events on loopback.
func startSims(t testing.TB, n int, mod func(*sim.Config)) []*sim.Engine {
	t.Helper()
	var out []*sim.Engine
	for range n {
		c := sim.DefaultConfig()
		c.Model = qwenDir
		c.ServedModelNames = []string{"qwen3"}
		c.Host = "127.0.0.1"
		c.NumGPUBlocks = 4096
		c.TimeScale = 0.05
		c.KVEvents = sim.KVEventsConfig{EnableKVCacheEvents: true, Publisher: "zmq",
			Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://*:0", BufferSteps: 1000, HWM: 100000, MaxQueueSize: 100000}
		if mod != nil {
			mod(&c)
		}
		e, err := sim.Start(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		out = append(out, e)
	}
	return out
}

// simEndpointsYAML renders the endpoints list for engines.
func simEndpointsYAML(engines []*sim.Engine, maxReq int) string {
	var b strings.Builder
	for i, e := range engines {
		fmt.Fprintf(&b, "      - {id: e%d, engine: enginesim, url: \"http://%s\", kv_events: %q, kv_replay: %q, max_inflight_requests: %d, max_inflight_tokens: 1000000}\n",
			i, e.HTTPAddr(), e.EventsAddr(), e.ReplayAddr(), maxReq)
	}
	return b.String()
}

// startGateway starts a gateway on a loopback port from YAML; the admin token is "admintok". Its logs go to
// stderr (warn, or info with -v).
func startGateway(t testing.TB, yaml string) *Gateway {
	t.Helper()
	logLevel := slog.LevelWarn
	if testing.Verbose() {
		logLevel = slog.LevelInfo
	}
	return startGatewayTo(t, yaml, os.Stderr, logLevel)
}

// startGatewayTo is startGateway with the gateway's JSON logs at level written to w.
func startGatewayTo(t testing.TB, yaml string, w io.Writer, level slog.Level) *Gateway {
	t.Helper()
	g, err := startGatewayWith(t, yaml, nil, slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// startGatewayWith starts a gateway on a loopback port from YAML with the test environment (admin token
// "admintok", KVGATE_TEST_KEYS "ck1,ck2") plus extraEnv, logging to log, and returns Start's error; a
// started gateway is closed at cleanup.
func startGatewayWith(t testing.TB, yaml string, extraEnv map[string]string, log *slog.Logger) (*Gateway, error) {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"KVGATE_ADMIN_TOKEN": "admintok", "KVGATE_TEST_KEYS": "ck1,ck2"}
	for k, v := range extraEnv {
		env[k] = v
	}
	g, err := Start(context.Background(), Options{Config: cfg, Secrets: cfg.Secrets(func(k string) string { return env[k] }),
		LoadEncoder: testEncoder, Listener: ln, PolicyCacheDir: policyCache, Log: log})
	if err != nil {
		ln.Close()
		return nil, err
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		g.Close(ctx)
	})
	return g, nil
}

func gwYAML(endpointsYAML string, extra string) string {
	return "listen: \"127.0.0.1:0\"\nscrape_interval: 100ms\n" + extra + `
models:
  - name: qwen3
    tokenizer: ` + qwenDir + `
    block_size: 16
    queue_timeout: 400ms
    lora_adapters: [qwen3-lora]
    endpoints:
` + endpointsYAML
}

// post sends a JSON body and returns status, headers and body.
func post(t testing.TB, url, body string, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// waitFor is testenv.WaitFor (polls cond up to d).
var waitFor = testenv.WaitFor

// quietRedis drops go-redis's own (global, non-JSON) log lines in tests.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

var policyCache string

func TestMain(m *testing.M) {
	redis.SetLogger(quietRedis{})
	dir, err := os.MkdirTemp("", "kvgate-wazero-")
	if err != nil {
		panic(err)
	}
	policyCache = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// waitSubscribed waits until every engine's KV-event publisher has a subscriber (a gateway's ingester), so
// no event of the test's first request is lost to ZMQ's slow-joiner window, then sends each engine one
// request directly and waits until the gateways' ingesters have applied its events: an ingester clears its
// endpoint on its first message (kvevents), which would also drop the speculative entries a test's first
// routed request just wrote.
func waitSubscribed(t testing.TB, engines []*sim.Engine, gws ...*Gateway) {
	t.Helper()
	defer func() {
		for _, e := range engines {
			post(t, "http://"+e.HTTPAddr()+"/v1/completions", `{"model":"qwen3","max_tokens":1,"prompt":"`+
				strings.Repeat("prime the event stream of this engine ", 8)+`"}`)
		}
		if !waitFor(10*time.Second, func() bool {
			n := 0
			for _, g := range gws {
				for _, s := range g.IngestStats() {
					if s.HaveSeq {
						n++
					}
				}
			}
			return n == len(engines)
		}) {
			t.Fatal("ingesters never applied their first events")
		}
	}()
	if !waitFor(10*time.Second, func() bool {
		for _, e := range engines {
			if len(e.EventSubscriptions()) == 0 {
				return false
			}
		}
		return true
	}) {
		t.Fatal("engines have no event subscriber")
	}
}

// reconciled waits until each gateway's fleet-state follower has finished n reconcile rounds and n loader
// passes that began after the call (so each read the store as it was at the call): the event a "nothing
// else changes" check waits for instead of sleeping some multiple of PolicyReconcileInterval.
func reconciled(t testing.TB, n int, gws ...*Gateway) {
	t.Helper()
	type mark struct{ rounds, loads uint64 }
	marks := make([]mark, len(gws))
	for i, g := range gws {
		marks[i] = mark{g.policySync.rounds.Load(), g.policySync.loads.Load()}
	}
	want := uint64(n) + 1 // the round (pass) under way at the call is not counted
	for i, g := range gws {
		testenv.Eventually(t, 10*time.Second+time.Duration(n)*PolicyReconcileInterval,
			fmt.Sprintf("%d reconcile rounds of gateway %d", n, i), func() bool {
				return g.policySync.rounds.Load() >= marks[i].rounds+want && g.policySync.loads.Load() >= marks[i].loads+want
			})
	}
}

// tpuCopied waits until each gateway's copy of the store's TPU slices (tpuSlices, refreshed every
// tpuCopyInterval) holds slice id of pool with a lease seen in it: what a test that then empties the store
// needs copied, instead of sleeping a few copy intervals.
func tpuCopied(t testing.TB, pool, id string, gws ...*Gateway) {
	t.Helper()
	for i, g := range gws {
		testenv.Eventually(t, 10*time.Second+2*tpuCopyInterval, fmt.Sprintf("gateway %d's copy of TPU slice %s", i, id), func() bool {
			g.tpuCopy.mu.Lock()
			defer g.tpuCopy.mu.Unlock()
			_, ok := g.tpuCopy.pools[pool][id]
			return ok && g.tpuCopy.longest > 0
		})
	}
}

// leaseRounded waits until each gateway's ingestion loop of every configured endpoint with kv_events has
// finished n lease rounds (acquire, renew or fence check; one per IngestLeaseTick) that began after the
// call: the event an "ingestion did not move" check waits for instead of sleeping.
func leaseRounded(t testing.TB, n int, gws ...*Gateway) {
	t.Helper()
	rounds := func(g *Gateway, id string) uint64 {
		g.ingMu.Lock()
		defer g.ingMu.Unlock()
		return g.leaseRounds[id]
	}
	type key struct {
		g  int
		id string
	}
	marks := map[key]uint64{}
	for i, g := range gws {
		for _, m := range g.cfg.Models {
			for _, e := range m.Endpoints {
				if e.KVEvents != "" {
					marks[key{i, e.ID}] = rounds(g, e.ID)
				}
			}
		}
	}
	if len(marks) == 0 {
		t.Fatal("leaseRounded: no endpoint with kv_events")
	}
	for k, r0 := range marks {
		testenv.Eventually(t, 10*time.Second+time.Duration(n+1)*IngestLeaseTick,
			fmt.Sprintf("%d lease rounds of %s on gateway %d", n, k.id, k.g), func() bool {
				return rounds(gws[k.g], k.id) >= r0+uint64(n)+1
			})
	}
}
