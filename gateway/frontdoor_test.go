package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fdChildEnv makes the test binary run TestListenerSurvivesFDExhaustion's gateway process.
const fdChildEnv = "KVGATE_TEST_FD_CHILD"

// scrapeMetric reads one sample (name with its label text, e.g. `kvgate_x{a="b"}`) from a /metrics page.
func scrapeMetric(t testing.TB, url, sample string) float64 {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer admintok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// Issue 10 (1): a gateway process out of file descriptors keeps its listener: accept errors (EMFILE) are
// logged, counted and retried, and once the idle connections go away /healthz answers again. Before the
// fix fasthttp's Serve returned on EMFILE and the port stayed dead. A real child process (this binary)
// with a low RLIMIT_NOFILE holds the gateway; this process opens the connections.
func TestListenerSurvivesFDExhaustion(t *testing.T) {
	if os.Getenv(fdChildEnv) == "1" {
		fdChild(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestListenerSurvivesFDExhaustion$", "-test.v")
	cmd.Env = append(os.Environ(), fdChildEnv+"=1")
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}()
	addrCh := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "FDCHILD_ADDR "); ok {
				addrCh <- a
			}
		}
	}()
	var addr string
	select {
	case addr = <-addrCh:
	case <-time.After(60 * time.Second):
		t.Fatalf("child never listened; stderr:\n%s", stderr.String())
	}
	// More connections than the child has descriptors, held idle, then let go.
	var conns []net.Conn
	for range 400 {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	time.Sleep(1500 * time.Millisecond)
	for _, c := range conns {
		c.Close()
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	ok := waitFor(8*time.Second, func() bool {
		resp, err := hc.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	if !ok {
		t.Fatalf("/healthz never answered after the connections closed (%d opened); child stderr:\n%s", len(conns), stderr.String())
	}
	if n := scrapeMetric(t, "http://"+addr+"/metrics", "kvgate_accept_errors_total"); n < 1 {
		t.Errorf("kvgate_accept_errors_total = %v, want ≥ 1 (the descriptors ran out)", n)
	}
	if !strings.Contains(stderr.String(), "accept failed") {
		t.Errorf("no accept error logged; child stderr:\n%s", stderr.String())
	}
}

// fdChild runs the gateway with a descriptor limit a little above what it uses, until stdin closes.
func fdChild(t *testing.T) {
	g := startGateway(t, gwYAML("      - {id: e0, engine: enginesim, url: \"http://127.0.0.1:1\"}\n", ""))
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	lim.Cur = uint64(len(ents) + 64)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("FDCHILD_ADDR %s\n", g.Addr())
	io.Copy(io.Discard, os.Stdin)
}

// Issue 10 (1): serving that ends without Close is reported on Stopped (kvgate serve then exits non-zero).
func TestStoppedWhenServingEnds(t *testing.T) {
	g := startGateway(t, gwYAML("      - {id: e0, engine: enginesim, url: \"http://127.0.0.1:1\"}\n", ""))
	g.ln.Close()
	select {
	case err := <-g.Stopped():
		if err == nil || !strings.Contains(err.Error(), "stopped serving") {
			t.Fatalf("Stopped: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Stopped never fired after the listener closed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g.Close(ctx)
	select {
	case err := <-g.Stopped():
		t.Fatalf("a second Stopped after Close: %v", err)
	default:
	}
}
