package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/cmd/enginesim/sim"
	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
	"github.com/kvgate/kvgate/kvstore/testenv"
)

// The "done when" of issue #17 item 1: two gateways on one Redis, each with its own watched config file,
// take an endpoint added and one removed (through gateway A's file) under steady traffic from the official
// client through both, streamed and not, with no failed request. B follows the store and says in /readyz
// that its file disagrees, until its file is updated too.
func TestEndpointsFleetUnderTraffic(t *testing.T) {
	t.Parallel() // waits on its own redis-server, engines and gateways only; asserts no latency bound
	if testing.Short() {
		t.Skip("starts redis-server and two gateways under traffic")
	}
	rs := redistest.Start(t)
	engines := startSims(t, 3, nil)
	store := fmt.Sprintf("store: {kind: redis, addrs: [%q]}\n", rs.Addr)
	dir := t.TempDir()
	pa, pb := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	before := epYAML("e0", engines[0]) + epYAML("e1", engines[1])
	after := epYAML("e1", engines[1]) + epYAML("e2", engines[2])
	writeFile(t, pa, fileYAML(store, before))
	writeFile(t, pb, fileYAML(store, before))
	a := startGatewayFile(t, pa)
	b := startGatewayFile(t, pb)
	waitSubscribed(t, engines[:2], a, b)

	stop := make(chan struct{})
	counts, wg := steadyTraffic([]*Gateway{a, b}, 4, stop)
	counts.await(t, "traffic on e0 and e1 before the change", func(c *trafficCounts) bool {
		return c.byEndpoint["e0"] > 0 && c.byEndpoint["e1"] > 0 && c.ok.Load() >= 10 && c.streamOK.Load() >= 10
	})
	changed := time.Now()
	writeFile(t, pa, fileYAML(store, after))
	if !waitFor(10*time.Second, func() bool { return states(listEndpoints(t, b)) == "e1:active+routed e2:active+routed" }) {
		t.Fatalf("B after A's reload: %s", states(listEndpoints(t, b)))
	}
	t.Logf("e0 drained and removed, e2 added on both gateways %.2fs after the file changed", time.Since(changed).Seconds())
	if s := states(listEndpoints(t, a)); s != "e1:active+routed e2:active+routed" {
		t.Fatalf("A: %s", s)
	}
	mm := mismatchOf(t, b)
	if len(mm) != 2 || !strings.HasPrefix(mm[0], "e0: in this gateway's config file, not in the store") ||
		!strings.HasPrefix(mm[1], "e2: in the store (from a config file), not in this gateway's") {
		t.Fatalf("B's mismatch: %q", mm)
	}
	if mm := mismatchOf(t, a); len(mm) != 0 {
		t.Fatalf("A's mismatch: %q", mm)
	}
	counts.mu.Lock()
	e0Then := counts.byEndpoint["e0"]
	counts.mu.Unlock()
	writeFile(t, pb, fileYAML(store, after))
	if !waitFor(5*time.Second, func() bool { return len(mismatchOf(t, b)) == 0 }) {
		t.Fatalf("B's mismatch after its file changed: %q", mismatchOf(t, b))
	}
	// 150 requests after the change: where e0, were it still routed, would have served some.
	n0 := counts.served()
	counts.await(t, "150 requests after the change, some on e2", func(c *trafficCounts) bool {
		return c.served() >= n0+150 && c.byEndpoint["e2"] > 0 && c.ok.Load() >= 20 && c.streamOK.Load() >= 20
	})
	close(stop)
	wg.Wait()
	counts.mu.Lock()
	defer counts.mu.Unlock()
	t.Logf("official client: %d non-streamed ok, %d failed; %d streamed ok, %d failed; by endpoint %v",
		counts.ok.Load(), counts.failed.Load(), counts.streamOK.Load(), counts.streamFailed.Load(), counts.byEndpoint)
	if counts.failed.Load()+counts.streamFailed.Load() != 0 {
		t.Fatalf("failed requests: %v", counts.errs)
	}
	if counts.ok.Load() < 20 || counts.streamOK.Load() < 20 || counts.byEndpoint["e2"] == 0 || counts.byEndpoint["e0"] == 0 {
		t.Fatalf("traffic did not cover the change: %v", counts.byEndpoint)
	}
	if counts.byEndpoint["e0"] != e0Then {
		t.Fatalf("e0 served %d requests after it was removed", counts.byEndpoint["e0"]-e0Then)
	}
	for i, e := range engines {
		if n := len(e.EventSubscriptions()); n != map[int]int{0: 0, 1: 1, 2: 1}[i] {
			t.Fatalf("engine %d has %d KV-event subscribers", i, n)
		}
	}
}

