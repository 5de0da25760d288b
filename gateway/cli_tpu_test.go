package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// startServeGateway runs `kvgate serve` (memory store, 2 simulated engines: what `make run` starts) and
// returns its address; the gateway stops at cleanup.
func startServeGateway(t *testing.T, adminEnv string) string {
	t.Helper()
	return startServeGatewayWith(t, adminEnv, "")
}

// startServeGatewayWith is startServeGateway with extra top-level YAML (e.g. a Redis store).
func startServeGatewayWith(t *testing.T, adminEnv, extra string) string {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	abs, _ := filepath.Abs("../examples/models/qwen3")
	os.WriteFile(cfg, []byte("listen: \"127.0.0.1:0\"\nadmin_token_env: "+adminEnv+"\n"+extra+"models:\n  - name: qwen3\n    tokenizer: "+abs+"\nsimulate: {engines: 2}\n"), 0o600)
	addr, banner := runServe(t, func(ctx context.Context, out io.Writer) error { return serve(ctx, cfg, out) })
	if !strings.Contains(banner, "with 2 simulated engines") {
		t.Fatalf("banner:\n%s", banner)
	}
	return addr
}

// TestTPUCommands drives `kvgate tpu` against a running gateway: register, reserve (JSON lease with lists),
// a refusal printing the OpenAI error shape with a non-zero exit, health, inspect, renew, release, list.
func TestTPUCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a gateway with simulated engines")
	}
	t.Setenv("KVGATE_TEST_ADMIN", "s3cret")
	addr := startServeGateway(t, "KVGATE_TEST_ADMIN")
	run := func(args ...string) (string, error) {
		cmd := newTPUCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs(append(args, "--gateway", "http://"+addr, "--token-env", "KVGATE_TEST_ADMIN"))
		err := cmd.ExecuteContext(context.Background())
		return out.String(), err
	}
	if out, err := run("register", "--pool", "P", "--slice", "s1", "--gen", "v6e", "--topology", "4x4", "--hosts", "h0,h1,h2,h3"); err != nil ||
		!strings.Contains(out, `"pod_type": "v6e-16"`) {
		t.Fatalf("register: %v\n%s", err, out)
	}
	var leases []map[string]any
	for i := range 4 {
		out, err := run("reserve", "--pool", "P", "--shape", "2x2", "--holder", "job", "--ttl", "30s")
		var l map[string]any
		if err != nil || json.Unmarshal([]byte(out), &l) != nil {
			t.Fatalf("reserve %d: %v\n%s", i, err, out)
		}
		chips, _ := l["chips"].([]any)
		hosts, _ := l["hosts"].([]any)
		env, _ := l["env"].(map[string]any)
		if l["lease_id"] == "" || l["token"] == nil || l["slice"] != "s1" || len(chips) != 4 || len(hosts) != 1 || env["TPU_WORKER_HOSTNAMES"] != hosts[0] {
			t.Fatalf("reserve %d: %s", i, out)
		}
		leases = append(leases, l)
	}
	out, err := run("reserve", "--pool", "P", "--shape", "2x2", "--holder", "job", "--ttl", "30s")
	var e struct {
		Error struct {
			Code, Type, Message string
		} `json:"error"`
	}
	if err == nil || json.Unmarshal([]byte(out), &e) != nil || e.Error.Code != "no_capacity" || e.Error.Message == "" {
		t.Fatalf("fifth reserve: %v\n%s", err, out)
	}
	if out, err := run("reserve", "--pool", "P", "--shape", "3x3", "--holder", "job"); err == nil || !strings.Contains(out, `"code": "invalid_shape"`) {
		t.Fatalf("3x3: %v\n%s", err, out)
	}
	l0 := leases[0]
	tok := func(l map[string]any) string { return jsonNum(l["token"]) }
	if out, err := run("renew", "--pool", "P", "--lease", l0["lease_id"].(string), "--token", tok(l0), "--ttl", "1m"); err != nil || !strings.Contains(out, `"expires_at"`) {
		t.Fatalf("renew: %v\n%s", err, out)
	}
	if out, err := run("release", "--pool", "P", "--lease", l0["lease_id"].(string), "--token", "999"); err == nil || !strings.Contains(out, `"code": "stale_token"`) {
		t.Fatalf("stale release: %v\n%s", err, out)
	}
	if out, err := run("release", "--pool", "P", "--lease", l0["lease_id"].(string), "--token", tok(l0)); err != nil || !strings.Contains(out, `"released": true`) {
		t.Fatalf("release: %v\n%s", err, out)
	}
	if out, err := run("health", "--pool", "P", "--slice", "s1", "--host", "h0", "--healthy=false"); err != nil || !strings.Contains(out, `"unhealthy_chips": 4`) {
		t.Fatalf("health: %v\n%s", err, out)
	}
	if out, err := run("reserve", "--pool", "P", "--shape", "2x2", "--holder", "job"); err == nil || !strings.Contains(out, `"code": "no_capacity"`) {
		t.Fatalf("reserve on the unhealthy host's tile: %v\n%s", err, out)
	}
	if out, err := run("inspect", "--pool", "P", "--slice", "s1"); err != nil || !strings.Contains(out, `"owners": [`) || !strings.Contains(out, `"leased_chips": 12`) {
		t.Fatalf("inspect: %v\n%s", err, out)
	}
	if out, err := run("inspect", "--pool", "P", "--slice", "nope"); err == nil || !strings.Contains(out, `"code": "unknown_slice"`) {
		t.Fatalf("inspect unknown: %v\n%s", err, out)
	}
	if out, err := run("list", "--pool", "P"); err != nil || strings.Count(out, `"lease_id"`) != 3 {
		t.Fatalf("list: %v\n%s", err, out)
	}
	if out, err := run("pools"); err != nil || !strings.Contains(out, `"P"`) {
		t.Fatalf("pools: %v\n%s", err, out)
	}
	t.Setenv("KVGATE_TEST_ADMIN", "wrong")
	if out, err := run("list", "--pool", "P"); err == nil || !strings.Contains(out, `"code": "invalid_api_key"`) {
		t.Fatalf("wrong token: %v\n%s", err, out)
	}
}

func jsonNum(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
