package harness

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// Redis is a redis-server process started by StartRedis (tests use kvstore/redistest instead, which also
// restarts it; this one serves cmd/kvgate-bench, which has no testing.TB).
type Redis struct {
	*Proc
	// Addr is 127.0.0.1:port.
	Addr string
}

// StartRedis starts redis-server (from PATH) on a free loopback port with persistence off, logging to
// dir/redis.log, and waits until the port accepts connections.
func StartRedis(ctx context.Context, dir string) (*Redis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("harness: redis-server not on PATH: %w", err)
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	p, err := StartProc("redis", filepath.Join(dir, "redis.log"), bin, []string{"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir, "--loglevel", "warning"}, nil)
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return &Redis{Proc: p, Addr: addr}, nil
		}
		if done, werr := p.Exited(); done {
			return nil, fmt.Errorf("harness: redis-server exited (%v):\n%s", werr, p.Tail(10))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			p.Kill()
			return nil, fmt.Errorf("harness: redis-server on %s not accepting: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
