package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
	"github.com/kvgate/kvgate/plugins"
)

// fleetTest starts n gateways on one real redis-server (one simulated engine).
type fleetTest struct {
	t    *testing.T
	rs   *redistest.Server
	yaml string
	gws  []*Gateway
}

func newFleet(t *testing.T, n int) *fleetTest {
	t.Helper()
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	rs := redistest.Start(t)
	engines := startSims(t, 1, nil)
	f := &fleetTest{t: t, rs: rs, yaml: gwYAML(simEndpointsYAML(engines, 64), fmt.Sprintf("store: {kind: redis, addrs: [%q]}\n", rs.Addr))}
	for range n {
		f.gws = append(f.gws, startGateway(t, f.yaml))
	}
	return f
}

func (f *fleetTest) upload(g *Gateway, name string, wasm []byte) plugins.Version {
	f.t.Helper()
	if st, body := adminDo(f.t, g, "PUT", "/admin/v1/policies/"+name, string(wasm)); st != 201 {
		f.t.Fatalf("upload %s: %d %s", name, st, body)
	}
	v := plugins.VersionOf(name, wasm)
	for _, o := range f.gws {
		if !waitFor(30*time.Second, func() bool { return hasVersion(o, v) }) {
			f.t.Fatalf("a gateway never loaded %s", v)
		}
	}
	return v
}

func (f *fleetTest) activate(g *Gateway, v plugins.Version, cfg string) {
	f.t.Helper()
	if st, body := adminDo(f.t, g, "POST", "/admin/v1/policies/activate", `{"model":"qwen3","version":"`+string(v)+`","config":`+cfg+`}`); st != 200 {
		f.t.Fatalf("activate %s: %d %s", v, st, body)
	}
}

func rollback(t *testing.T, g *Gateway) (int, []byte) {
	t.Helper()
	return adminDo(t, g, "POST", "/admin/v1/policies/rollback", `{"model":"qwen3"}`)
}

// serves waits until every gateway serves v for qwen3 with config cfg.
func (f *fleetTest) serves(v plugins.Version, cfg string, gws ...*Gateway) {
	f.t.Helper()
	if len(gws) == 0 {
		gws = f.gws
	}
	for i, g := range gws {
		if !waitFor(5*time.Second, func() bool { got, c := g.Host().Active("qwen3"); return got == v && string(c) == cfg }) {
			got, c := g.Host().Active("qwen3")
			f.t.Fatalf("gateway %d serves %s %s, want %s %s", i, got, c, v, cfg)
		}
	}
}

// The A/B case of issue 12: activate p2 through A, roll back through A (the fleet goes to the configured
// policy), roll back through B: 409 no_previous, and the fleet stays where it is. Then two rollbacks issued at
// once through A and B from a stack of depth 3 move the fleet back exactly two steps; from depth 2, one of
// them is refused. A third gateway, asked nothing, serves the same throughout.
func TestFleetRollbackOneAnswer(t *testing.T) {
	t.Parallel() // waits on its own redis-server and gateways only; asserts no latency bound
	f := newFleet(t, 3)
	a, b := f.gws[0], f.gws[1]
	builtin := a.Host().BuiltinVersion()
	floorCfg := func() string { _, c := a.Host().Active("qwen3"); return string(c) }()
	p2 := f.upload(a, "p2", plugins.BuiltinWasm)
	f.activate(a, p2, `{"imbalance_threshold":2}`)
	f.serves(p2, `{"imbalance_threshold":2}`)
	if st, body := rollback(t, a); st != 200 || !strings.Contains(string(body), string(builtin)) {
		t.Fatalf("rollback through a: %d %s", st, body)
	}
	f.serves(builtin, floorCfg)
	if st, body := rollback(t, b); st != 409 || adminCode(body) != "no_previous" {
		t.Fatalf("rollback through b after a's: %d %s, want 409 no_previous", st, body)
	}
	reconciled(t, 2, f.gws...) // rounds that read the store after b's refused rollback
	f.serves(builtin, floorCfg)

	p1 := f.upload(b, "p1", append(append([]byte{}, plugins.BuiltinWasm...), 0, 6, 4, 'k', 'v', 'g', 'x', 1))
	for depth, okWant := range []int{3: 2, 2: 1} {
		if depth < 2 {
			continue
		}
		f.activate(a, p1, `{"imbalance_threshold":1}`)
		if depth == 3 {
			f.activate(b, p2, `{"imbalance_threshold":3}`)
			f.serves(p2, `{"imbalance_threshold":3}`)
		} else {
			f.serves(p1, `{"imbalance_threshold":1}`)
		}
		var wg sync.WaitGroup
		codes := make([]int, 2)
		for i, g := range []*Gateway{a, b} {
			wg.Go(func() { codes[i], _ = rollback(t, g) })
		}
		wg.Wait()
		ok := 0
		for _, c := range codes {
			if c == 200 {
				ok++
			} else if c != 409 {
				t.Fatalf("concurrent rollback: %v", codes)
			}
		}
		if ok != okWant {
			t.Fatalf("two rollbacks at once from depth %d: codes %v, want %d of them 200", depth, codes, okWant)
		}
		f.serves(builtin, floorCfg)
	}
}

