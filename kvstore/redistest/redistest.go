// Package redistest starts real redis-server processes for tests: a single server on a free loopback port
// (Start) and a Redis Cluster of N masters (StartCluster). Servers run with persistence off and are killed
// when the test ends. When redis-server is not on PATH the test is skipped, or fails when the environment
// variable CI is "true" (the rule of kvstore/testenv.Command).
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/kvstore/testenv"
)

// Server is one redis-server process on 127.0.0.1.
type Server struct {
	// Addr is "127.0.0.1:<port>"; it stays the same across Restart.
	Addr string

	t    testing.TB
	bin  string
	dir  string
	args []string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start runs a redis-server (`--save "" --appendonly no`) on a free loopback port and waits until it
// answers PING. The process is killed at test cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, nil)
}

// StartArgs is Start with extra redis-server arguments (for example "--maxmemory", "64mb").
func StartArgs(t testing.TB, extra ...string) *Server {
	t.Helper()
	return start(t, extra)
}

func start(t testing.TB, extra []string) *Server {
	t.Helper()
	bin := testenv.Command(t, "redis-server")
	dir := t.TempDir()
	var lastErr error
	for range 5 { // the free port may be taken between probing and binding
		port := freePort(t)
		s := &Server{
			Addr: "127.0.0.1:" + strconv.Itoa(port),
			t:    t, bin: bin, dir: dir,
			args: ServerArgs(port, dir, extra...),
		}
		if lastErr = s.launch(); lastErr == nil {
			t.Cleanup(s.stop)
			return s
		}
	}
	t.Fatalf("redistest: start redis-server: %v", lastErr)
	return nil
}

func (s *Server) launch() error {
	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.dir
	logf, err := os.OpenFile(filepath.Join(s.dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	exited := func() (bool, string) {
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return true, strings.TrimSpace(string(log))
		default:
			return false, ""
		}
	}
	if err := WaitReady(context.Background(), s.Addr, exited); err != nil {
		_ = cmd.Process.Kill()
		return err
	}
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	return nil
}

// ServerArgs is the redis-server command line of every server this repository starts (these tests' and
// cmd/kvgate-bench's): port on 127.0.0.1, persistence off, working directory dir, in the foreground, log
// level warning, then extra.
func ServerArgs(port int, dir string, extra ...string) []string {
	return append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--daemonize", "no", "--loglevel", "warning",
	}, extra...)
}

// WaitReady waits up to 10 s (or until ctx ends) for the server at addr to answer PING. exited reports
// whether the process has ended, with its log for the error; the error says which happened.
func WaitReady(ctx context.Context, addr string, exited func() (bool, string)) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if done, log := exited(); done {
			return fmt.Errorf("redis-server exited: %s", log)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("redis-server on %s not answering: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Client returns a go-redis client for the server, closed at test cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop kills the server (data is lost: persistence is off). Restart brings it back on the same port.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Kill()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
	}
}

// Restart kills the server and starts a new, empty one on the same address (a Redis restart as a gateway
// sees it: connections drop and all keys are gone).
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	var err error
	for range 50 {
		if err = s.launch(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("redistest: restart: %v", err)
}

func (s *Server) stop() {
	s.Resume() // a paused server must get SIGCONT to die on SIGKILL's way out cleanly
	s.Stop()
}

// Pause stops the server with SIGSTOP (kill -STOP): connections stay open and commands hang until Resume.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(sig)
	}
}

// Cluster is a Redis Cluster of masters without replicas, each a Server with cluster-enabled.
type Cluster struct {
	// Addrs are the masters' addresses.
	Addrs []string
	// Servers are the masters' processes, in the order of Addrs (Stop or Restart one to test failover).
	Servers []*Server
}

// StartCluster starts n (≥ 3) redis-server processes with cluster mode on, joins them with
// `redis-cli --cluster create` (slots spread evenly, no replicas) and waits until every node reports
// cluster_state:ok.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	if n < 3 {
		t.Fatalf("redistest: a Redis Cluster needs at least 3 masters, got %d", n)
	}
	cli := testenv.Command(t, "redis-cli")
	c := &Cluster{}
	for range n {
		s := start(t, []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes-" + strconv.Itoa(len(c.Servers)) + ".conf", "--cluster-node-timeout", "5000"})
		c.Servers = append(c.Servers, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.Command(cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, addr := range c.Addrs {
		rc := redis.NewClient(&redis.Options{Addr: addr})
		for {
			info, err := rc.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				rc.Close()
				t.Fatalf("redistest: cluster node %s not ok: %v %s", addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		rc.Close()
	}
	return c
}

// Client returns a go-redis cluster client for the cluster, closed at test cleanup.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}
