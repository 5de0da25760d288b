package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore/redistest"
	"github.com/kvgate/kvgate/plugins"
)

// readyz returns a gateway's /readyz body with its details (they need the admin token, "admintok" for
// gateways started by startGateway).
func readyz(t *testing.T, g *Gateway) map[string]any {
	t.Helper()
	resp, err := getReadyz(g)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	json.NewDecoder(resp.Body).Decode(&m)
	return m
}

// getReadyz asks g for /readyz with the admin token.
func getReadyz(g *Gateway) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+g.Addr()+"/readyz", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer admintok")
	return http.DefaultClient.Do(req)
}

// Two gateways on one Redis behave as one: one ingester per endpoint (taken over when its gateway dies),
// the same prefix routed to the same endpoint through either gateway, a policy activated on one shows on
// the other within 1 s, and a Redis outage degrades to load-only routing without failing requests.
func TestTwoGatewaysOnRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	t0 := time.Now()
	lap := func(what string) { t.Logf("%8.2fs %s", time.Since(t0).Seconds(), what) }
	defer lap("end")
	rs := redistest.Start(t)
	lap("redis")
	engines := startSims(t, 3, nil)
	lap("sims")
	yaml := gwYAML(simEndpointsYAML(engines, 64), fmt.Sprintf("store: {kind: redis, addrs: [%q]}\nstore_down_limit_share: 0.5\n", rs.Addr))
	a := startGateway(t, yaml)
	lap("a")
	b := startGateway(t, yaml)

	lap("started")
	// Exactly one gateway ingests each endpoint.
	if !waitFor(5*time.Second, func() bool { return len(a.IngestStats())+len(b.IngestStats()) == 3 }) {
		t.Fatalf("ingesters: a %d, b %d", len(a.IngestStats()), len(b.IngestStats()))
	}
	leaseRounded(t, 1, a, b) // a renewal round: still one each
	if n := len(a.IngestStats()) + len(b.IngestStats()); n != 3 {
		t.Fatalf("%d ingesters for 3 endpoints", n)
	}

	waitSubscribed(t, engines, a, b)
	lap("ingesters checked")
	// Same prefix through different gateways → same endpoint.
	sys := longSystemPrompt(30)
	body := func(q string) string {
		return fmt.Sprintf(`{"model":"qwen3","max_tokens":2,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, sys, q)
	}
	st, h, _ := post(t, "http://"+a.Addr()+"/v1/chat/completions", body("first"))
	if st != 200 {
		t.Fatal(st)
	}
	ep := h.Get("x-kvgate-endpoint")
	for i := range 4 {
		st, h, _ := post(t, "http://"+b.Addr()+"/v1/chat/completions", body(fmt.Sprint("q", i)))
		if st != 200 || h.Get("x-kvgate-endpoint") != ep {
			t.Fatalf("through b: %d %s, want %s", st, h.Get("x-kvgate-endpoint"), ep)
		}
	}

	lap("affinity checked")
	// Upload + activate on a; b's header follows within 1 s.
	req, _ := http.NewRequest(http.MethodPut, "http://"+a.Addr()+"/admin/v1/policies/tt3", strings.NewReader(string(plugins.BuiltinWasm)))
	req.Header.Set("Authorization", "Bearer admintok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("upload: %v %v", err, resp)
	}
	resp.Body.Close()
	ver := plugins.VersionOf("tt3", plugins.BuiltinWasm)
	// b compiles stored modules as they appear (before any activation needs them).
	if !waitFor(10*time.Second, func() bool {
		for _, v := range b.Host().Versions() {
			if v.Version == ver {
				return true
			}
		}
		return false
	}) {
		t.Fatal("b never loaded the uploaded module")
	}
	lap("b loaded the module")
	st, _, rb := post(t, "http://"+a.Addr()+"/admin/v1/policies/activate", `{"model":"qwen3","version":"`+string(ver)+`","config":{}}`, "Authorization", "Bearer admintok")
	if st != 200 {
		t.Fatalf("activate %d %s", st, rb)
	}
	activated := time.Now()
	if !waitFor(time.Second, func() bool { v, _ := b.Host().Active("qwen3"); return v == ver }) {
		t.Fatal("b did not activate within 1 s")
	}
	t.Logf("policy reached gateway b after %v", time.Since(activated))
	_, h, _ = post(t, "http://"+b.Addr()+"/v1/completions", `{"model":"qwen3","prompt":"x","max_tokens":1}`)
	if got := h.Get("x-kvgate-policy"); got != string(ver)[:len("tt3@")+12] {
		t.Fatalf("b header %q", got)
	}

	// An activation of an already-compiled version does not wait behind the compilation of another module:
	// upload a new module (the built-in plus a custom section: new bytes, a full compile on b) and at once
	// switch back to the built-in version on a.
	big := append(append([]byte{}, plugins.BuiltinWasm...), 0, 6, 4, 'k', 'v', 'g', 'x', 1)
	bigVer := plugins.VersionOf("big", big)
	req, _ = http.NewRequest(http.MethodPut, "http://"+a.Addr()+"/admin/v1/policies/big", strings.NewReader(string(big)))
	req.Header.Set("Authorization", "Bearer admintok")
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("upload big: %v %v", err, resp)
	}
	resp.Body.Close()
	builtin := b.Host().BuiltinVersion()
	st, _, rb = post(t, "http://"+a.Addr()+"/admin/v1/policies/activate", `{"model":"qwen3","version":"`+string(builtin)+`","config":{}}`, "Authorization", "Bearer admintok")
	if st != 200 {
		t.Fatalf("activate builtin %d %s", st, rb)
	}
	activated = time.Now()
	if !waitFor(time.Second, func() bool { v, _ := b.Host().Active("qwen3"); return v == builtin }) {
		t.Fatal("b did not switch to the compiled built-in within 1 s while compiling another module")
	}
	bigLoaded := slices.ContainsFunc(b.Host().Versions(), func(v plugins.VersionInfo) bool { return v.Version == bigVer })
	t.Logf("activation reached b after %v (b had finished compiling the new module: %v)", time.Since(activated), bigLoaded)
	if !waitFor(30*time.Second, func() bool {
		return slices.ContainsFunc(b.Host().Versions(), func(v plugins.VersionInfo) bool { return v.Version == bigVer })
	}) {
		t.Fatal("b never compiled the new module")
	}
	lap("activation during a compile checked")

	// Redis down: requests are still served on load alone; readyz says degraded.
	rs.Stop()
	downAt := time.Now()
	for i := range 3 {
		st, _, rb := post(t, "http://"+b.Addr()+"/v1/chat/completions", body(fmt.Sprint("down", i)))
		if st != 200 {
			t.Fatalf("store down: %d %s", st, rb)
		}
	}
	t.Logf("3 requests served %v after redis stopped", time.Since(downAt))
	if rz := readyz(t, b); rz["degraded"] != true {
		t.Fatalf("readyz while down: %v", rz)
	}
	restartAt := time.Now()
	rs.Restart()
	t.Logf("redis restarted in %v", time.Since(restartAt))
	if !waitFor(5*time.Second, func() bool { return !b.StoreStatus().Down }) {
		t.Fatal("b never saw the store again")
	}
	st, h, _ = post(t, "http://"+b.Addr()+"/v1/chat/completions", body("back"))
	if st != 200 || h.Get("x-kvgate-policy") == "" {
		t.Fatalf("after restart: %d", st)
	}
	if rz := readyz(t, b); rz["degraded"] != false {
		t.Fatalf("readyz after restart: %v", rz)
	}

	t.Logf("served after restart %v", time.Since(restartAt))
	// a dies: b takes over a's ingestion within a few seconds.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	closeAt := time.Now()
	a.Close(ctx)
	cancel()
	t.Logf("a closed in %v", time.Since(closeAt))
	defer func(t0 time.Time) { t.Logf("takeover after %v", time.Since(t0)) }(time.Now())
	if !waitFor(IngestLeaseTTL+3*IngestLeaseTick, func() bool { return len(b.IngestStats()) == 3 }) {
		t.Fatalf("b ingests %d endpoints after a died", len(b.IngestStats()))
	}
}

// One gateway on a 3-master Redis Cluster: routing, affinity, reservations and policy storage work through
// the cluster client (a request's keys live in one hash slot).
func TestGatewayOnRedisCluster(t *testing.T) {
	t.Parallel() // waits on its own Redis Cluster, engines and gateway only; asserts no latency bound
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	engines := startSims(t, 2, nil)
	addrs := `"` + strings.Join(cl.Addrs, `", "`) + `"`
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), "store: {kind: redis, cluster: true, addrs: ["+addrs+"]}\n"))
	waitSubscribed(t, engines, g)
	sys := longSystemPrompt(30)
	body := func(q string) string {
		return fmt.Sprintf(`{"model":"qwen3","max_tokens":2,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, sys, q)
	}
	st, h, b := post(t, "http://"+g.Addr()+"/v1/chat/completions", body("one"))
	if st != 200 {
		t.Fatalf("%d %s", st, b)
	}
	ep := h.Get("x-kvgate-endpoint")
	for i := range 3 {
		if st, h, _ := post(t, "http://"+g.Addr()+"/v1/chat/completions", body(fmt.Sprint("again ", i))); st != 200 || h.Get("x-kvgate-endpoint") != ep {
			t.Fatalf("%d %s want %s", st, h.Get("x-kvgate-endpoint"), ep)
		}
	}
	if g.StoreStatus().Down {
		t.Fatalf("store down: %+v", g.StoreStatus())
	}
	// A module uploaded to the store can be named in another gateway's config.
	req, _ := http.NewRequest(http.MethodPut, "http://"+g.Addr()+"/admin/v1/policies/tt4", strings.NewReader(string(plugins.BuiltinWasm)))
	req.Header.Set("Authorization", "Bearer admintok")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 201 {
		t.Fatalf("upload: %v %v", err, resp)
	} else {
		resp.Body.Close()
	}
	cfg2 := strings.Replace(gwYAML(simEndpointsYAML(engines, 64), "store: {kind: redis, cluster: true, addrs: ["+addrs+"]}\n"),
		"    queue_timeout: 400ms\n", "    queue_timeout: 400ms\n    policy: {name: tt4, config: {imbalance_threshold: 5}}\n", 1)
	g2 := startGateway(t, cfg2)
	if v, c := g2.Host().Active("qwen3"); v != plugins.VersionOf("tt4", plugins.BuiltinWasm) || string(c) != `{"imbalance_threshold":5}` {
		t.Fatalf("config policy: %s %s", v, c)
	}
	st, _, b = post(t, "http://"+g.Addr()+"/admin/v1/policies/activate",
		`{"model":"qwen3","version":"`+string(g.Host().BuiltinVersion())+`","config":{"imbalance_threshold":3}}`, "Authorization", "Bearer admintok")
	if st != 200 {
		t.Fatalf("activate %d %s", st, b)
	}
	raw, err := g.store.Blobs.GetActive(context.Background(), "qwen3")
	if err != nil || !strings.Contains(string(raw), `"imbalance_threshold":3`) {
		t.Fatalf("stored active value %s %v", raw, err)
	}
}
