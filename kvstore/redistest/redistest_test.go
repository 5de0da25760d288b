package redistest_test

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/kvstore/redistest"
)

func TestStartAndRestart(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v := c.Get(ctx, "k").Val(); v != "v" {
		t.Fatalf("get = %q", v)
	}
	addr := s.Addr
	s.Restart()
	if s.Addr != addr {
		t.Fatalf("address changed: %s -> %s", addr, s.Addr)
	}
	// Persistence is off: the restarted server is empty, and the client reconnects by itself.
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("after restart: exists = %d, %v", n, err)
	}
}

func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster start takes a few seconds")
	}
	ctx := context.Background()
	cl := redistest.StartCluster(t, 3)
	c := cl.Client(t)
	// Keys spread over the masters: 3 keys in 3 different slot ranges land on 3 different nodes.
	owners := map[string]bool{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		if err := c.Set(ctx, k, "1", 0).Err(); err != nil {
			t.Fatal(err)
		}
		n, err := c.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		owners[n.Options().Addr] = true
	}
	if len(owners) < 2 {
		t.Fatalf("8 keys all on one master: %v", owners)
	}
}
