package kvstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/conformance"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

var prefixSeq atomic.Int64

// freshPrefix gives each subtest its own key space on a shared server.
func freshPrefix() string { return fmt.Sprintf("t%d", prefixSeq.Add(1)) }

// indexLayouts are the RedisConfig.IndexLayout values the suites run with: layout 1 (what older releases
// run), layout 2, and 0 with no marker in the store (the upgrade window: layout 1 read, both written).
var indexLayouts = []struct {
	name   string
	layout int
}{{"Layout1", 1}, {"Layout2", 2}, {"UpgradeWindow", 0}}

func TestRedisIndexConformance(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
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

// TestApplyMatchesOneByOne applies the same updates with Apply and one by one, on both backends, and
// compares the matches; it also checks Apply survives SCRIPT FLUSH on Redis.
func TestApplyMatchesOneByOne(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	c := srv.Client(t)
	ks := kvstore.Hasher{}.Keys(make([]uint32, 16*40), 16, kvstore.ExtraKeys{})
	updates := []kvstore.Update{
		{Endpoint: "a", Tier: kvstore.TierGPU, Keys: ks[:30]},
		{Endpoint: "b", Tier: kvstore.TierCPU, Keys: ks[:20]},
		{Endpoint: "a", Tier: kvstore.TierGPU, Remove: true, Keys: ks[10:11]},
		{Endpoint: "a", Tier: kvstore.TierCPU, Keys: ks[10:15]},
		{Endpoint: "c", Tier: kvstore.TierGPU},
		{Endpoint: "b", Tier: kvstore.TierGPU, Keys: ks[:5]},
	}
	want := map[kvstore.EndpointID][2]int{"a": {29, 1}, "b": {5, 15}}
	check := func(name string, idx kvstore.Index) {
		t.Helper()
		got, err := idx.Match(ctx, "m", ks)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %+v", name, got)
		}
		for _, m := range got {
			if w := want[m.Endpoint]; w != [2]int{m.GPUBlocks, m.CPUBlocks} {
				t.Fatalf("%s: %+v, want %v", name, m, w)
			}
		}
	}
	mem := kvstore.NewMemoryIndex(kvstore.MemoryConfig{})
	if err := mem.Apply(ctx, "m", updates); err != nil {
		t.Fatal(err)
	}
	check("memory", mem)
	one, _ := kvstore.NewRedisIndex(c, kvstore.RedisConfig{Prefix: freshPrefix()})
	for _, u := range updates {
		var err error
		if u.Remove {
			err = one.Remove(ctx, "m", u.Endpoint, u.Tier, u.Keys)
		} else {
			err = one.Add(ctx, "m", u.Endpoint, u.Tier, u.Keys)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	check("redis one by one", one)
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	batch, _ := kvstore.NewRedisIndex(c, kvstore.RedisConfig{Prefix: freshPrefix()})
	if err := batch.Apply(ctx, "m", updates); err != nil {
		t.Fatal(err)
	}
	check("redis apply", batch)
	bad := append(slices.Clone(updates), kvstore.Update{Endpoint: "d", Tier: 9, Keys: ks[:1]})
	if err := batch.Apply(ctx, "m", bad); !errors.Is(err, kvstore.ErrInvalidTier) {
		t.Fatalf("bad tier: %v", err)
	}
}

// The Redis index's per-endpoint bound (RedisConfig.MaxEntriesPerEndpoint) on a real redis-server, and
// that it leaves the reverse SET at the bound (the script pops what it drops).
func TestRedisIndexEndpointCapConformance(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	for _, l := range indexLayouts {
		t.Run(l.name, func(t *testing.T) {
			conformance.RunEndpointCap(t, func(t *testing.T, perEndpoint int) kvstore.Index {
				p := freshPrefix()
				idx, err := kvstore.NewRedisIndex(c, kvstore.RedisConfig{Prefix: p, MaxEntriesPerEndpoint: perEndpoint, IndexLayout: l.layout})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					if l.layout == 2 {
						if n := c.Get(context.Background(), p+":v2:{m}:n:small").Val(); n != "10" {
							t.Errorf("small endpoint's count is %q, want 10", n)
						}
						return
					}
					if n := c.SCard(context.Background(), p+":"+kvstore.LayoutVersion+":{m}:e:small").Val(); n != 10 {
						t.Errorf("small endpoint's reverse SET has %d members, want 10", n)
					}
				})
				return idx
			})
		})
	}
}

