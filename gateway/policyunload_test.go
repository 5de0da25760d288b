package gateway

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore/redistest"
	"github.com/kvgate/kvgate/kvstore/testenv"
	"github.com/kvgate/kvgate/plugins"
)

func hasVersion(g *Gateway, v plugins.Version) bool {
	return slices.ContainsFunc(g.Host().Versions(), func(i plugins.VersionInfo) bool { return i.Version == v })
}

// adminCode returns the OpenAI error code of an admin error body ("" if none).
func adminCode(b []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	json.Unmarshal(b, &e)
	return e.Error.Code
}

// One gateway on the memory store: DELETE needs the admin token in every path spelling, and an unloaded
// version stays unloaded (its stored module is gone, so the reconcile loop does not load it again).
func TestPolicyUnloadSingleGateway(t *testing.T) {
	t.Parallel() // waits on its own gateway and engine only; asserts no latency bound
	engines := startSims(t, 1, nil)
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), ""))
	v := plugins.VersionOf("gone", plugins.BuiltinWasm)
	hex10 := string(v)[len("gone@") : len("gone@")+10]
	for _, p := range []string{"/admin/v1/policies/gone@" + hex10, "//admin/v1/policies/gone@" + hex10,
		"/%61dmin/v1/policies/gone%40" + hex10, "/v1/../admin/v1/policies/gone@" + hex10, "/ADMIN/v1/policies/gone@" + hex10} {
		for _, auth := range []string{"", "Bearer wrong", "admintok"} {
			if st := rawStatus(t, g.Addr(), "DELETE", p, auth); st != 401 {
				t.Errorf("DELETE %s with %q: %d, want 401", p, auth, st)
			}
		}
	}
	if st, b := adminDo(t, g, "PUT", "/admin/v1/policies/gone", string(plugins.BuiltinWasm)); st != 201 {
		t.Fatalf("upload: %d %s", st, b)
	}
	// Another gateway serving another model activated it: the store's active value refuses the DELETE.
	ctx := t.Context()
	if err := g.store.Blobs.SetActive(ctx, "other-model", []byte(`{"version":"`+string(v)+`","config":{}}`)); err != nil {
		t.Fatal(err)
	}
	if st, b := adminDo(t, g, "DELETE", "/admin/v1/policies/gone@"+hex10, ""); st != 409 || adminCode(b) != "policy_in_use" ||
		!strings.Contains(string(b), "the store names it active for other-model") {
		t.Fatalf("DELETE of a version active in the store: %d %s", st, b)
	}
	if err := g.store.Blobs.SetActive(ctx, "other-model", []byte(`{"version":"`+string(g.Host().BuiltinVersion())+`","config":{}}`)); err != nil {
		t.Fatal(err)
	}
	if st, b := adminDo(t, g, "DELETE", "/admin/v1/policies/gone@"+hex10, ""); st != 200 ||
		string(b) != `{"version":"`+string(v)+`","unloaded":true}` {
		t.Fatalf("DELETE: %d %s", st, b)
	}
	if _, _, err := g.store.Blobs.GetBlob(t.Context(), string(v)); err == nil {
		t.Fatal("the stored module is still there")
	}
	reconciled(t, 3, g)
	if hasVersion(g, v) {
		t.Fatal("the unloaded version came back")
	}
	if st, b := adminDo(t, g, "DELETE", "/admin/v1/policies/"+string(v), ""); st != 404 || adminCode(b) != "policy_not_found" {
		t.Fatalf("DELETE again: %d %s", st, b)
	}
	// Unload and upload again in quick succession: the last upload stays (a loader pass that listed the
	// store before the upload's put must not unload it).
	for range 3 {
		if st, b := adminDo(t, g, "PUT", "/admin/v1/policies/gone", string(plugins.BuiltinWasm)); st != 201 {
			t.Fatalf("upload: %d %s", st, b)
		}
		if st, b := adminDo(t, g, "DELETE", "/admin/v1/policies/"+string(v), ""); st != 200 {
			t.Fatalf("DELETE: %d %s", st, b)
		}
	}
	if st, b := adminDo(t, g, "PUT", "/admin/v1/policies/gone", string(plugins.BuiltinWasm)); st != 201 {
		t.Fatalf("upload: %d %s", st, b)
	}
	reconciled(t, 3, g)
	if !hasVersion(g, v) {
		t.Fatal("the version uploaded last was unloaded")
	}
	if st, b := adminDo(t, g, "DELETE", "/admin/v1/policies/"+string(v), ""); st != 200 {
		t.Fatalf("DELETE: %d %s", st, b)
	}
	// A stored module this gateway could not load (not Wasm) is listed nowhere but can still be deleted.
	junk := []byte("not a wasm module")
	jv := plugins.VersionOf("junk", junk)
	sha := string(jv)[len("junk@"):]
	if err := g.store.Blobs.PutBlob(ctx, string(jv), sha, junk); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the loader's failure to load junk", func() bool { // the loader tries it and fails
		g.policySync.mu.Lock()
		defer g.policySync.mu.Unlock()
		return g.policySync.failed[string(jv)] != nil
	})
	if hasVersion(g, jv) {
		t.Fatal("junk loaded")
	}
	if st, b := adminDo(t, g, "DELETE", "/admin/v1/policies/junk@"+sha[:8], ""); st != 200 || !strings.Contains(string(b), string(jv)) {
		t.Fatalf("DELETE of a stored, unloadable module: %d %s", st, b)
	}
	if list, err := g.store.Blobs.ListBlobs(ctx); err != nil || len(list) != 0 {
		t.Fatalf("stored after the DELETEs: %+v %v", list, err)
	}
}