// Issue 12: a version activated, rolled back and unloaded through A must not come back through B: B's rollback
// is 409 no_previous (the history no longer names it), B unloads it, and no gateway serves it.
func TestFleetUnloadThenRollbackDoesNotResurrect(t *testing.T) {
	t.Parallel() // waits on its own redis-server and gateways only; asserts no latency bound
	f := newFleet(t, 2)
	a, b := f.gws[0], f.gws[1]
	builtin := a.Host().BuiltinVersion()
	_, floorCfg := a.Host().Active("qwen3")
	v := f.upload(a, "gone", plugins.BuiltinWasm)
	f.activate(a, v, `{}`)
	f.serves(v, `{}`)
	if st, body := rollback(t, a); st != 200 {
		t.Fatalf("rollback through a: %d %s", st, body)
	}
	f.serves(builtin, string(floorCfg))
	if st, body := adminDo(t, a, "DELETE", "/admin/v1/policies/"+string(v), ""); st != 200 || !strings.Contains(string(body), `"unloaded":true`) {
		t.Fatalf("unload through a: %d %s", st, body)
	}
	if st, body := rollback(t, b); st != 409 || adminCode(body) != "no_previous" {
		t.Fatalf("rollback through b after the unload: %d %s, want 409 no_previous", st, body)
	}
	if !waitFor(4*PolicyReconcileInterval, func() bool { return !hasVersion(b, v) }) {
		t.Fatal("b still holds the unloaded version")
	}
	f.serves(builtin, string(floorCfg))
	if st, body := adminDo(t, b, "DELETE", "/admin/v1/policies/"+string(v), ""); st != 404 || adminCode(body) != "policy_not_found" {
		t.Fatalf("unload through b afterwards: %d %s", st, body)
	}
}

// Issue 12: Redis restarted empty (no persistence) loses the uploaded modules and the activations. The running
// gateways write their copy back (one of them wins); a gateway started afterwards serves the fleet's policy,
// and a rollback through it returns to the configured policy.
func TestFleetReseedAfterEmptyRestart(t *testing.T) {
	t.Parallel() // waits on its own redis-server and gateways only; asserts no latency bound
	f := newFleet(t, 2)
	a := f.gws[0]
	builtin := a.Host().BuiltinVersion()
	_, floorCfg := a.Host().Active("qwen3")
	v := f.upload(a, "keep", plugins.BuiltinWasm)
	f.activate(f.gws[1], v, `{"imbalance_threshold":7}`)
	f.serves(v, `{"imbalance_threshold":7}`)
	reconciled(t, 1, f.gws...) // both gateways have copied the fleet state
	f.rs.Restart()
	rc := f.rs.Client(t)
	if !waitFor(10*time.Second, func() bool { return rc.Exists(t.Context(), "kvg:v1:{blobs}:d:"+string(v)).Val() == 1 }) {
		t.Fatal("the module was never written back")
	}
	c := startGateway(t, f.yaml)
	f.gws = append(f.gws, c)
	f.serves(v, `{"imbalance_threshold":7}`)
	if st, body := rollback(t, c); st != 200 || !strings.Contains(string(body), string(builtin)) {
		t.Fatalf("rollback through a gateway started after the restart: %d %s", st, body)
	}
	f.serves(builtin, string(floorCfg))
}

// readyPolicy is one model's entry of /readyz "policies".
type readyPolicy struct {
	Serving  string `json:"serving"`
	Want     string `json:"want"`
	Error    string `json:"error"`
	Attempts int    `json:"attempts"`
}

func readyPolicies(t *testing.T, g *Gateway) map[string]readyPolicy {
	t.Helper()
	raw, _ := json.Marshal(readyz(t, g)["policies"])
	var out map[string]readyPolicy
	json.Unmarshal(raw, &out)
	return out
}

func servingMetric(t *testing.T, g *Gateway) map[string]float64 {
	t.Helper()
	mfs, err := g.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "kvgate_policy_serving" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var model, version string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "model":
					model = l.GetValue()
				case "version":
					version = l.GetValue()
				}
			}
			out[model+" "+version] = m.GetGauge().GetValue()
		}
	}
	return out
}

