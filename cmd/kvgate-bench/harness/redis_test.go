package harness

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/kvstore/testenv"
)

// StartRedis runs redistest's command line in a Proc: it answers PING, reports CPU time, and Stop ends it.
func TestStartRedis(t *testing.T) {
	t.Parallel()
	testenv.Command(t, "redis-server")
	rd, err := StartRedis(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: rd.Addr})
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := rd.CPUTime(); err != nil {
		t.Fatal(err)
	}
	rd.Stop(5 * time.Second)
	if done, _ := rd.Exited(); !done {
		t.Fatal("redis-server still running after Stop")
	}
}
