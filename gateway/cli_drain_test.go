package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/cmd/enginesim/sim"
	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/gateway/internal/model"
	"github.com/kvgate/kvgate/gateway/internal/route"
	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
	"github.com/kvgate/kvgate/kvstore/testenv"
)

// drainChildEnv makes the test binary run `kvgate serve --config $KVGATE_TEST_DRAIN_CHILD` (the child
// process of TestDrainOnSIGTERM).
const drainChildEnv = "KVGATE_TEST_DRAIN_CHILD"

// streamResult is what a client read from one streamed request.
type streamResult struct {
	events int
	done   bool
	err    error
	end    time.Time
}

// openStream starts a streamed completion through addr; started is closed at its first event.
func openStream(addr string, maxTokens int, started chan<- struct{}, out chan<- streamResult) {
	body := fmt.Sprintf(`{"model":"qwen3","stream":true,"max_tokens":%d,"ignore_eos":true,"prompt":"count slowly %d"}`, maxTokens, maxTokens)
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		close(started)
		out <- streamResult{err: err, end: time.Now()}
		return
	}
	defer resp.Body.Close()
	var r streamResult
	sc := bufio.NewScanner(resp.Body)
	once := sync.Once{}
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		once.Do(func() { close(started) })
		if line == "data: [DONE]" {
			r.done = true
			continue
		}
		r.events++
	}
	once.Do(func() { close(started) })
	r.err, r.end = sc.Err(), time.Now()
	out <- r
}

