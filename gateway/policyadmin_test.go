package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/plugins"
)

// The admin API's policy operations as seen by the gateway: rollback to the configured policy and the
// JSON shape of its answers.

// adminDo sends an admin API request with the test token and returns the status and body.
func adminDo(t *testing.T, g *Gateway, method, path, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+g.Addr()+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer admintok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// A rollback right after start-up once dropped the YAML policy config (the model went back to the built-in
// default with config null). The configured policy is now the rollback floor: rolling back from it is a 409,
// and an admin activation rolls back to it with its config.
func TestRollbackKeepsConfiguredPolicy(t *testing.T) {
	engines := startSims(t, 1, nil)
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), "")+"    policy: {name: three-tier, config: {imbalance_threshold: 4}}\n")
	activeConfig := func() string {
		t.Helper()
		st, b := adminDo(t, g, "GET", "/admin/v1/policies", "")
		var out struct {
			Active map[string]struct {
				Config json.RawMessage `json:"config"`
			} `json:"active"`
		}
		if st != 200 || json.Unmarshal(b, &out) != nil {
			t.Fatalf("list: %d %s", st, b)
		}
		return string(out.Active["qwen3"].Config)
	}
	const yamlCfg = `{"imbalance_threshold":4}`
	if got := activeConfig(); got != yamlCfg {
		t.Fatalf("start-up config %s", got)
	}
	if st, b := adminDo(t, g, "POST", "/admin/v1/policies/rollback", `{"model":"qwen3"}`); st != 409 || !strings.Contains(string(b), `"code":"no_previous"`) ||
		!strings.Contains(string(b), "Nothing to roll back to for `qwen3`") {
		t.Fatalf("rollback at start-up: %d %s", st, b)
	}
	if got := activeConfig(); got != yamlCfg {
		t.Fatalf("config after refused rollback %s", got)
	}
	v, _ := g.Host().Active("qwen3")
	if st, b := adminDo(t, g, "POST", "/admin/v1/policies/activate", `{"model":"qwen3","version":"`+string(v)+`","config":{"imbalance_threshold":2}}`); st != 200 {
		t.Fatalf("activate: %d %s", st, b)
	}
	if got := activeConfig(); got != `{"imbalance_threshold":2}` {
		t.Fatalf("config after activate %s", got)
	}
	if st, b := adminDo(t, g, "POST", "/admin/v1/policies/rollback", `{"model":"qwen3"}`); st != 200 {
		t.Fatalf("rollback: %d %s", st, b)
	}
	if got := activeConfig(); got != yamlCfg {
		t.Fatalf("config after rollback %s", got)
	}
}

// The admin API's JSON uses snake_case names and durations in seconds (it once showed Go field names and
// nanosecond integers: "CompileTime": 312000000).
func TestAdminJSONShape(t *testing.T) {
	engines := startSims(t, 1, nil)
	g := startGateway(t, gwYAML(simEndpointsYAML(engines, 64), ""))
	keys := func(m map[string]any) []string {
		var out []string
		for k := range m {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	st, b := adminDo(t, g, "PUT", "/admin/v1/policies/mine", string(plugins.BuiltinWasm))
	var up map[string]any
	if st != 201 || json.Unmarshal(b, &up) != nil {
		t.Fatalf("upload: %d %s", st, b)
	}
	rep, _ := up["report"].(map[string]any)
	if got := keys(rep); !slices.Equal(got, []string{"abi_minor", "buffer_bytes", "compile_seconds", "exports", "imports",
		"problems", "samples", "size_bytes", "version"}) {
		t.Fatalf("report keys %v", got)
	}
	if cs, ok := rep["compile_seconds"].(float64); !ok || cs < 0 || cs > 60 {
		t.Fatalf("compile_seconds %v", rep["compile_seconds"])
	}
	samples, _ := rep["samples"].([]any)
	if len(samples) == 0 {
		t.Fatalf("no samples: %s", b)
	}
	s0, _ := samples[0].(map[string]any)
	if got := keys(s0); !slices.Equal(got, []string{"duration_seconds", "endpoints", "name", "ranking"}) {
		t.Fatalf("sample keys %v", got)
	}
	if d, ok := s0["duration_seconds"].(float64); !ok || d <= 0 || d > 10 {
		t.Fatalf("duration_seconds %v", s0["duration_seconds"])
	}
	if p, ok := rep["problems"].([]any); !ok || len(p) != 0 {
		t.Fatalf("problems %v", rep["problems"])
	}
	st, b = adminDo(t, g, "GET", "/admin/v1/policies", "")
	var list struct {
		Versions []map[string]any `json:"versions"`
	}
	if st != 200 || json.Unmarshal(b, &list) != nil || len(list.Versions) != 2 {
		t.Fatalf("list: %d %s", st, b)
	}
	for _, v := range list.Versions {
		if got := keys(v); !slices.Equal(got, []string{"active_for", "builtin", "disabled", "loaded_at", "name", "sha256",
			"size_bytes", "version"}) {
			t.Fatalf("version keys %v", got)
		}
		if _, err := time.Parse(time.RFC3339Nano, v["loaded_at"].(string)); err != nil {
			t.Fatalf("loaded_at: %v", err)
		}
		if _, ok := v["active_for"].([]any); !ok {
			t.Fatalf("active_for %v", v["active_for"])
		}
	}
}
