package kvstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

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
	for _, l := range indexLayouts {
		t.Run(l.name, func(t *testing.T) {
			conformance.RunIndex(t, func(t *testing.T) kvstore.Index {
				idx, err := kvstore.NewRedisIndex(c, kvstore.RedisConfig{Prefix: freshPrefix(), IndexLayout: l.layout})
				if err != nil {
					t.Fatal(err)
				}
				return idx
			})
		})
	}
	t.Run("Layout2Spread", func(t *testing.T) { clusterSpread(t, cl) })
	// The one-hash-slot claim: every key one model's requests touch maps to one slot, and models spread
	// over the masters.
	ctx := context.Background()
	idx, _ := kvstore.NewRedisIndex(c, kvstore.RedisConfig{IndexLayout: 1})
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

// clusterSpread: layout 2 on a real 3-master Cluster with one model and 240 distinct system prompts (each
// chain ingested with its family, as the ingester passes it, then matched once as a hit and once as a
// miss of a sibling): every request's reads stay in its family's slot, and the work spreads over the
// masters — INFO commandstats per master, after CONFIG RESETSTAT, counts the HSETs and HMGETs each served.
func clusterSpread(t *testing.T, cl *redistest.Cluster) {
	ctx := context.Background()
	c := cl.Client(t)
	idx, err := kvstore.NewRedisIndex(c, kvstore.RedisConfig{Prefix: freshPrefix(), IndexLayout: 2})
	if err != nil {
		t.Fatal(err)
	}
	const prompts, blocks = 240, 32
	chains := make([][]kvstore.BlockKey, prompts)
	for i := range chains {
		toks := make([]uint32, blocks*16)
		for j := range toks {
			toks[j] = uint32(i*100_000 + j)
		}
		chains[i] = kvstore.Hasher{Seed: 5}.Keys(toks, 16, kvstore.ExtraKeys{})
	}
	// Every prompt's keys map to one slot.
	for _, ks := range chains[:8] {
		slot := int64(-1)
		for _, ep := range []kvstore.EndpointID{"ep-a", "ep-b"} {
			s, err := c.ClusterKeySlot(ctx, idx.FamilyHashName("m", kvstore.FamilyOf(ks[0]), ep)).Result()
			if err != nil {
				t.Fatal(err)
			}
			if slot >= 0 && s != slot {
				t.Fatalf("one prompt's family HASHes in slots %d and %d", slot, s)
			}
			slot = s
		}
	}
	if err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return m.ConfigResetStat(ctx).Err() }); err != nil {
		t.Fatal(err)
	}
	for i, ks := range chains {
		fams := make([]kvstore.Family, len(ks))
		for j := range fams {
			fams[j] = kvstore.FamilyOf(ks[0])
		}
		ep := kvstore.EndpointID([]string{"ep-a", "ep-b"}[i%2])
		if err := idx.Apply(ctx, "m", []kvstore.Update{{Endpoint: ep, Tier: kvstore.TierGPU, Keys: ks, Families: fams}}); err != nil {
			t.Fatal(err)
		}
	}
	for i, ks := range chains {
		got, err := idx.Match(ctx, "m", ks)
		if err != nil || len(got) != 1 || got[0].GPUBlocks != blocks || string(got[0].Endpoint) != []string{"ep-a", "ep-b"}[i%2] {
			t.Fatalf("prompt %d: match %+v, %v", i, got, err)
		}
	}
	var mu sync.Mutex
	per := map[string]int64{}
	var total int64
	err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		info, err := m.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		var n int64
		for _, line := range strings.Split(info, "\n") {
			for _, cmd := range []string{"cmdstat_hset:", "cmdstat_hmget:"} {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
					calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
					x, _ := strconv.ParseInt(calls, 10, 64)
					n += x
				}
			}
		}
		mu.Lock()
		per[m.Options().Addr] = n
		total += n
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("HSET+HMGET calls per master for %d prompts: %v", prompts, per)
	if len(per) != 3 {
		t.Fatalf("%d masters answered", len(per))
	}
	for addr, n := range per {
		if n*5 < total { // an even spread is a third each; every master must carry at least a fifth
			t.Errorf("master %s served %d of %d index calls", addr, n, total)
		}
	}
}
