package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/cmd/kvgate-bench/harness"
	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/kvstore/testenv"
)

// corsPage calls the gateway from a page: a JSON POST with an Authorization header is not a "simple"
// request, so the browser sends a preflight first and reads the answer only if the gateway allows the
// page's origin. The outcome is written into <pre id="out">.
const corsPage = `<!doctype html><html><body><pre id="out">pending</pre><script>
fetch(%q + "/v1/chat/completions", {method: "POST",
  headers: {"Content-Type": "application/json", "Authorization": "Bearer browser-key"},
  body: JSON.stringify({model: %q, max_tokens: 3, messages: [{role: "user", content: "Hello from a browser page"}]})})
 .then(async r => { const j = await r.json();
   document.getElementById("out").textContent = "OK status=" + r.status + " endpoint=" + r.headers.get("x-kvgate-endpoint") +
     " prompt_tokens=" + j.usage.prompt_tokens; })
 .catch(e => { document.getElementById("out").textContent = "BLOCKED " + e.name; });
</script></body></html>`

// servePage serves corsPage on a loopback port and returns its origin; the page calls *gatewayURL (set
// once the gateway runs: its config needs the page's origin first).
func servePage(t *testing.T, gatewayURL *atomic.Value) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, corsPage, gatewayURL.Load().(string), model)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

var outRE = regexp.MustCompile(`<pre id="out">([^<]*)</pre>`)

// chromiumResult loads url in headless Chromium and returns the page's #out text once its scripts ran.
func chromiumResult(t *testing.T, chromium, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--user-data-dir="+t.TempDir(), "--virtual-time-budget=30000", "--dump-dom", url)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v\n%s", err, out)
	}
	m := outRE.FindSubmatch(out)
	if m == nil {
		t.Fatalf("no #out in the dumped DOM:\n%s", out)
	}
	return string(m[1])
}

// Issue 18: CORS per origin list. Headless Chromium loads a page from an allowed origin that calls the API
// (a preflighted request): it reads the answer and its x-kvgate-endpoint header. The same page from another
// origin is blocked by the browser, and that origin's preflight gets 403; a gateway without `cors` answers
// no preflight at all.
func TestCORSFromChromium(t *testing.T) {
	t.Parallel() // waits on its own chromium, page servers, engine and gateways only; asserts no latency bound
	chromium := testenv.Command(t, "chromium")
	env := newEnv(t)
	engines := env.Engines("e", 1, harness.EngineOptions{TimeScale: 0.05})
	var gwURL atomic.Value
	allowed := servePage(t, &gwURL)
	other := servePage(t, &gwURL)
	cfg := memoryConfig(env.Model(engines, 64, 1_000_000))
	cfg.CORS = config.CORS{AllowedOrigins: []string{allowed}}
	g := env.Gateway("g0", cfg)
	gwURL.Store(g.URL())

	got := chromiumResult(t, chromium, allowed+"/")
	if !regexp.MustCompile(`^OK status=200 endpoint=e0 prompt_tokens=\d+$`).MatchString(got) {
		t.Fatalf("allowed origin %s: page says %q", allowed, got)
	}
	if got := chromiumResult(t, chromium, other+"/"); !strings.HasPrefix(got, "BLOCKED") {
		t.Fatalf("other origin %s: page says %q", other, got)
	}

	preflight := func(base, origin string) *http.Response {
		req, _ := http.NewRequest(http.MethodOptions, base+"/v1/chat/completions", nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "authorization,content-type")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	r := preflight(g.URL(), allowed)
	if r.StatusCode != 204 || r.Header.Get("Access-Control-Allow-Origin") != allowed ||
		!strings.Contains(r.Header.Get("Access-Control-Allow-Methods"), "POST") ||
		r.Header.Get("Access-Control-Allow-Headers") != "authorization,content-type" || r.Header.Get("Access-Control-Max-Age") != "600" {
		t.Fatalf("allowed preflight: %d %v", r.StatusCode, r.Header)
	}
	if r := preflight(g.URL(), other); r.StatusCode != 403 || r.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("other origin's preflight: %d %v", r.StatusCode, r.Header)
	}
	plain := env.Gateway("g1", memoryConfig(env.Model(engines, 64, 1_000_000)))
	if r := preflight(plain.URL(), allowed); r.StatusCode == 204 || r.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("gateway without cors: %d %v", r.StatusCode, r.Header)
	}
}
