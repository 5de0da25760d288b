package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/plugins"
)

// tryStart starts a gateway from YAML (memory store, no engines needed for start-up) and returns Start's
// error; a started gateway is closed at cleanup.
func tryStart(t *testing.T, yaml string) (*Gateway, error) {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"KVGATE_ADMIN_TOKEN": "admintok"}
	g, err := Start(context.Background(), Options{Config: cfg, Secrets: cfg.Secrets(func(k string) string { return env[k] }),
		LoadEncoder: testEncoder, Listener: ln, PolicyCacheDir: policyCache,
		Log: slog.New(slog.DiscardHandler)})
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

// TestConfigPolicyNames: the config's policy name is resolved by plugins.ResolveVersion, as the admin
// API resolves versions: "three-tier@" with no digits is refused (it used to mean the built-in), and a
// digest prefix of any case names the built-in.
func TestConfigPolicyNames(t *testing.T) {
	t.Parallel()
	endpoint := "      - {id: e0, engine: enginesim, url: \"http://127.0.0.1:9\"}\n"
	withPolicy := func(name string) string {
		return strings.Replace(gwYAML(endpoint, ""), "    queue_timeout: 400ms\n",
			"    queue_timeout: 400ms\n    policy: {name: \""+name+"\"}\n", 1)
	}
	h, err := plugins.New(context.Background(), plugins.Options{CacheDir: policyCache, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	builtin := h.BuiltinVersion()
	h.Close(context.Background())

	for _, name := range []string{"three-tier", string(builtin), strings.ToUpper(builtin.SHA256()[:10])} {
		if !strings.Contains(name, "three-tier") {
			name = "three-tier@" + name
		}
		g, err := tryStart(t, withPolicy(name))
		if err != nil {
			t.Fatalf("policy %q: %v", name, err)
		}
		if v, _ := g.Host().Active("qwen3"); v != builtin {
			t.Fatalf("policy %q: active %s, want the built-in %s", name, v, builtin)
		}
	}
	for name, want := range map[string]error{"three-tier@": plugins.ErrBadVersion, "three-tier@abc": plugins.ErrBadVersion,
		"nosuch": plugins.ErrVersionNotFound, "three-tier@00000000": plugins.ErrVersionNotFound} {
		if _, err := tryStart(t, withPolicy(name)); !errors.Is(err, want) {
			t.Errorf("policy %q: Start error %v, want %v", name, err, want)
		}
	}
}