// Issue #12 item 3 (remainder): a Redis restarted empty gets the run-time endpoints back from the
// gateways' copies (the first re-seeder under the new epoch wins), not the config files' lists: an
// endpoint added through the admin API survives, and a drained one stays drained.
func TestEndpointsReseedAfterEmptyRedis(t *testing.T) {
	t.Parallel() // waits on its own redis-server, engines and gateways only; asserts no latency bound
	if testing.Short() {
		t.Skip("starts and restarts redis-server")
	}
	rs := redistest.Start(t)
	engines := startSims(t, 3, nil)
	store := fmt.Sprintf("store: {kind: redis, addrs: [%q]}\n", rs.Addr)
	dir := t.TempDir()
	pa, pb := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	files := epYAML("e0", engines[0]) + epYAML("e1", engines[1])
	writeFile(t, pa, fileYAML(store, files))
	writeFile(t, pb, fileYAML(store, files))
	a := startGatewayFile(t, pa)
	b := startGatewayFile(t, pb)
	e2 := fmt.Sprintf(`{"model":"qwen3","id":"e2","engine":"enginesim","url":"http://%s","kv_events":%q}`, engines[2].HTTPAddr(), engines[2].EventsAddr())
	if code := adminCall(t, a, "POST", "/admin/v1/endpoints", e2, nil); code != 201 {
		t.Fatalf("add e2: %d", code)
	}
	if code := adminCall(t, a, "POST", "/admin/v1/endpoints/e1/drain", "", nil); code != 202 {
		t.Fatalf("drain e1: %d", code)
	}
	const want = "e0:active+routed e1:drained e2:active+routed"
	if !waitFor(10*time.Second, func() bool { return states(listEndpoints(t, b)) == want }) {
		t.Fatalf("B before the restart: %s", states(listEndpoints(t, b)))
	}
	rc := rs.Client(t)
	ctx := context.Background()
	rs.Restart()
	if n, err := rc.DBSize(ctx).Result(); err != nil || n > 2 {
		t.Logf("redis after the restart: %d keys (%v)", n, err)
	}
	st, err := kvstore.OpenStore(ctx, kvstore.StoreConfig{Kind: "redis", Addrs: []string{rs.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// The marker and the endpoint set come back in one step: no read sees a marker without the set (a
	// gateway without a copy would seed its file's list there).
	var set kvstore.EndpointSet
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		set, err = st.Endpoints.ReadEndpoints(ctx)
		if err == nil && set.Marker != "" {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if set.Marker == "" || set.Rev != 1 {
		t.Fatalf("first read with a fleet-state marker after the restart: marker %q revision %d (%v)", set.Marker, set.Rev, err)
	}
	var got []string
	for _, r := range set.Records {
		got = append(got, r.ID+":"+r.State+":"+r.Source)
	}
	if strings.Join(got, " ") != "e0:active:config e1:drained:config e2:active:admin" || set.Marker == "" {
		t.Fatalf("re-seeded set (marker %q): %v", set.Marker, got)
	}
	for _, g := range []*Gateway{a, b} {
		// Until a gateway follows the new marker its store reads fail as unavailable (503): wait it out.
		if !waitFor(10*time.Second, func() bool { return tryStates(t, g) == want }) {
			t.Fatalf("gateway after the re-seed: %s", tryStates(t, g))
		}
	}
	for i := range 4 {
		if code, _, body := post(t, "http://"+b.Addr()+"/v1/completions", fmt.Sprintf(`{"model":"qwen3","max_tokens":1,"prompt":"after the restart %d"}`, i)); code != 200 {
			t.Fatalf("request after the restart: %d %s", code, body)
		}
	}
}

// dnsmasq serves the A records of a hosts file on a loopback UDP/TCP port; Set rewrites the file and
// makes dnsmasq re-read it (SIGHUP to its own process).
type dnsmasq struct {
	cmd   *exec.Cmd
	hosts string
	addr  string
}

func startDNSMasq(t *testing.T, name string, ips ...string) *dnsmasq {
	t.Helper()
	bin, err := exec.LookPath("dnsmasq")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/dnsmasq"); serr == nil {
			bin = "/usr/sbin/dnsmasq"
		} else {
			testenv.Missing(t, "dnsmasq not installed: %v", err)
		}
	}
	d := &dnsmasq{hosts: filepath.Join(t.TempDir(), "hosts")}
	d.write(t, name, ips...)
	for range 5 {
		port := freeUDPPort(t)
		d.addr = fmt.Sprintf("127.0.0.1:%d", port)
		d.cmd = exec.Command(bin, "--no-daemon", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
			"--addn-hosts="+d.hosts, fmt.Sprintf("--port=%d", port), "--listen-address=127.0.0.1", "--bind-interfaces",
			"--pid-file=", "--cache-size=0", "--local=/"+name[strings.Index(name, ".")+1:]+"/", "--log-facility=-")
		if err := d.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { d.cmd.Wait(); close(exited) }()
		select {
		case <-exited: // the port was taken meanwhile: try another
			continue
		case <-time.After(300 * time.Millisecond):
		}
		t.Cleanup(func() { d.cmd.Process.Kill(); <-exited })
		return d
	}
	t.Fatal("dnsmasq did not start")
	return nil
}

func (d *dnsmasq) write(t *testing.T, name string, ips ...string) {
	var b strings.Builder
	for _, ip := range ips {
		fmt.Fprintf(&b, "%s %s\n", ip, name)
	}
	writeFile(t, d.hosts, b.String())
}

// Set makes name resolve to ips (none: NXDOMAIN).
func (d *dnsmasq) Set(t *testing.T, name string, ips ...string) {
	d.write(t, name, ips...)
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
}

func freeUDPPort(t *testing.T) int {
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// startSimAt starts a simulated engine on ip:port (HTTP only: the DNS test's engines share one port on
// different loopback addresses).
func startSimAt(t *testing.T, ip string, port int) (*sim.Engine, error) {
	c := sim.DefaultConfig()
	c.Model = qwenDir
	c.ServedModelNames = []string{"qwen3"}
	c.Host, c.Port = ip, port
	c.NumGPUBlocks = 4096
	c.TimeScale = 0.05
	return sim.Start(context.Background(), c)
}

// Endpoints from DNS: two gateways on one Redis resolve a name served by dnsmasq on loopback whose
// records change under traffic; engines appear (added, probed, routed) and disappear (drained, removed,
// then stopped) with no failed client request.
func TestEndpointsFromDNS(t *testing.T) {
	t.Parallel() // waits on its own dnsmasq, redis-server, engines and gateways only; asserts no latency bound
	if testing.Short() {
		t.Skip("starts dnsmasq, redis-server and two gateways under traffic")
	}
	const name = "engines.kvgate.test"
	// Three engines on one port at 127.0.0.2, .3 and .4 (a headless Service's pods).
	var engines []*sim.Engine
	port := 0
	for attempt := 0; attempt < 5 && len(engines) < 3; attempt++ {
		for _, e := range engines {
			e.Close()
		}
		engines = nil
		ln, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Skip("cannot bind 127.0.0.2:", err)
		}
		port = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		for i := 2; i <= 4; i++ {
			e, err := startSimAt(t, fmt.Sprintf("127.0.0.%d", i), port)
			if err != nil {
				break
			}
			engines = append(engines, e)
		}
	}
	if len(engines) < 3 {
		t.Fatal("could not start three engines on one port")
	}
	for _, e := range engines {
		t.Cleanup(func() { e.Close() })
	}
	dns := startDNSMasq(t, name, "127.0.0.2", "127.0.0.3")
	rs := redistest.Start(t)
	yaml := "listen: \"127.0.0.1:0\"\nscrape_interval: 100ms\n" + fmt.Sprintf("store: {kind: redis, addrs: [%q]}\n", rs.Addr) + `
models:
  - name: qwen3
    tokenizer: ` + qwenDir + `
    queue_timeout: 2s
    endpoints_from: {dns: ` + name + `, port: ` + fmt.Sprint(port) + `, engine: enginesim, refresh: 200ms, resolver: "` + dns.addr + `", max_inflight_requests: 32}
`
	a := startGateway(t, yaml)
	var blogs logBuffer // b's warnings: the failed resolution after the resolver is gone
	b := startGatewayTo(t, yaml, io.MultiWriter(os.Stderr, &blogs), slog.LevelWarn)
	id := func(i int) string { return fmt.Sprintf("qwen3@127.0.0.%d:%d", i, port) }
	want := func(ids ...int) string {
		var s []string
		for _, i := range ids {
			s = append(s, id(i)+":active+routed")
		}
		return strings.Join(s, " ")
	}
	for _, g := range []*Gateway{a, b} {
		if !waitFor(10*time.Second, func() bool { return states(listEndpoints(t, g)) == want(2, 3) }) {
			t.Fatalf("discovered at start: %s", states(listEndpoints(t, g)))
		}
	}
	if !waitFor(5*time.Second, func() bool { return a.eps.Load(id(2)).Healthy && b.eps.Load(id(3)).Healthy }) {
		t.Fatal("discovered endpoints never healthy")
	}
	stop := make(chan struct{})
	counts, wg := steadyTraffic([]*Gateway{a, b}, 4, stop)
	counts.await(t, "traffic on .2 and .3", func(c *trafficCounts) bool { return c.byEndpoint[id(2)] > 0 && c.byEndpoint[id(3)] > 0 })
	// .4 appears, .2 disappears; then the engine at .2 stops once it is out of the fleet.
	dns.Set(t, name, "127.0.0.3", "127.0.0.4")
	for _, g := range []*Gateway{a, b} {
		if !waitFor(10*time.Second, func() bool { return states(listEndpoints(t, g)) == want(3, 4) }) {
			t.Fatalf("after the records changed: %s", states(listEndpoints(t, g)))
		}
	}
	engines[0].Close()
	n0 := counts.served()
	counts.await(t, "100 requests after .2's engine stopped", func(c *trafficCounts) bool { return c.served() >= n0+100 })
	// .3 goes too: drained and removed, then its engine stops.
	dns.Set(t, name, "127.0.0.4")
	for _, g := range []*Gateway{a, b} {
		if !waitFor(10*time.Second, func() bool { return states(listEndpoints(t, g)) == want(4) }) {
			t.Fatalf("after .3 went: %s", states(listEndpoints(t, g)))
		}
	}
	engines[1].Close()
	n1 := counts.served()
	counts.await(t, "100 requests after .3's engine stopped", func(c *trafficCounts) bool { return c.served() >= n1+100 })
	close(stop)
	wg.Wait()
	// A name that no longer exists (NXDOMAIN) is an empty fleet; a resolver that does not answer changes
	// nothing.
	dns.Set(t, name)
	if !waitFor(10*time.Second, func() bool { return states(listEndpoints(t, b)) == "" }) {
		t.Fatalf("after NXDOMAIN: %s", states(listEndpoints(t, b)))
	}
	dns.Set(t, name, "127.0.0.4")
	if !waitFor(10*time.Second, func() bool { return states(listEndpoints(t, b)) == want(4) }) {
		t.Fatalf("after the name came back: %s", states(listEndpoints(t, b)))
	}
	// The event: b's next resolution failed (after a success, b logs the next failure).
	failed := map[string]any{"msg": "endpoint discovery failed: the discovered endpoints stay as they are"}
	before := len(blogs.lines(failed))
	dns.cmd.Process.Kill()
	if !waitFor(10*time.Second, func() bool { return len(blogs.lines(failed)) > before }) {
		t.Fatalf("b never failed a resolution with the resolver gone; log:\n%s", blogs.String())
	}
	if s := states(listEndpoints(t, b)); s != want(4) {
		t.Fatalf("with the resolver gone: %s", s)
	}
	counts.mu.Lock()
	defer counts.mu.Unlock()
	t.Logf("official client: %d non-streamed ok, %d failed; %d streamed ok, %d failed; by endpoint %v",
		counts.ok.Load(), counts.failed.Load(), counts.streamOK.Load(), counts.streamFailed.Load(), counts.byEndpoint)
	if counts.byEndpoint[id(4)] == 0 || counts.byEndpoint[id(2)] == 0 {
		t.Fatalf("traffic did not cover the change: %v", counts.byEndpoint)
	}
	if counts.failed.Load()+counts.streamFailed.Load() != 0 {
		t.Fatalf("failed requests: %v", counts.errs)
	}
}
