package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/gateway/internal/route"
	"github.com/kvgate/kvgate/plugins"
)

// `kvgate serve` with simulated engines answers the banner's curl, and the policy admin commands drive it.
func TestServeAndPolicyCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a gateway with simulated engines")
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	abs, _ := filepath.Abs("../examples/models/qwen3")
	os.WriteFile(cfg, []byte("listen: \"127.0.0.1:0\"\nshutdown_grace: 0s\nadmin_token_env: KVGATE_TEST_ADMIN\nmodels:\n  - name: qwen3\n    tokenizer: "+abs+"\nsimulate: {engines: 2}\n"), 0o600)
	t.Setenv("KVGATE_TEST_ADMIN", "s3cret")
	addr, banner := runServe(t, func(ctx context.Context, out io.Writer) error { return serve(ctx, cfg, out) })
	if !strings.Contains(banner, "with 2 simulated engines") || !strings.Contains(banner, "Admin token: from $KVGATE_TEST_ADMIN") {
		t.Fatalf("banner:\n%s", banner)
	}
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"qwen3","messages":[{"role":"user","content":"Hello!"}],"max_tokens":16}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("x-kvgate-endpoint"), "sim-qwen3-") ||
		!strings.Contains(string(b), `"prompt_tokens":10`) {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, b)
	}

	wasm := filepath.Join(dir, "p.wasm")
	os.WriteFile(wasm, plugins.BuiltinWasm, 0o600)
	run := func(args ...string) (string, error) {
		root := policyAdminCmds()
		var cmd = root[0]
		for _, c := range root {
			if c.Name() == args[0] {
				cmd = c
			}
		}
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs(append(args[1:], "--gateway", "http://"+addr, "--token-env", "KVGATE_TEST_ADMIN"))
		err := cmd.ExecuteContext(context.Background())
		return out.String(), err
	}
	ver := string(plugins.VersionOf("mine", plugins.BuiltinWasm))
	out, err := run("upload", "mine", wasm)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if err != nil || len(lines) != 4 || lines[0] != "accepted "+ver[:len("mine@")+12] ||
		!regexp.MustCompile(`^  \d+ bytes, ABI v1\.\d+, compiled in \d+\.\d{3} s$`).MatchString(lines[1]) ||
		!regexp.MustCompile(`^  validation: (\d+) of (\d+) sample snapshots answered correctly`).MatchString(lines[2]) ||
		lines[3] != "activate it with: kvgate policy activate MODEL "+ver[:len("mine@")+12] {
		t.Fatalf("upload summary: %v\n%s", err, out)
	}
	t.Logf("kvgate policy upload:\n%s", out)
	if out, err := run("upload", "mine", wasm, "--json"); err != nil || !strings.Contains(out, `"accepted": true`) ||
		!strings.Contains(out, `"compile_seconds": `) {
		t.Fatalf("upload --json: %v\n%s", err, out)
	}
	os.WriteFile(filepath.Join(dir, "bad.wasm"), []byte("\x00asm\x01\x00\x00\x00"), 0o600)
	if out, err := run("upload", "bad", filepath.Join(dir, "bad.wasm")); !errors.Is(err, errRejected) ||
		!strings.HasPrefix(out, "rejected bad@") || !strings.Contains(out, "  problem: ") {
		t.Fatalf("upload of a rejected module: %v\n%s", err, out)
	}
	if out, err := run("activate", "qwen3", ver[:len("mine@")+10], "--config", `{"imbalance_threshold":2}`); err != nil {
		t.Fatalf("activate: %v\n%s", err, out)
	}
	served := regexp.MustCompile(`(?m)^  qwen3 +` + regexp.QuoteMeta(route.ShortVersion(ver)) + ` +\{"imbalance_threshold":2\}$`)
	if out, err := run("list"); err != nil || !served.MatchString(out) {
		t.Fatalf("list: %v\n%s", err, out)
	}
	if out, err := run("list", "--json"); err != nil || !strings.Contains(out, `"imbalance_threshold": 2`) {
		t.Fatalf("list --json: %v\n%s", err, out)
	}
	if out, err := run("unload", ver[:len("mine@")+10]); err == nil || !strings.Contains(err.Error(), "409") ||
		!strings.Contains(out, `"code": "policy_in_use"`) || !strings.Contains(out, "active for qwen3") {
		t.Fatalf("unload of the active version: %v\n%s", err, out)
	}
	if out, err := run("rollback", "qwen3"); err != nil || !strings.Contains(out, "three-tier@") {
		t.Fatalf("rollback: %v\n%s", err, out)
	}
	if out, err := run("unload", ver[:len("mine@")+10]); err != nil || out != "{\n  \"version\": \""+ver+"\",\n  \"unloaded\": true\n}\n" {
		t.Fatalf("unload: %v\n%s", err, out)
	}
	if out, err := run("list"); err != nil || strings.Contains(out, "mine@") || !strings.Contains(out, "three-tier@") {
		t.Fatalf("list after unload: %v\n%s", err, out)
	}
	if out, err := run("unload", ver); err == nil || !strings.Contains(err.Error(), "404") || !strings.Contains(out, `"code": "policy_not_found"`) {
		t.Fatalf("second unload: %v\n%s", err, out)
	}
	if out, err := run("unload", string(plugins.VersionOf(plugins.BuiltinName, plugins.BuiltinWasm))); err == nil ||
		!strings.Contains(out, "built-in default") {
		t.Fatalf("unload of the built-in: %v\n%s", err, out)
	}
	if out, err := run("upload", "mine", wasm); err != nil || !strings.HasPrefix(out, "accepted "+ver[:len("mine@")+12]) {
		t.Fatalf("upload after unload: %v\n%s", err, out)
	}
	if _, err := run("rollback", "nope"); err == nil {
		t.Fatal("rollback of an unknown model succeeded")
	}
}
