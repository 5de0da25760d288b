package harness

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/kvgate/kvgate/kvstore/redistest"
)

// Redis is a redis-server process started by StartRedis: kvstore/redistest's command line and readiness
// wait (ServerArgs, WaitReady) in a harness Proc, whose CPU time the benchmark reads (tests use
// kvstore/redistest.Start, which also restarts it; cmd/kvgate-bench has no testing.TB).
type Redis struct {
	*Proc
	// Addr is 127.0.0.1:port.
	Addr string
}

// StartRedis starts redis-server (from PATH) on a free loopback port with persistence off, logging to
// dir/redis.log, and waits until it answers PING.
func StartRedis(ctx context.Context, dir string) (*Redis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("harness: redis-server not on PATH: %w", err)
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	p, err := StartProc("redis", filepath.Join(dir, "redis.log"), bin, redistest.ServerArgs(port, dir), nil)
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	exited := func() (bool, string) {
		done, werr := p.Exited()
		return done, fmt.Sprintf("(%v)\n%s", werr, p.Tail(10))
	}
	if err := redistest.WaitReady(ctx, addr, exited); err != nil {
		p.Kill()
		return nil, fmt.Errorf("harness: %w", err)
	}
	return &Redis{Proc: p, Addr: addr}, nil
}
