package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore/redistest"
)

func tpuAdmin(t *testing.T, g *Gateway, method, path, body, token string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+g.Addr()+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	return resp.StatusCode, m
}

// Two gateways on one Redis are one TPU allocator: a slice registered through a is reserved through b and
// inspected through a; the pool shows in both /readyz; the slice and its lease survive a's restart; the
// routes refuse a missing token with the OpenAI error shape.
func TestTPUTwoGatewaysOnRedis(t *testing.T) {
	t.Parallel() // waits on its own redis-server, engine and gateways only; asserts no latency bound
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	rs := redistest.Start(t)
	engines := startSims(t, 1, nil)
	yaml := gwYAML(simEndpointsYAML(engines, 64), fmt.Sprintf("store: {kind: redis, addrs: [%q]}\n", rs.Addr))
	a := startGateway(t, yaml)
	b := startGateway(t, yaml)
	const base = "/admin/v1/tpu/pools/fleet"

	if st, m := tpuAdmin(t, a, "POST", base+"/slices", `{"id":"s1","generation":"v6e","topology":"4x4","hosts":[{"name":"h0","worker_id":0},{"name":"h1","worker_id":1},{"name":"h2","worker_id":2},{"name":"h3","worker_id":3}]}`, ""); st != 401 ||
		m["error"].(map[string]any)["code"] != "invalid_api_key" {
		t.Fatalf("without token: %d %v", st, m)
	}
	if st, m := tpuAdmin(t, a, "POST", base+"/slices", `{"id":"s1","generation":"v6e","topology":"4x4","hosts":[{"name":"h0","worker_id":0},{"name":"h1","worker_id":1},{"name":"h2","worker_id":2},{"name":"h3","worker_id":3}]}`, "admintok"); st != 201 ||
		m["chip_count"] != 16.0 {
		t.Fatalf("register: %d %v", st, m)
	}
	st, l := tpuAdmin(t, b, "POST", base+"/leases", `{"shape":"2x4","holder":"job-b","ttl":"1m"}`, "admintok")
	if st != 201 || l["lease_id"] != "s1.2x4.0" || !slices.Equal(toStrings(l["hosts"]), []string{"h0", "h2"}) {
		t.Fatalf("reserve through b: %d %v", st, l)
	}
	st, si := tpuAdmin(t, a, "GET", base+"/slices/s1", "", "admintok")
	if st != 200 || si["leased_chips"] != 8.0 || toStrings(si["owners"])[0] != "s1.2x4.0" {
		t.Fatalf("inspect through a: %d %v", st, si)
	}
	st, e := tpuAdmin(t, a, "POST", base+"/leases", `{"shape":"4x4","holder":"x","ttl":"1m"}`, "admintok")
	if st != 400 || e["error"].(map[string]any)["code"] != "use_whole_slice" || e["error"].(map[string]any)["type"] != "invalid_request_error" {
		t.Fatalf("4x4 sub-slice: %d %v", st, e)
	}
	for _, g := range []*Gateway{a, b} {
		if p := toStrings(readyz(t, g)["tpu_pools"]); !slices.Equal(p, []string{"fleet"}) {
			t.Fatalf("readyz tpu_pools %v", p)
		}
	}
	a.Close(t.Context())
	c := startGateway(t, yaml) // a restarted
	st, si = tpuAdmin(t, c, "GET", base+"/slices/s1", "", "admintok")
	if st != 200 || si["leased_chips"] != 8.0 || si["topology"] != "4x4" {
		t.Fatalf("after restart: %d %v", st, si)
	}
	st, r := tpuAdmin(t, c, "POST", base+"/leases/s1.2x4.0/release", fmt.Sprintf(`{"token":%v}`, l["token"]), "admintok")
	if st != 200 || r["released"] != true {
		t.Fatalf("release through c: %d %v", st, r)
	}
	st, w := tpuAdmin(t, b, "POST", base+"/leases", `{"whole":true,"shape":"4x4","holder":"all","ttl":"1m"}`, "admintok")
	if st != 201 || w["chip_count"] != 16.0 {
		t.Fatalf("whole after release: %d %v", st, w)
	}
	st, e = tpuAdmin(t, c, "POST", base+"/leases", `{"shape":"2x2","holder":"x","ttl":"1m"}`, "admintok")
	if st != 409 || e["error"].(map[string]any)["code"] != "no_capacity" {
		t.Fatalf("full: %d %v", st, e)
	}
	resp, err := http.Get("http://" + b.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`kvgate_tpu_chips{generation="v6e",pool="fleet"} 16`, `kvgate_tpu_chips_leased{generation="v6e",pool="fleet"} 16`,
		`kvgate_tpu_leases_granted_total{kind="slice",pool="fleet"} 1`, `kvgate_tpu_leases_granted_total{kind="subslice",pool="fleet"} 1`} {
		if !strings.Contains(string(mb), want) {
			t.Fatalf("metrics lack %s:\n%s", want, grepLines(string(mb), "kvgate_tpu"))
		}
	}
}