// TestRedisLayout2SurvivesScriptFlush: layout 2's scripts (long records, demotion, clear of confirmed
// entries) are loaded again after a SCRIPT FLUSH; its ingestion writes use none.
func TestRedisLayout2SurvivesScriptFlush(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	c := srv.Client(t)
	idx, err := kvstore.NewRedisIndex(c, kvstore.RedisConfig{Prefix: freshPrefix(), IndexLayout: 2})
	if err != nil {
		t.Fatal(err)
	}
	ks := kvstore.Hasher{}.Keys(make([]uint32, 64), 16, kvstore.ExtraKeys{})
	fams := []kvstore.Family{kvstore.FamilyOf(ks[0]), kvstore.FamilyOf(ks[0]), kvstore.FamilyOf(ks[0]), kvstore.FamilyOf(ks[0])}
	if err := idx.Apply(ctx, "m", []kvstore.Update{{Endpoint: "a", Tier: kvstore.TierCPU, Keys: ks, Families: fams}}); err != nil {
		t.Fatal(err)
	}
	flushThen := func(what string, f func() error) {
		t.Helper()
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := f(); err != nil {
			t.Fatalf("%s after SCRIPT FLUSH: %v", what, err)
		}
	}
	flushThen("record", func() error { return idx.Record(ctx, "m", "b", ks[:2], time.Minute) })
	flushThen("demote", func() error { return idx.Demote(ctx, "m", "a", kvstore.ClearKeepsHoldsWithin/2) }) // kept by the clear
	flushThen("clear confirmed", func() error { return idx.ClearConfirmed(ctx, "m", "a") })
	got, err := idx.Match(ctx, "m", ks)
	slices.SortFunc(got, func(x, y kvstore.EndpointMatch) int { return strings.Compare(string(x.Endpoint), string(y.Endpoint)) })
	want := []kvstore.EndpointMatch{{Endpoint: "a", GPUBlocks: 4}, {Endpoint: "b", GPUBlocks: 2}}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("match %+v, %v; want %+v (a demoted, b recorded)", got, err, want)
	}
}

// TestLayout2MatchOneRoundFollowsHolds: layout 2's Match reads a holder it remembers from its last Match of
// the same block 0 in one round trip, tier fields only while the HASH had no holds. Two gateways' indexes
// on one real Redis: what is ingested, recorded (a long record: hold fields in Redis) or cleared through A
// is what B's remembering Match finds, each step checked right after B's previous Match of the prompt.
func TestLayout2MatchOneRoundFollowsHolds(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	pfx := freshPrefix()
	open := func() *kvstore.RedisIndex {
		idx, err := kvstore.NewRedisIndex(srv.Client(t), kvstore.RedisConfig{Prefix: pfx, IndexLayout: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = idx.Close() })
		return idx
	}
	a, b := open(), open()
	ks := kvstore.Hasher{}.Keys(make([]uint32, 16*8), 16, kvstore.ExtraKeys{})
	fams := make([]kvstore.Family, len(ks))
	for i := range fams {
		fams[i] = kvstore.FamilyOf(ks[0])
	}
	match := func(what string, want ...kvstore.EndpointMatch) {
		t.Helper()
		for round := range 2 { // B's first Match of each state may come from its memo, the second does
			got, err := b.Match(ctx, "m", ks)
			if err != nil || !sameMatches(got, want) {
				t.Fatalf("%s (match %d through B): %+v, %v; want %+v", what, round, got, err, want)
			}
		}
	}
	if err := a.Apply(ctx, "m", []kvstore.Update{{Endpoint: "e0", Tier: kvstore.TierGPU, Keys: ks[:4], Families: fams[:4]}}); err != nil {
		t.Fatal(err)
	}
	match("4 blocks ingested", kvstore.EndpointMatch{Endpoint: "e0", GPUBlocks: 4})
	if err := a.Apply(ctx, "m", []kvstore.Update{{Endpoint: "e0", Tier: kvstore.TierCPU, Keys: ks[4:6], Families: fams[4:6]}}); err != nil {
		t.Fatal(err)
	}
	match("2 more on CPU", kvstore.EndpointMatch{Endpoint: "e0", GPUBlocks: 4, CPUBlocks: 2})
	// A long record (above SharedRecordMaxTTL) writes hold fields into e0's HASH: B's memo said no holds.
	if err := a.Record(ctx, "m", "e0", ks, time.Minute+kvstore.DefaultSharedRecordMaxTTL); err != nil {
		t.Fatal(err)
	}
	match("all 8 recorded", kvstore.EndpointMatch{Endpoint: "e0", GPUBlocks: 8})
	if err := a.Apply(ctx, "m", []kvstore.Update{{Endpoint: "e0", Tier: kvstore.TierGPU, Remove: true, Keys: ks[:4], Families: fams[:4]}}); err != nil {
		t.Fatal(err)
	}
	match("confirmed GPU removed, holds stay", kvstore.EndpointMatch{Endpoint: "e0", GPUBlocks: 8})
	if err := a.ClearEndpoint(ctx, "m", "e0"); err != nil {
		t.Fatal(err)
	}
	match("cleared")
	if err := a.Apply(ctx, "m", []kvstore.Update{{Endpoint: "e0", Tier: kvstore.TierGPU, Keys: ks[:3], Families: fams[:3]}}); err != nil {
		t.Fatal(err)
	}
	match("3 blocks ingested again", kvstore.EndpointMatch{Endpoint: "e0", GPUBlocks: 3})
}
