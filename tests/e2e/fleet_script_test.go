package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore/testenv"
)

// syncBuf is a bytes.Buffer safe for the process's writers and the test's reads.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }

func (s *syncBuf) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// freeRange returns the first of n consecutive loopback ports that are free now.
func freeRange(t *testing.T, n int) int {
	t.Helper()
	for try := 0; try < 50; try++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		base := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if base+n > 65535 {
			continue
		}
		ok := true
		var held []net.Listener
		for p := base; p < base+n && ok; p++ {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				ok = false
				break
			}
			held = append(held, l)
		}
		for _, l := range held {
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free port range")
	return 0
}

// Issue 18: `make run-fleet`'s script starts redis-server, four engines and two gateways in one command; a
// request through one gateway and then the other lands on the same engine with cached tokens (one shared
// index); SIGINT (what Ctrl-C sends) stops every process and the script exits 0.
func TestRunFleetScript(t *testing.T) {
	testenv.Command(t, "redis-server")
	testenv.Command(t, "curl")
	binDir := t.TempDir()
	for _, b := range []string{bins.KVGate, bins.EngineSim} {
		if err := os.Symlink(b, filepath.Join(binDir, filepath.Base(b))); err != nil {
			t.Fatal(err)
		}
	}
	gw, ep, ev, rp := freeRange(t, 2), freeRange(t, 4), freeRange(t, 8), freeRange(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "examples/fleet/run-fleet.sh")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "BIN="+binDir, "FLEET_GATEWAY_PORT="+strconv.Itoa(gw), "FLEET_ENGINE_PORT="+strconv.Itoa(ep),
		"FLEET_EVENTS_PORT="+strconv.Itoa(ev), "FLEET_REDIS_PORT="+strconv.Itoa(rp), "KVGATE_ADMIN_TOKEN=fleet-token")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out syncBuf
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // whatever is left if the test fails
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(out.String(), "Stop: Ctrl-C") {
		if time.Now().After(deadline) || cmd.ProcessState != nil {
			t.Fatalf("fleet did not start:\n%s", out.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	body, err := os.ReadFile(filepath.Join(root, "examples/requests/cached-chat.json"))
	if err != nil {
		t.Fatal(err)
	}
	var eps []string
	var cached []int
	for _, port := range []int{gw, gw + 1} {
		resp, err := http.Post("http://127.0.0.1:"+strconv.Itoa(port)+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Usage struct {
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("gateway :%d: %d", port, resp.StatusCode)
		}
		eps = append(eps, resp.Header.Get("x-kvgate-endpoint"))
		cached = append(cached, r.Usage.PromptTokensDetails.CachedTokens)
	}
	if eps[0] != eps[1] || cached[0] != 0 || cached[1] < 64 {
		t.Fatalf("through :%d then :%d: endpoints %v cached %v", gw, gw+1, eps, cached)
	}
	// Ctrl-C: SIGINT to the whole process group, as a terminal sends it.
	syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	err = cmd.Wait()
	if err != nil {
		t.Fatalf("run-fleet after SIGINT: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "run-fleet: stopping 7 processes") {
		t.Fatalf("output:\n%s", out.String())
	}
	for _, port := range []int{gw, gw + 1, ep, ep + 3, rp} {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second); err == nil {
			c.Close()
			t.Fatalf("port %d still open after the fleet stopped", port)
		}
	}
}
