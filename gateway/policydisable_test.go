package gateway

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/gateway/internal/route"
	"github.com/kvgate/kvgate/plugins"
)

// A policy that passes validation but runs away once activated with a config (testdata/cfgloop.wat): the
// request is answered by the native fallback and says so (x-kvgate-policy-fallback), the host disables the
// version and rolls the model back, the rollback is stored (so other gateways follow and the store no
// longer names the version), activating it again is a 409 policy_disabled, and it can be unloaded.
func TestRunawayPolicyDisabledAndStored(t *testing.T) {
	wasm, err := os.ReadFile("testdata/cfgloop.wasm")
	if err != nil {
		t.Fatal(err)
	}
	engines := startSims(t, 2, nil)
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), ""))
	v := plugins.VersionOf("cfgloop", wasm)
	if st, b := adminDo(t, g, "PUT", "/admin/v1/policies/cfgloop", string(wasm)); st != 201 {
		t.Fatalf("upload: %d %s", st, b)
	}
	activate := `{"model":"qwen3","version":"` + string(v) + `","config":{"loop":1}}`
	if st, b := adminDo(t, g, "POST", "/admin/v1/policies/activate", activate); st != 200 {
		t.Fatalf("activate: %d %s", st, b)
	}
	url := "http://" + g.Addr() + "/v1/chat/completions"
	st, hdr, b := post(t, url, chatBody(false, 4, "spin, please"))
	if st != 200 || hdr.Get("x-kvgate-policy") != route.ShortVersion(string(v)) || hdr.Get("x-kvgate-policy-fallback") != "timeout" {
		t.Fatalf("runaway request: %d policy %q fallback %q %s", st, hdr.Get("x-kvgate-policy"), hdr.Get("x-kvgate-policy-fallback"), b)
	}
	builtin := g.Host().BuiltinVersion()
	waitFor(5*time.Second, func() bool {
		val, err := g.store.Blobs.GetActive(t.Context(), "qwen3")
		return err == nil && strings.Contains(string(val), string(builtin))
	})
	if val, err := g.store.Blobs.GetActive(t.Context(), "qwen3"); err != nil || !strings.Contains(string(val), string(builtin)) {
		t.Fatalf("stored active value after the disable: %s %v", val, err)
	}
	if active, _ := g.Host().Active("qwen3"); active != builtin {
		t.Fatalf("active %s, want the rolled-back %s", active, builtin)
	}
	if st, b := adminDo(t, g, "POST", "/admin/v1/policies/activate", activate); st != 409 || adminCode(b) != "policy_disabled" {
		t.Fatalf("activating the disabled version: %d %s", st, b)
	}
	st, hdr, _ = post(t, url, chatBody(false, 4, "spin, please"))
	if st != 200 || hdr.Get("x-kvgate-policy") != route.ShortVersion(string(builtin)) || hdr.Get("x-kvgate-policy-fallback") != "" {
		t.Fatalf("after the rollback: %d policy %q fallback %q", st, hdr.Get("x-kvgate-policy"), hdr.Get("x-kvgate-policy-fallback"))
	}
	if st, b := adminDo(t, g, "DELETE", "/admin/v1/policies/"+string(v), ""); st != 200 {
		t.Fatalf("unload the disabled version: %d %s", st, b)
	}
}