// Issue 17 item 6, as a fleet on a real redis-server: gateway A is a real `kvgate serve` child process,
// gateway B runs in this process. On SIGTERM, A's /readyz fails at once while A keeps serving new
// connections for shutdown_grace, B takes A's event-ingestion lease over within a lease tick, then A stops
// accepting; of A's two in-flight streams the one that ends within drain_timeout is delivered whole and the
// other is cut at drain_timeout; A exits 0 and the store holds no lease of A's (B sees nothing in flight at
// once, not after lease_ttl).
func TestDrainOnSIGTERM(t *testing.T) {
	if p := os.Getenv(drainChildEnv); p != "" {
		if err := serve(context.Background(), p, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "serve:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if testing.Short() {
		t.Skip("runs a gateway child process through a drain (about 10 s)")
	}
	rs := redistest.Start(t)
	sc := sim.DefaultConfig()
	abs, _ := filepath.Abs("../examples/models/qwen3")
	sc.Model, sc.ServedModelNames, sc.Host = abs, []string{"qwen3"}, "127.0.0.1"
	sc.StepOverhead = 50 * time.Millisecond // 20 tokens a second: streams that outlast the grace
	sc.KVEvents = sim.KVEventsConfig{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: "tcp://*:0",
		ReplayEndpoint: "tcp://*:0", BufferSteps: 1000, HWM: 100000, MaxQueueSize: 100000}
	eng, err := sim.Start(context.Background(), sc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })

	const grace, drain = 1500 * time.Millisecond, 3 * time.Second
	yaml := fmt.Sprintf(`listen: "127.0.0.1:0"
admin_token_env: KVGATE_TEST_ADMIN
scrape_interval: 100ms
shutdown_grace: %s
drain_timeout: %s
store: {kind: redis, addrs: [%q]}
models:
  - name: qwen3
    tokenizer: %s
    endpoints:
      - {id: e0, engine: enginesim, url: "http://%s", kv_events: %q, kv_replay: %q, max_inflight_requests: 16}
`, grace, drain, rs.Addr, abs, eng.HTTPAddr(), eng.EventsAddr(), eng.ReplayAddr())
	cfgPath := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(cfgPath, []byte(yaml), 0o600)

	// Gateway A: the child process.
	child := exec.Command(os.Args[0], "-test.run=^TestDrainOnSIGTERM$")
	child.Env = append(os.Environ(), drainChildEnv+"="+cfgPath, "KVGATE_TEST_ADMIN=s3cret")
	stdout, _ := child.StdoutPipe()
	var logs strings.Builder
	var logMu sync.Mutex
	stderr, _ := child.StderrPipe()
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() {
		b, _ := io.ReadAll(stderr)
		logMu.Lock()
		logs.Write(b)
		logMu.Unlock()
	}()
	t.Cleanup(func() { child.Process.Kill() })
	addr := ""
	rd := bufio.NewScanner(stdout)
	re := regexp.MustCompile(`listening on http://(\S+)`)
	for rd.Scan() {
		if m := re.FindStringSubmatch(rd.Text()); m != nil {
			addr = m[1]
			break
		}
	}
	go io.Copy(io.Discard, stdout)
	go func() { exited <- child.Wait() }()
	if addr == "" {
		t.Fatal("the child printed no address")
	}
	// A holds e0's ingestion lease before B starts.
	if !testenv.WaitFor(10*time.Second, func() bool {
		_, b := getText(t, "http://"+addr+"/readyz", "s3cret")
		return strings.Contains(b, `"ingestion":{"e0":{"connected":true`)
	}) {
		t.Fatal("A never ingested e0's events")
	}

	// Gateway B, in process, on the same Redis.
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	b, err := Start(context.Background(), Options{Config: cfg, Listener: ln,
		Secrets: config.Secrets{AdminToken: "s3cret"}, Log: slog.New(slog.NewJSONHandler(io.Discard, nil)),
		LoadEncoder: func(dir string) (route.Encoder, error) { return model.Load(dir) }})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	leaseRounded(t, 1, b) // B's ingestion loop tried the lease at least once: A holds it
	if len(b.IngestStats()) != 0 {
		t.Fatalf("B ingests while A holds the lease: %+v", b.IngestStats())
	}

	// Two streams through A: 20 tokens (1 s) and 200 tokens (10 s, longer than grace + drain).
	results := make(chan streamResult, 2)
	var starts []chan struct{}
	for _, n := range []int{20, 200} {
		st := make(chan struct{})
		starts = append(starts, st)
		go openStream(addr, n, st, results)
	}
	for _, st := range starts {
		<-st
	}
	if n := inFlight(t, b); n != 2 {
		t.Fatalf("the store holds %d leases on e0, want the 2 streams'", n)
	}

	t0 := time.Now()
	child.Process.Signal(syscall.SIGTERM)
	// /readyz fails at once (the listener still answers).
	if !testenv.WaitFor(500*time.Millisecond, func() bool {
		code, body := getText(t, "http://"+addr+"/readyz", "")
		return code == 503 && strings.Contains(body, `"draining":true`)
	}) {
		t.Fatal("/readyz did not fail within 0.5 s of SIGTERM")
	}
	failAfter := time.Since(t0)
	// New connections are still served during the grace, and told to close.
	time.Sleep(300 * time.Millisecond)
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/completions",
		strings.NewReader(`{"model":"qwen3","max_tokens":2,"prompt":"during the grace"}`))
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("a new request during the grace: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !resp.Close {
		t.Fatalf("during the grace: %d, close %v", resp.StatusCode, resp.Close)
	}
	// B takes e0's events over within a lease tick of the handover (not after the lease expires).
	if !testenv.WaitFor(IngestLeaseTick+time.Second, func() bool { return len(b.IngestStats()) == 1 }) {
		t.Fatal("B did not take e0's ingestion over")
	}
	takeover := time.Since(t0)
	// After the grace A stops accepting.
	time.Sleep(time.Until(t0.Add(grace + 400*time.Millisecond)))
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("A still accepts after shutdown_grace")
	}
	r1, r2 := <-results, <-results
	if r1.events > r2.events {
		r1, r2 = r2, r1
	}
	if !r1.done || r1.events != 20 {
		t.Fatalf("the short stream was not delivered whole: %+v", r1)
	}
	if r2.done || r2.events >= 200 || r2.end.Sub(t0) < grace+drain-300*time.Millisecond || r2.end.Sub(t0) > grace+drain+4*time.Second {
		t.Fatalf("the long stream: %+v, ended %v after SIGTERM (want about %v)", r2, r2.end.Sub(t0), grace+drain)
	}
	select {
	case err := <-exited:
		if err != nil {
			logMu.Lock()
			t.Fatalf("A exited with %v\n%s", err, logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("A did not exit")
	}
	exitAfter := time.Since(t0)
	if n := inFlight(t, b); n != 0 {
		t.Fatalf("A left %d leases on the store", n)
	}
	// The fleet goes on: B serves.
	if code, body := postJSON(t, "http://"+b.Addr()+"/v1/completions", `{"model":"qwen3","max_tokens":2,"prompt":"after A"}`); code != 200 {
		t.Fatalf("B after A left: %d %s", code, body)
	}
	t.Logf("readyz failed %v after SIGTERM; B ingested after %v; long stream cut at %v; A exited after %v",
		failAfter.Round(time.Millisecond), takeover.Round(time.Millisecond), r2.end.Sub(t0).Round(time.Millisecond), exitAfter.Round(time.Millisecond))
}

func inFlight(t *testing.T, g *Gateway) int64 {
	t.Helper()
	m, err := g.Reservations().InFlight(context.Background(), []kvstore.EndpointID{"e0"})
	if err != nil {
		t.Fatal(err)
	}
	return m["e0"].Requests
}

// getText is a GET with an optional bearer token; a transport error comes back as status 0 and its text.
func getText(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func postJSON(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