// Issue 12: a gateway that cannot load the module the fleet activated says so (/readyz, the
// kvgate_policy_serving metric, `policy list` through another gateway, with the cause) and retries with
// backoff, serving it once the load succeeds. The load fails here because the store lists the module while
// its data key is missing (a half-written upload), which is then restored.
func TestFleetFailedLoadVisibleAndRetried(t *testing.T) {
	t.Parallel() // waits on its own redis-server and gateways only; asserts no latency bound
	f := newFleet(t, 1)
	a := f.gws[0]
	builtin := a.Host().BuiltinVersion()
	v := f.upload(a, "late", plugins.BuiltinWasm)
	f.activate(a, v, `{}`)
	rc := f.rs.Client(t)
	dataKey := "kvg:v1:{blobs}:d:" + string(v)
	data, err := rc.Get(t.Context(), dataKey).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	rc.Del(t.Context(), dataKey)
	b := startGateway(t, f.yaml)
	if got, _ := b.Host().Active("qwen3"); got != builtin {
		t.Fatalf("b serves %s without the module's data", got)
	}
	var rp readyPolicy
	if !waitFor(5*time.Second, func() bool { rp = readyPolicies(t, b)["qwen3"]; return rp.Error != "" }) {
		t.Fatalf("/readyz of b shows no failed load: %+v", readyPolicies(t, b))
	}
	if rp.Serving != string(builtin) || rp.Want != string(v) || !strings.Contains(rp.Error, "not found") {
		t.Fatalf("/readyz of b: %+v", rp)
	}
	if m := servingMetric(t, b); m["qwen3 "+string(builtin)] != 1 || len(m) != 1 {
		t.Fatalf("kvgate_policy_serving on b: %v", m)
	}
	// The fleet's view through a names b, what it serves, and why.
	var list struct {
		Fleet map[string]struct {
			Active   string `json:"active"`
			Disagree []struct {
				Gateway string `json:"gateway"`
				Serving string `json:"serving"`
				Error   string `json:"error"`
			} `json:"disagree"`
		} `json:"fleet"`
	}
	if !waitFor(5*time.Second, func() bool {
		_, body := adminDo(t, a, "GET", "/admin/v1/policies", "")
		list.Fleet = nil
		json.Unmarshal(body, &list)
		return len(list.Fleet["qwen3"].Disagree) == 1
	}) {
		_, body := adminDo(t, a, "GET", "/admin/v1/policies", "")
		t.Fatalf("policy list through a shows no disagreeing gateway: %s", body)
	}
	d := list.Fleet["qwen3"].Disagree[0]
	if list.Fleet["qwen3"].Active != string(v) || d.Gateway != b.ID() || d.Serving != string(builtin) ||
		!strings.Contains(d.Error, "failed to load") || !strings.Contains(d.Error, "not found") {
		t.Fatalf("policy list through a: %+v", list.Fleet["qwen3"])
	}
	// Retried with backoff: the attempts count grows, and once the data is back b serves the module.
	if !waitFor(5*time.Second, func() bool { return readyPolicies(t, b)["qwen3"].Attempts >= 2 }) {
		t.Fatalf("b never retried: %+v", readyPolicies(t, b)["qwen3"])
	}
	rc.Set(t.Context(), dataKey, data, 0)
	f.gws = append(f.gws, b)
	if !waitFor(20*time.Second, func() bool { got, _ := b.Host().Active("qwen3"); return got == v }) {
		t.Fatalf("b never served the module after its data came back: %+v", readyPolicies(t, b)["qwen3"])
	}
	if rp := readyPolicies(t, b)["qwen3"]; rp.Error != "" || rp.Serving != string(v) {
		t.Fatalf("/readyz of b after the retry: %+v", rp)
	}
	if m := servingMetric(t, b); m["qwen3 "+string(v)] != 1 || len(m) != 1 {
		t.Fatalf("kvgate_policy_serving on b after the retry: %v", m)
	}
}

