package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/gateway/internal/route"
	"github.com/kvgate/kvgate/kvstore/redistest"
	"github.com/kvgate/kvgate/plugins"
)

// TestPolicyListFleetTable (issue 12 item 2): two `kvgate serve` gateways on one real redis-server. A module
// is uploaded and activated through A; its stored data is then removed (a half-written upload), so B,
// started afterwards, fails to load it and keeps serving the configured policy. `kvgate policy list` through
// A prints the fleet's table: the stack (configured policy at the bottom, the module active on top), both
// gateways with what they serve, B's disagreement with the cause; --json prints the raw response with the
// same disagreement.
func TestPolicyListFleetTable(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and two gateways")
	}
	rs := redistest.Start(t)
	t.Setenv("KVGATE_TEST_ADMIN", "s3cret")
	store := fmt.Sprintf("store: {kind: redis, addrs: [%q]}\n", rs.Addr)
	a := startServeGatewayWith(t, "KVGATE_TEST_ADMIN", store)
	run := func(addr string, args ...string) (string, error) {
		cmd := newPolicyCmd(policyAdminCmds()...)
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append(args, "--gateway", "http://"+addr, "--token-env", "KVGATE_TEST_ADMIN"))
		err := cmd.ExecuteContext(context.Background())
		return out.String(), err
	}
	wasm := filepath.Join(t.TempDir(), "keep.wasm")
	if err := os.WriteFile(wasm, plugins.BuiltinWasm, 0o600); err != nil {
		t.Fatal(err)
	}
	v := string(plugins.VersionOf("keep", plugins.BuiltinWasm))
	builtin := ""
	if out, err := run(a, "upload", "keep", wasm); err != nil || !strings.Contains(out, "accepted") {
		t.Fatalf("upload: %v\n%s", err, out)
	}
	if out, err := run(a, "activate", "qwen3", v, "--config", `{"imbalance_threshold":7}`); err != nil {
		t.Fatalf("activate: %v\n%s", err, out)
	}
	rc := rs.Client(t)
	if n := rc.Del(t.Context(), "kvg:v1:{blobs}:d:"+v).Val(); n != 1 {
		t.Fatalf("deleted %d data keys", n)
	}
	startServeGatewayWith(t, "KVGATE_TEST_ADMIN", store)

	var out string
	deadline := time.Now().Add(15 * time.Second)
	for {
		var err error
		if out, err = run(a, "list"); err != nil {
			t.Fatalf("list: %v\n%s", err, out)
		}
		if strings.Contains(out, "1 of 2 gateways disagree") || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	var js struct {
		Fleet map[string]struct {
			Stack []struct {
				Version string `json:"version"`
			} `json:"stack"`
			Disagree []struct {
				Gateway, Serving, Error string
			} `json:"disagree"`
		} `json:"fleet"`
	}
	raw, err := run(a, "list", "--json")
	if err != nil || json.Unmarshal([]byte(raw), &js) != nil || len(js.Fleet["qwen3"].Disagree) != 1 || len(js.Fleet["qwen3"].Stack) != 2 {
		t.Fatalf("list --json: %v\n%s", err, raw)
	}
	builtin = js.Fleet["qwen3"].Stack[0].Version
	d := js.Fleet["qwen3"].Disagree[0]
	sv, sb := route.ShortVersion(v), route.ShortVersion(builtin)
	want := []*regexp.Regexp{
		regexp.MustCompile(`(?m)^FLEET qwen3: active ` + regexp.QuoteMeta(sv) + `$`),
		regexp.MustCompile(`(?m)^  0 +` + regexp.QuoteMeta(sb) + ` +\{.*\} +configured \(floor\), rollback target$`),
		regexp.MustCompile(`(?m)^  1 +` + regexp.QuoteMeta(sv) + ` +\{"imbalance_threshold":7\} +active$`),
		regexp.MustCompile(`(?m)^  \S+ +` + regexp.QuoteMeta(sv) + ` +ok$`),
		regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(d.Gateway) + ` +` + regexp.QuoteMeta(sb) + ` +disagrees: failed to load .*not found.* \(\d+ attempts, next \S+\)$`),
		regexp.MustCompile(`(?m)^  1 of 2 gateways disagree: ` + regexp.QuoteMeta(d.Gateway) + `$`),
		regexp.MustCompile(`(?m)^  qwen3 +` + regexp.QuoteMeta(sv) + ` +\{"imbalance_threshold":7\}$`), // what A serves
	}
	for _, re := range want {
		if !re.MatchString(out) {
			t.Fatalf("policy list through A lacks %s:\n%s", re, out)
		}
	}
	if d.Serving != builtin || !strings.Contains(d.Error, "failed to load") {
		t.Fatalf("the JSON's disagreement: %+v", d)
	}
}
