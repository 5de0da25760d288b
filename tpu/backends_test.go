package tpu

import (
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore/redistest"
)

// fakeClock is the memory backend's clock in tests.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func memoryBackend(t *testing.T) (*Allocator, func(time.Duration)) {
	c := &fakeClock{t: time.Unix(1_780_000_000, 0)}
	return NewMemory(c.now), c.advance
}

func TestConformanceMemory(t *testing.T) {
	t.Parallel() // a fake clock: no real TTL runs out under load
	runConformance(t, memoryBackend)
}

func TestConformanceRedis(t *testing.T) {
	srv := redistest.Start(t)
	runConformance(t, func(t *testing.T) (*Allocator, func(time.Duration)) {
		a, err := NewRedis(srv.Client(t), RedisOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return a, time.Sleep
	})
}

func TestConformanceRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	runConformance(t, func(t *testing.T) (*Allocator, func(time.Duration)) {
		a, err := NewRedis(cl.Client(t), RedisOptions{Prefix: "tpucl"})
		if err != nil {
			t.Fatal(err)
		}
		return a, time.Sleep
	})
}
