package kvstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/conformance"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// TestRedisCluster runs the index, reservations and blob/lease suites on one 3-master Redis Cluster, and
// checks the one-hash-slot claim.
func TestRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	t.Run("Index", func(t *testing.T) { clusterIndex(t, cl) })
	t.Run("Reservations", func(t *testing.T) {
		conformance.RunReservations(t, func(t *testing.T) kvstore.Reservations {
			r, err := kvstore.NewRedisReservations(cl.Client(t), kvstore.RedisConfig{Prefix: freshPrefix()})
			if err != nil {
				t.Fatal(err)
			}
			return r
		})
	})
	t.Run("GuardedIndex", func(t *testing.T) {
		conformance.RunIndex(t, func(t *testing.T) kvstore.Index {
			g, _ := redisGuard(t, cl.Addrs[0], true, freshPrefix(), conformanceGuard)
			return g
		})
	})
	t.Run("GuardedReservations", func(t *testing.T) {
		conformance.RunReservations(t, func(t *testing.T) kvstore.Reservations {
			g, _ := redisGuard(t, cl.Addrs[0], true, freshPrefix(), conformanceGuard)
			return g
		})
	})
	t.Run("GuardedHammerThreeGateways", func(t *testing.T) {
		prefix := freshPrefix()
		var handles []kvstore.Reservations
		for range 3 {
			g, _ := redisGuard(t, cl.Addrs[0], true, prefix, conformanceGuard)
			handles = append(handles, g)
		}
		conformance.HammerReservations(t, handles)
	})
	t.Run("Store", func(t *testing.T) {
		conformance.RunBlobsAndLeases(t, func(t *testing.T) *kvstore.Store {
			s, err := kvstore.OpenStore(context.Background(), kvstore.StoreConfig{Kind: "redis", Cluster: true, Addrs: cl.Addrs[:1], Prefix: freshPrefix()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		})
	})
}

func clusterIndex(t *testing.T, cl *redistest.Cluster) {
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
