package kvstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/conformance"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

var prefixSeq atomic.Int64

// freshPrefix gives each subtest its own key space on a shared server.
func freshPrefix() string { return fmt.Sprintf("t%d", prefixSeq.Add(1)) }

func TestRedisIndexConformance(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	conformance.RunIndex(t, func(t *testing.T) kvstore.Index {
		idx, err := kvstore.NewRedisIndex(c, kvstore.RedisConfig{Prefix: freshPrefix()})
		if err != nil {
			t.Fatal(err)
		}
		return idx
	})
}

func TestRedisClusterIndexConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	c := cl.Client(t)
	conformance.RunIndex(t, func(t *testing.T) kvstore.Index {
		idx, err := kvstore.NewRedisIndex(c, kvstore.RedisConfig{Prefix: freshPrefix()})
		if err != nil {
			t.Fatal(err)
		}
		return idx
	})
	// The one-hash-slot claim: every key one model's requests touch maps to one slot, and models spread
	// over the masters.
	ctx := context.Background()
	idx, _ := kvstore.NewRedisIndex(c, kvstore.RedisConfig{})
	ks := kvstore.Hasher{}.Keys(make([]uint32, 16*64), 16, kvstore.ExtraKeys{})
	masters := map[string]bool{}
	for m := range 12 {
		model := fmt.Sprintf("org/model-%d", m)
		if err := idx.Add(ctx, model, "ep-a", kvstore.TierGPU, ks); err != nil {
			t.Fatal(err)
		}
		names := []string{"kvg:v1:{" + model + "}:e:ep-a", "kvg:v1:{" + model + "}:s:ep-a"}
		for _, k := range ks {
			names = append(names, idx.BlockKeyName(model, k))
		}
		var slot int64 = -1
		for _, n := range names {
			s, err := c.ClusterKeySlot(ctx, n).Result()
			if err != nil {
				t.Fatal(err)
			}
			if slot >= 0 && s != slot {
				t.Fatalf("model %s: key %s in slot %d, others in %d", model, n, s, slot)
			}
			slot = s
		}
		node, err := c.MasterForKey(ctx, names[0])
		if err != nil {
			t.Fatal(err)
		}
		masters[node.Options().Addr] = true
		// The block hashes really live on that master.
		n, err := node.Exists(ctx, names[2:]...).Result()
		if err != nil || n != int64(len(ks)) {
			t.Fatalf("model %s: %d of %d block keys on its master (%v)", model, n, len(ks), err)
		}
		got, err := idx.Match(ctx, model, ks)
		if err != nil || len(got) != 1 || got[0].GPUBlocks != 64 {
			t.Fatalf("model %s: match %+v, %v", model, got, err)
		}
	}
	if len(masters) < 2 {
		t.Fatalf("12 models all on one master: %v", masters)
	}
}

func TestRedisIndexSurvivesScriptFlush(t *testing.T) {
	// EVALSHA falls back to EVAL on NOSCRIPT (after a Redis restart or SCRIPT FLUSH).
	ctx := context.Background()
	srv := redistest.Start(t)
	c := srv.Client(t)
	idx, _ := kvstore.NewRedisIndex(c, kvstore.RedisConfig{})
	ks := kvstore.Hasher{}.Keys(make([]uint32, 64), 16, kvstore.ExtraKeys{})
	if err := idx.Add(ctx, "m", "a", kvstore.TierGPU, ks); err != nil {
		t.Fatal(err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := idx.Match(ctx, "m", ks)
	if err != nil || len(got) != 1 || got[0].GPUBlocks != 4 {
		t.Fatalf("after SCRIPT FLUSH: %+v, %v", got, err)
	}
	srv.Restart()
	if got, err := idx.Match(ctx, "m", ks); err != nil || len(got) != 0 {
		t.Fatalf("after restart: %+v, %v", got, err)
	}
	if err := idx.Add(ctx, "m", "a", kvstore.TierGPU, ks); err != nil {
		t.Fatal(err)
	}
}

func TestRedisPrefixValidation(t *testing.T) {
	if _, err := kvstore.NewRedisIndex(redis.NewClient(&redis.Options{}), kvstore.RedisConfig{Prefix: "a{b"}); err == nil {
		t.Fatal("brace in prefix accepted")
	}
}
