package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/plugins"
)

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
		g, err := startGatewayEnv(t, withPolicy(name), nil)
		if err != nil {
			t.Fatalf("policy %q: %v", name, err)
		}
		if v, _ := g.Host().Active("qwen3"); v != builtin {
			t.Fatalf("policy %q: active %s, want the built-in %s", name, v, builtin)
		}
	}
	for name, want := range map[string]error{"three-tier@": plugins.ErrBadVersion, "three-tier@abc": plugins.ErrBadVersion,
		"nosuch": plugins.ErrVersionNotFound, "three-tier@00000000": plugins.ErrVersionNotFound} {
		if _, err := startGatewayEnv(t, withPolicy(name), nil); !errors.Is(err, want) {
			t.Errorf("policy %q: Start error %v, want %v", name, err, want)
		}
	}
}

// TestFailedStartLeaksNothing: a Start that fails at its last component (metrics_listen on an address in
// use), after the store, policy host, endpoint scrapes, ingestion and the HTTP server have started, closes
// them all: the goroutine count returns to what it was, and the gateway's listener is closed. A failure at
// the first component (a store TLS file that does not exist) leaves nothing either.
func TestFailedStartLeaksNothing(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	endpoint := "      - {id: e0, engine: enginesim, url: \"http://127.0.0.1:9\"}\n"
	// Warm up once (lazily started runtime and library goroutines), then count.
	if _, err := startGatewayEnv(t, gwYAML(endpoint, "metrics_listen: \""+busy.Addr().String()+"\"\n"), nil); err == nil {
		t.Fatal("Start succeeded with metrics_listen on an address in use")
	}
	for name, extra := range map[string]string{
		"last component":  "metrics_listen: \"" + busy.Addr().String() + "\"\n",
		"first component": "store: {kind: redis, addrs: [\"127.0.0.1:9\"], tls: {ca_file: /nonexistent/ca.pem}}\n",
	} {
		base := gatewayGoroutines()
		cfg, err := config.Parse([]byte(gwYAML(endpoint, extra)))
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		_, err = Start(context.Background(), Options{Config: cfg, Secrets: cfg.Secrets(func(string) string { return "" }),
			LoadEncoder: testEncoder, Listener: ln, PolicyCacheDir: policyCache, Log: slog.New(slog.DiscardHandler)})
		if err == nil {
			t.Fatalf("%s: Start succeeded", name)
		}
		if name == "last component" {
			if c, derr := net.Dial("tcp", ln.Addr().String()); derr == nil {
				c.Close()
				t.Errorf("%s: the gateway's listener still accepts after a failed Start (%v)", name, err)
			}
		}
		ln.Close()
		if !waitFor(5*time.Second, func() bool { return gatewayGoroutines() <= base }) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%s (%v): %d goroutines after the failed Start, %d before:\n%s", name, err, gatewayGoroutines(),
				base, buf[:runtime.Stack(buf, true)])
		}
	}
}

// gatewayGoroutines counts the goroutines, less fasthttp's idle-worker cleaner: it sleeps 10 s between
// rounds and exits at its next round after the server stopped.
func gatewayGoroutines() int {
	buf := make([]byte, 4<<20)
	n := 0
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if !strings.Contains(g, "fasthttp.(*workerPool).Start.func2") {
			n++
		}
	}
	return n
}