// A rolling upgrade: gateways of the previous release keep each model's active policy as one layout-1 value
// ({blobs}:active, written with SetActive exactly as they did) and know nothing of the stacks. New gateways keep
// that value equal to the stack's top, so the old ones follow every change made through a new one; and an
// activation written by an old gateway is adopted onto the stack once (three new gateways race for it), so the
// new ones follow it too and a rollback through a new gateway undoes it.
func TestFleetRollingUpgradeLayout1(t *testing.T) {
	t.Parallel() // waits on its own redis-server and gateways only; asserts no latency bound
	f := newFleet(t, 3)
	a := f.gws[0]
	builtin := a.Host().BuiltinVersion()
	_, floorCfg := a.Host().Active("qwen3")
	ctx := context.Background()
	st := a.store
	// An old gateway uploads and activates (its policySync: PutBlob, then SetActive of json.Marshal'd
	// {"version","config"}).
	sum := plugins.VersionOf("old", plugins.BuiltinWasm)
	if err := st.Blobs.PutBlob(ctx, string(sum), string(sum)[len("old@"):], plugins.BuiltinWasm); err != nil {
		t.Fatal(err)
	}
	for _, g := range f.gws {
		if !waitFor(30*time.Second, func() bool { return hasVersion(g, sum) }) {
			t.Fatal("a new gateway never loaded the old gateway's upload")
		}
	}
	old, _ := json.Marshal(struct {
		Version string          `json:"version"`
		Config  json.RawMessage `json:"config"`
	}{string(sum), json.RawMessage(`{"imbalance_threshold":5}`)})
	if err := st.Blobs.SetActive(ctx, "qwen3", old); err != nil {
		t.Fatal(err)
	}
	f.serves(sum, `{"imbalance_threshold":5}`)
	reconciled(t, 2, f.gws...) // every gateway has adopted the old gateway's value and written the stack
	fl, err := st.Policies.ReadFleet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s := fl.Stacks["qwen3"]; len(s) != 2 || s[0].Version != string(builtin) || s[1].Version != string(sum) {
		t.Fatalf("stack after the adoption: %+v", s)
	}
	if got, _ := st.Blobs.GetActive(ctx, "qwen3"); string(got) != string(old) {
		t.Fatalf("the old gateway's value was rewritten: %s", got)
	}
	// A rollback through a new gateway: the layout-1 value names the configured policy again, in the form
	// old gateways parse.
	if code, body := rollback(t, f.gws[1]); code != 200 {
		t.Fatalf("rollback: %d %s", code, body)
	}
	f.serves(builtin, string(floorCfg))
	got, err := st.Blobs.GetActive(ctx, "qwen3")
	if err != nil {
		t.Fatal(err)
	}
	var av struct {
		Version string          `json:"version"`
		Config  json.RawMessage `json:"config"`
	}
	if err := json.Unmarshal(got, &av); err != nil || av.Version != string(builtin) || string(compactJSON(av.Config)) != string(floorCfg) {
		t.Fatalf("layout-1 value after the rollback: %s (%v)", got, err)
	}
	// The old gateway's unload check (the value names the version) and the new one agree: the version is free.
	if code, body := adminDo(t, a, "DELETE", "/admin/v1/policies/"+string(sum), ""); code != 200 {
		t.Fatalf("unload: %d %s", code, body)
	}
	if _, _, err := st.Blobs.GetBlob(ctx, string(sum)); !errors.Is(err, kvstore.ErrNotFound) {
		t.Fatalf("blob after unload: %v", err)
	}
}

// The first new gateway of a rolling upgrade joins a fleet that has only layout-1 state (an old gateway
// uploaded a module and activated it): the stack it seeds keeps that activation, which it adopts on top of
// its configured policy, so it serves what the old gateways serve, and a rollback through it returns to the
// configured policy.
func TestFleetUpgradeFromLayout1Only(t *testing.T) {
	t.Parallel() // waits on its own redis-server and gateways only; asserts no latency bound
	f := newFleet(t, 0)
	ctx := context.Background()
	st, err := kvstore.OpenStore(ctx, kvstore.StoreConfig{Kind: "redis", Addrs: []string{f.rs.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	v := plugins.VersionOf("old", plugins.BuiltinWasm)
	if err := st.Blobs.PutBlob(ctx, string(v), string(v)[len("old@"):], plugins.BuiltinWasm); err != nil {
		t.Fatal(err)
	}
	if err := st.Blobs.SetActive(ctx, "qwen3", []byte(`{"version":"`+string(v)+`","config":{"match_threshold":0.2}}`)); err != nil {
		t.Fatal(err)
	}
	a := startGateway(t, f.yaml)
	f.gws = append(f.gws, a)
	builtin := a.Host().BuiltinVersion()
	f.serves(v, `{"match_threshold":0.2}`)
	if code, body := rollback(t, a); code != 200 || !strings.Contains(string(body), string(builtin)) {
		t.Fatalf("rollback: %d %s", code, body)
	}
	f.serves(builtin, `{}`)
	if code, body := rollback(t, a); code != 409 || adminCode(body) != "no_previous" {
		t.Fatalf("second rollback: %d %s", code, body)
	}
}