// Two gateways on one real redis-server: a version uploaded on A is loaded by B; DELETE on A is refused
// while the store's history has it active (activated through B), and after that while it is the previous
// entry (what a rollback returns to); once free, B unloads it within a few reconcile intervals. Uploading the
// module again brings it back everywhere; a gateway started with a config naming it makes it the fleet's
// configured policy (the floor of the history).
func TestPolicyUnloadTwoGatewaysOnRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	rs := redistest.Start(t)
	engines := startSims(t, 1, nil)
	yaml := gwYAML(simEndpointsYAML(engines, 64), fmt.Sprintf("store: {kind: redis, addrs: [%q]}\n", rs.Addr))
	a := startGateway(t, yaml)
	b := startGateway(t, yaml)
	builtin := a.Host().BuiltinVersion()
	upload := func(g *Gateway, name string, wasm []byte) plugins.Version {
		t.Helper()
		if st, body := adminDo(t, g, "PUT", "/admin/v1/policies/"+name, string(wasm)); st != 201 {
			t.Fatalf("upload %s: %d %s", name, st, body)
		}
		return plugins.VersionOf(name, wasm)
	}
	activate := func(g *Gateway, v plugins.Version, cfg string) {
		t.Helper()
		if st, body := adminDo(t, g, "POST", "/admin/v1/policies/activate", `{"model":"qwen3","version":"`+string(v)+`","config":`+cfg+`}`); st != 200 {
			t.Fatalf("activate %s: %d %s", v, st, body)
		}
	}
	// follows waits until g's active policy for qwen3 has config cfg.
	follows := func(g *Gateway, v plugins.Version, cfg string) {
		t.Helper()
		if !waitFor(5*time.Second, func() bool { got, c := g.Host().Active("qwen3"); return got == v && string(c) == cfg }) {
			got, c := g.Host().Active("qwen3")
			t.Fatalf("active %s %s, want %s %s", got, c, v, cfg)
		}
	}
	del := func(g *Gateway, v plugins.Version) (int, []byte) {
		t.Helper()
		return adminDo(t, g, "DELETE", "/admin/v1/policies/"+string(v), "")
	}

	v := upload(a, "shared", plugins.BuiltinWasm)
	if !waitFor(30*time.Second, func() bool { return hasVersion(b, v) }) {
		t.Fatal("b never loaded the uploaded module")
	}
	activate(b, v, `{}`)
	follows(a, v, `{}`)
	// Active for qwen3 in the store, and on both gateways.
	if st, body := del(a, v); st != 409 || adminCode(body) != "policy_in_use" || !strings.Contains(string(body), "active for qwen3") {
		t.Fatalf("DELETE of the active version: %d %s", st, body)
	}
	activate(a, builtin, `{"imbalance_threshold":3}`)
	follows(b, builtin, `{"imbalance_threshold":3}`)
	// Now the previous activation on both: kept warm for a rollback.
	if st, body := del(a, v); st != 409 || !strings.Contains(string(body), "previous activation of qwen3") {
		t.Fatalf("DELETE of the previous activation: %d %s", st, body)
	}
	activate(a, builtin, `{"imbalance_threshold":4}`)
	follows(b, builtin, `{"imbalance_threshold":4}`)
	deleted := time.Now()
	if st, body := del(a, v); st != 200 || !strings.Contains(string(body), `"unloaded":true`) {
		t.Fatalf("DELETE: %d %s", st, body)
	}
	if hasVersion(a, v) {
		t.Fatal("a still lists the version")
	}
	if !waitFor(4*PolicyReconcileInterval, func() bool { return !hasVersion(b, v) }) {
		t.Fatalf("b still lists %s %v after the DELETE on a", v, time.Since(deleted))
	}
	t.Logf("b unloaded the version %v after the DELETE on a", time.Since(deleted))
	if st, body := del(b, v); st != 404 || adminCode(body) != "policy_not_found" {
		t.Fatalf("DELETE on b afterwards: %d %s", st, body)
	}
	reconciled(t, 2, a, b)
	if hasVersion(a, v) || hasVersion(b, v) {
		t.Fatal("the unloaded version came back")
	}

	// Upload again: both have it back. A third gateway whose config names it starts on a fleet that already
	// has a history for qwen3: its configuration sets the fleet's floor (the configured policy, where
	// rollbacks stop) and the active entry above it stays. The floor cannot be unloaded, through any
	// gateway, and two rollbacks through a reach it on every gateway.
	upload(a, "shared", plugins.BuiltinWasm)
	if !waitFor(30*time.Second, func() bool { return hasVersion(b, v) }) {
		t.Fatal("b never loaded the module uploaded again")
	}
	c := startGateway(t, strings.Replace(yaml, "    queue_timeout: 400ms\n",
		"    queue_timeout: 400ms\n    policy: {name: shared, config: {imbalance_threshold: 6}}\n", 1))
	follows(c, builtin, `{"imbalance_threshold":4}`)
	for _, g := range []*Gateway{a, c} {
		if st, body := del(g, v); st != 409 || !strings.Contains(string(body), "the configured policy of qwen3") {
			t.Fatalf("DELETE of the fleet's configured policy: %d %s", st, body)
		}
	}
	for range 2 {
		if st, body := adminDo(t, a, "POST", "/admin/v1/policies/rollback", `{"model":"qwen3"}`); st != 200 {
			t.Fatalf("rollback: %d %s", st, body)
		}
	}
	for _, g := range []*Gateway{a, b, c} {
		follows(g, v, `{"imbalance_threshold":6}`)
	}
	if st, body := adminDo(t, b, "POST", "/admin/v1/policies/rollback", `{"model":"qwen3"}`); st != 409 || adminCode(body) != "no_previous" {
		t.Fatalf("rollback past the floor: %d %s", st, body)
	}
}
