package tpu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/kvstore/redistest"
)

type hammerResult struct{ Granted, Refused, Other int64 }

// hammer runs n goroutines that each try once for a 2x2 of pool, all starting at start.
func hammer(a *Allocator, pool string, n int, start time.Time, who string) hammerResult {
	var ok, full, other atomic.Int64
	var wg sync.WaitGroup
	time.Sleep(time.Until(start))
	for i := range n {
		wg.Go(func() {
			_, err := a.Reserve(context.Background(), pool, Request{Shape: "2x2", Holder: fmt.Sprintf("%s-%d", who, i), TTL: time.Minute})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, ErrNoCapacity):
				full.Add(1)
			default:
				other.Add(1)
			}
		})
	}
	wg.Wait()
	return hammerResult{ok.Load(), full.Load(), other.Load()}
}

// TestHammerChild is the body of the hammer's separate processes (run only by TestHammerRedis).
func TestHammerChild(t *testing.T) {
	addr := os.Getenv("TPU_HAMMER_ADDR")
	if addr == "" {
		t.Skip("run by TestHammerRedis")
	}
	ms, _ := strconv.ParseInt(os.Getenv("TPU_HAMMER_START_MS"), 10, 64)
	n, _ := strconv.Atoi(os.Getenv("TPU_HAMMER_N"))
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: n})
	defer c.Close()
	a, _ := NewRedis(c, RedisOptions{})
	c.Ping(context.Background()) // connect before the start line
	r := hammer(a, os.Getenv("TPU_HAMMER_POOL"), n, time.UnixMilli(ms), "proc"+os.Getenv("TPU_HAMMER_ID"))
	b, _ := json.Marshal(r)
	fmt.Printf("HAMMER %s\n", b)
}

// 50 goroutines here and 3 separate processes (10 goroutines each) race for the 2x2 sub-slices of one v6e
// 4x4 on one real Redis: exactly 4 succeed, everyone else gets ErrNoCapacity, and no chip is owned twice.
func TestHammerRedis(t *testing.T) {
	t.Parallel() // waits on its own redis-server and processes only; minute-long leases, no latency bound
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 50})
	t.Cleanup(func() { c.Close() })
	a, err := NewRedis(c, RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pool := newPool()
	mustRegister(t, a, pool, "s", "v6e", "4x4", 4)
	start := time.Now().Add(1500 * time.Millisecond)
	var procs []*exec.Cmd
	outs := make([]*safeBuf, 3)
	for i := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestHammerChild$", "-test.count", "1")
		cmd.Env = append(os.Environ(), "TPU_HAMMER_ADDR="+srv.Addr, "TPU_HAMMER_POOL="+pool, "TPU_HAMMER_N=10",
			"TPU_HAMMER_START_MS="+strconv.FormatInt(start.UnixMilli(), 10), "TPU_HAMMER_ID="+strconv.Itoa(i))
		outs[i] = &safeBuf{}
		cmd.Stdout, cmd.Stderr = outs[i], outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, cmd)
	}
	c.Ping(context.Background())
	total := hammer(a, pool, 50, start, "local")
	for i, p := range procs {
		if err := p.Wait(); err != nil {
			t.Fatalf("process %d: %v\n%s", i, err, outs[i].String())
		}
		var r hammerResult
		var line string
		for _, l := range strings.Split(outs[i].String(), "\n") {
			if len(l) > 7 && l[:7] == "HAMMER " {
				line = l[7:]
			}
		}
		if json.Unmarshal([]byte(line), &r) != nil {
			t.Fatalf("process %d output:\n%s", i, outs[i].String())
		}
		total.Granted += r.Granted
		total.Refused += r.Refused
		total.Other += r.Other
	}
	if total.Granted != 4 || total.Refused != 76 || total.Other != 0 {
		t.Fatalf("granted %d, refused %d, other errors %d of 80", total.Granted, total.Refused, total.Other)
	}
	checkDisjoint(t, a, pool, "s", 4)
}

type safeBuf struct {
	mu sync.Mutex
	b  []byte
}

func (s *safeBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b = append(s.b, p...)
	return len(p), nil
}

func (s *safeBuf) String() string { s.mu.Lock(); defer s.mu.Unlock(); return string(s.b) }