func toStrings(v any) []string {
	a, _ := v.([]any)
	out := make([]string, len(a))
	for i, x := range a {
		out[i], _ = x.(string)
	}
	return out
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Issue 12 item 3: a Redis restarted empty loses the registered TPU slices and their leases, while the
// holders may still be using the chips. Two gateways on one real redis-server: a slice registered and
// leased (4 s) through a, one host marked unhealthy; Redis restarts empty. The slice comes back, checked
// through b, with every chip quarantined (a whole-slice lease) until after the lost lease would have
// expired, and the host still unhealthy: b can reserve nothing before that, and can after. Before the fix
// the slice was gone.
func TestTPUSlicesQuarantinedAfterEmptyRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	rs := redistest.Start(t)
	engines := startSims(t, 1, nil)
	yaml := gwYAML(simEndpointsYAML(engines, 64), fmt.Sprintf("store: {kind: redis, addrs: [%q]}\n", rs.Addr))
	a := startGateway(t, yaml)
	b := startGateway(t, yaml)
	const base = "/admin/v1/tpu/pools/fleet"
	if st, m := tpuAdmin(t, a, "POST", base+"/slices", `{"id":"s1","generation":"v6e","topology":"4x4","hosts":[{"name":"h0","worker_id":0},{"name":"h1","worker_id":1},{"name":"h2","worker_id":2},{"name":"h3","worker_id":3}]}`, "admintok"); st != 201 {
		t.Fatalf("register: %d %v", st, m)
	}
	if st, m := tpuAdmin(t, a, "POST", base+"/slices/s1/health", `{"host":"h3","healthy":false}`, "admintok"); st != 200 {
		t.Fatalf("health: %d %v", st, m)
	}
	st, l := tpuAdmin(t, a, "POST", base+"/leases", `{"shape":"2x4","holder":"job-a","ttl":"4s"}`, "admintok")
	if st != 201 {
		t.Fatalf("reserve through a: %d %v", st, l)
	}
	lost, err := time.Parse(time.RFC3339Nano, l["expires_at"].(string))
	if err != nil {
		t.Fatal(err)
	}
	tpuCopied(t, "fleet", "s1", a, b) // both gateways have copied the slice and the fleet state
	reconciled(t, 1, a, b)
	rs.Restart()
	slice := func() map[string]any {
		st, p := tpuAdmin(t, b, "GET", base, "", "admintok")
		if st != 200 {
			return nil
		}
		ss, _ := p["slices"].([]any)
		if len(ss) != 1 {
			return nil
		}
		return ss[0].(map[string]any)
	}
	var s map[string]any
	if !waitFor(10*time.Second, func() bool { s = slice(); return s != nil }) {
		t.Fatal("the slice never came back (through b)")
	}
	// Registration, quarantine lease and the unhealthy host's re-mark are one atomic step (tpu.RegisterHeld),
	// whichever gateway's registration wins: the first read that shows the slice shows all three.
	if len(s["leases"].([]any)) != 1 || s["unhealthy_chips"] != 4.0 {
		t.Fatalf("the slice came back without its quarantine lease or its unhealthy host (through b): %v", s)
	}
	q := s["leases"].([]any)[0].(map[string]any)
	until, err := time.Parse(time.RFC3339Nano, q["expires_at"].(string))
	if err != nil {
		t.Fatal(err)
	}
	if q["holder"] != tpuQuarantineHolder || q["chip_count"] != 16.0 || s["free_chips"] != 0.0 || s["unhealthy_chips"] != 4.0 || until.Before(lost) {
		t.Fatalf("quarantine %v until %v (the lost lease ran until %v); slice %v", q, until, lost, s)
	}
	for {
		st, m := tpuAdmin(t, b, "POST", base+"/leases", `{"shape":"2x2","holder":"job-b","ttl":"1m"}`, "admintok")
		now := time.Now()
		if st == 201 {
			if now.Before(until) {
				t.Fatalf("a chip was allocated at %v, before the quarantine's end %v: %v", now, until, m)
			}
			break
		}
		if code := m["error"].(map[string]any)["code"]; st != 409 || code != "no_capacity" {
			t.Fatalf("during the quarantine: %d %v", st, m)
		}
		if now.After(until.Add(3 * time.Second)) {
			t.Fatalf("still no capacity 3 s after the quarantine's end %v", until)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if s = slice(); s["free_chips"] != 8.0 { // 16 − 4 on the unhealthy host − 4 just leased
		t.Fatalf("after the quarantine: %v", s)
	}
}
