// Package conformance is the one behaviour suite every kvstore backend must pass: RunIndex for
// kvstore.Index, RunReservations for kvstore.Reservations. The memory and Redis backends run the same
// functions (kvstore's own tests), so both return identical matches for the same data. Other packages may
// run it against their own wrappers (for example a metrics decorator).
package conformance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore"
)

// IndexFactory returns a new, empty index for one subtest. Fresh stores (or fresh key prefixes) per call
// keep subtests independent.
type IndexFactory func(t *testing.T) kvstore.Index

// keys returns n distinct block keys for a test chain (derived from the real Hasher, so they look like
// production keys), each carrying its chain's kvstore.Family in its own top kvstore.FamilyBits bits. The
// suite's writes pass no Update.Families, so a key is its own family's witness (kvstore.FamilyOf(key)) and
// these keys keep a chain in one family, as ingestion's Families do for real chains.
func keys(seed uint64, n int) []kvstore.BlockKey {
	toks := make([]uint32, n*4)
	for i := range toks {
		toks[i] = uint32(i)
	}
	ks := kvstore.Hasher{Seed: seed}.Keys(toks, 4, kvstore.ExtraKeys{})
	const low = ^kvstore.BlockKey(0) >> kvstore.FamilyBits
	for i := range ks {
		ks[i] = ks[i]&low | ks[0]&^low
	}
	return ks
}

func sorted(ms []kvstore.EndpointMatch) []kvstore.EndpointMatch {
	out := slices.Clone(ms)
	slices.SortFunc(out, func(a, b kvstore.EndpointMatch) int { return cmp.Compare(a.Endpoint, b.Endpoint) })
	return out
}

func expectMatch(t *testing.T, idx kvstore.Index, model string, ks []kvstore.BlockKey, want ...kvstore.EndpointMatch) {
	t.Helper()
	got, err := idx.Match(context.Background(), model, ks)
	if err != nil {
		t.Fatalf("match: %v", err)
	}
	g, w := sorted(got), sorted(want)
	if len(g) != len(w) || (len(w) > 0 && !slices.Equal(g, w)) {
		t.Fatalf("match = %+v, want %+v", g, w)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func em(ep string, gpu, cpu int) kvstore.EndpointMatch {
	return kvstore.EndpointMatch{Endpoint: kvstore.EndpointID(ep), GPUBlocks: gpu, CPUBlocks: cpu}
}

// RunIndex runs the index conformance suite against indexes made by newIndex.
func RunIndex(t *testing.T, newIndex IndexFactory) {
	ctx := context.Background()
	gpu, cpu := kvstore.TierGPU, kvstore.TierCPU
	k := keys(1, 300)

	t.Run("EmptyKeys", func(t *testing.T) {
		idx := newIndex(t)
		must(t, idx.Add(ctx, "m", "a", gpu, k[:3]))
		expectMatch(t, idx, "m", nil)
		expectMatch(t, idx, "m", []kvstore.BlockKey{})
		must(t, idx.Add(ctx, "m", "a", gpu, nil))
		must(t, idx.Remove(ctx, "m", "a", gpu, nil))
		must(t, idx.Record(ctx, "m", "a", nil, time.Second))
	})
	t.Run("UnknownModelAndKeys", func(t *testing.T) {
		idx := newIndex(t)
		expectMatch(t, idx, "nobody", k[:5])
		must(t, idx.Add(ctx, "m", "a", gpu, k[:5]))
		expectMatch(t, idx, "other", k[:5])
		expectMatch(t, idx, "m", keys(2, 5))
	})
	t.Run("LongestRunFromBlockZero", func(t *testing.T) {
		idx := newIndex(t)
		must(t, idx.Add(ctx, "m", "a", gpu, k[:10]))
		must(t, idx.Add(ctx, "m", "b", gpu, k[:5]))
		must(t, idx.Add(ctx, "m", "c", gpu, k[1:10])) // no block 0: omitted
		expectMatch(t, idx, "m", k[:12], em("a", 10, 0), em("b", 5, 0))
		expectMatch(t, idx, "m", k[:3], em("a", 3, 0), em("b", 3, 0))
		expectMatch(t, idx, "m", k[:1], em("a", 1, 0), em("b", 1, 0))
	})
	t.Run("GapInMiddle", func(t *testing.T) {
		idx := newIndex(t)
		must(t, idx.Add(ctx, "m", "a", gpu, k[:3]))
		must(t, idx.Add(ctx, "m", "a", gpu, k[4:8]))
		must(t, idx.Add(ctx, "m", "b", gpu, k[:8]))
		expectMatch(t, idx, "m", k[:8], em("a", 3, 0), em("b", 8, 0))
		// A block nobody holds stops every run, though later blocks are held.
		must(t, idx.Remove(ctx, "m", "b", gpu, k[3:4]))
		expectMatch(t, idx, "m", k[:8], em("a", 3, 0), em("b", 3, 0))
	})
	t.Run("Tiers", func(t *testing.T) {
		idx := newIndex(t)
		must(t, idx.Add(ctx, "m", "a", gpu, k[:4]))
		must(t, idx.Add(ctx, "m", "a", cpu, k[2:8]))
		expectMatch(t, idx, "m", k[:10], em("a", 4, 4))
		// Both tiers count as GPU; removing GPU leaves CPU.
		must(t, idx.Remove(ctx, "m", "a", gpu, k[2:3]))
		expectMatch(t, idx, "m", k[:10], em("a", 3, 5))
		must(t, idx.Remove(ctx, "m", "a", cpu, k[2:3]))
		expectMatch(t, idx, "m", k[:10], em("a", 2, 0))
		// CPU-only from block 0.
		must(t, idx.Add(ctx, "m", "b", cpu, k[:6]))
		expectMatch(t, idx, "m", k[:10], em("a", 2, 0), em("b", 0, 6))
	})
	t.Run("AddIsIdempotent", func(t *testing.T) {
		idx := newIndex(t)
		must(t, idx.Add(ctx, "m", "a", gpu, k[:4]))
		must(t, idx.Add(ctx, "m", "a", gpu, k[:4]))
		must(t, idx.Remove(ctx, "m", "a", gpu, k[3:4]))
		expectMatch(t, idx, "m", k[:4], em("a", 3, 0))
	})
	t.Run("RemoveUnknown", func(t *testing.T) {
		idx := newIndex(t)
		must(t, idx.Remove(ctx, "m", "a", gpu, k[:4])) // nothing stored at all
		must(t, idx.Add(ctx, "m", "a", gpu, k[:4]))
		must(t, idx.Remove(ctx, "m", "a", gpu, keys(9, 4))) // unknown keys
		must(t, idx.Remove(ctx, "m", "zz", gpu, k[:4]))     // unknown endpoint
		must(t, idx.Remove(ctx, "other", "a", gpu, k[:4]))  // unknown model
		must(t, idx.Remove(ctx, "m", "a", cpu, k[:4]))      // tier not held
		expectMatch(t, idx, "m", k[:4], em("a", 4, 0))
	})
	t.Run("ClearEndpoint", func(t *testing.T) {
		idx := newIndex(t)
		must(t, idx.Add(ctx, "m", "a", gpu, k[:6]))
		must(t, idx.Add(ctx, "m", "a", cpu, k[:9]))
		must(t, idx.Record(ctx, "m", "a", k[:12], time.Minute))
		must(t, idx.Add(ctx, "m", "b", gpu, k[:5]))
		must(t, idx.Add(ctx, "m2", "a2", gpu, k[:5]))
		must(t, idx.ClearEndpoint(ctx, "m", "a"))
		expectMatch(t, idx, "m", k[:12], em("b", 5, 0))
		expectMatch(t, idx, "m2", k[:12], em("a2", 5, 0))
		must(t, idx.ClearEndpoint(ctx, "m", "a"))   // twice
		must(t, idx.ClearEndpoint(ctx, "m", "zzz")) // unknown
		must(t, idx.ClearEndpoint(ctx, "zzz", "a")) // unknown model
		// Entries added after a clear are live again.
		must(t, idx.Add(ctx, "m", "a", gpu, k[:2]))
		expectMatch(t, idx, "m", k[:12], em("a", 2, 0), em("b", 5, 0))
	})
	t.Run("ClearConfirmedKeepsSpeculative", func(t *testing.T) {
		idx := newIndex(t)
		short := kvstore.ClearKeepsHoldsWithin - 5*time.Second // a hold ClearConfirmed keeps
		must(t, idx.Add(ctx, "m", "a", gpu, k[:6]))
		must(t, idx.Add(ctx, "m", "a", cpu, k[:9]))
		must(t, idx.Record(ctx, "m", "a", k[:3], short)) // on top of confirmed blocks
		must(t, idx.Add(ctx, "m", "b", gpu, k[:5]))
		must(t, idx.Record(ctx, "m", "c", k[:4], short)) // speculative, then confirmed beyond it
		must(t, idx.Add(ctx, "m", "c", gpu, k[:8]))
		must(t, idx.Add(ctx, "m2", "a", gpu, k[:5]))
		expectMatch(t, idx, "m", k[:12], em("a", 6, 3), em("b", 5, 0), em("c", 8, 0))
		must(t, idx.ClearConfirmed(ctx, "m", "a"))
		must(t, idx.ClearConfirmed(ctx, "m", "c"))
		expectMatch(t, idx, "m", k[:12], em("a", 3, 0), em("b", 5, 0), em("c", 4, 0))
		expectMatch(t, idx, "m2", k[:12], em("a", 5, 0))
		must(t, idx.ClearConfirmed(ctx, "m", "a"))   // twice
		must(t, idx.ClearConfirmed(ctx, "m", "zzz")) // unknown
		must(t, idx.ClearConfirmed(ctx, "zzz", "a")) // unknown model
		// New confirmed entries on top of the kept speculative ones, cleared again.
		must(t, idx.Add(ctx, "m", "a", cpu, k[:6]))
		expectMatch(t, idx, "m", k[:12], em("a", 3, 3), em("b", 5, 0), em("c", 4, 0))
		must(t, idx.ClearConfirmed(ctx, "m", "a"))
		expectMatch(t, idx, "m", k[:12], em("a", 3, 0), em("b", 5, 0), em("c", 4, 0))
		// ClearEndpoint still finds the kept speculative entries.
		must(t, idx.ClearEndpoint(ctx, "m", "a"))
		must(t, idx.ClearEndpoint(ctx, "m", "c"))
		expectMatch(t, idx, "m", k[:12], em("b", 5, 0))
		must(t, idx.Add(ctx, "m", "a", gpu, k[:2]))
		expectMatch(t, idx, "m", k[:12], em("a", 2, 0), em("b", 5, 0))
		// An expired speculative hold is not kept.
		must(t, idx.Record(ctx, "m", "d", k[:2], 200*time.Millisecond))
		must(t, idx.Add(ctx, "m", "d", cpu, k[:7]))
		time.Sleep(350 * time.Millisecond)
		expectMatch(t, idx, "m", k[:12], em("a", 2, 0), em("b", 5, 0), em("d", 0, 7))
		must(t, idx.ClearConfirmed(ctx, "m", "d"))
		expectMatch(t, idx, "m", k[:12], em("a", 2, 0), em("b", 5, 0))
		must(t, idx.Record(ctx, "m", "d", k[:1], short))
		expectMatch(t, idx, "m", k[:12], em("a", 2, 0), em("b", 5, 0), em("d", 1, 0))
	})
	// A hold lasting longer than kvstore.ClearKeepsHoldsWithin (a routed hit's refresh, 5 min) stands for
	// what the engine held, so the engine's clear drops it, confirmed blocks under it or not; short holds of
	// the same endpoint stay.
	t.Run("ClearConfirmedDropsLongHolds", func(t *testing.T) {
		idx := newIndex(t)
		long := kvstore.ClearKeepsHoldsWithin + time.Minute
		must(t, idx.Add(ctx, "m", "a", gpu, k[:6]))
		must(t, idx.Record(ctx, "m", "a", k[:4], long))  // a refresh of confirmed blocks
		must(t, idx.Record(ctx, "m", "a", k[6:8], long)) // a long hold of blocks never confirmed
		must(t, idx.Record(ctx, "m", "a", k[8:10], 10*time.Second))
		must(t, idx.Record(ctx, "m", "b", k[:3], long)) // another endpoint is untouched
		expectMatch(t, idx, "m", k[:12], em("a", 10, 0), em("b", 3, 0))
		must(t, idx.ClearConfirmed(ctx, "m", "a"))
		expectMatch(t, idx, "m", k[:12], em("b", 3, 0))
		expectMatch(t, idx, "m", k[6:12])                // k[6:8] gone: nothing from k[6]
		expectMatch(t, idx, "m", k[8:12], em("a", 2, 0)) // the short hold stays
		// Recorded again after the clear, a long hold counts again.
		must(t, idx.Record(ctx, "m", "a", k[:2], long))
		expectMatch(t, idx, "m", k[:12], em("a", 2, 0), em("b", 3, 0))
	})
	t.Run("Speculative", func(t *testing.T) {
		idx := newIndex(t)
		must(t, idx.Add(ctx, "m", "a", cpu, k[:4]))
		must(t, idx.Record(ctx, "m", "a", k[:2], 200*time.Millisecond)) // on top of CPU: counts GPU
		must(t, idx.Record(ctx, "m", "b", k[:6], 200*time.Millisecond)) // speculative only
		must(t, idx.Record(ctx, "m", "c", k[:3], 30*time.Second))       // outlives the test
		must(t, idx.Add(ctx, "m", "b", gpu, k[:1]))                     // confirmed block 0
		expectMatch(t, idx, "m", k[:8], em("a", 2, 2), em("b", 6, 0), em("c", 3, 0))
		time.Sleep(450 * time.Millisecond)
		expectMatch(t, idx, "m", k[:8], em("a", 0, 4), em("b", 1, 0), em("c", 3, 0))
		// A re-record extends; remove of a tier leaves the speculative hold.
		must(t, idx.Record(ctx, "m", "b", k[:2], 30*time.Second))
		must(t, idx.Remove(ctx, "m", "b", gpu, k[:1]))
		expectMatch(t, idx, "m", k[:8], em("a", 0, 4), em("b", 2, 0), em("c", 3, 0))
		// Writes after expiry (which sweep lazily) keep the result.
		must(t, idx.Add(ctx, "m", "d", gpu, k[:8]))
		expectMatch(t, idx, "m", k[:8], em("a", 0, 4), em("b", 2, 0), em("c", 3, 0), em("d", 8, 0))
	})
	t.Run("Demote", func(t *testing.T) {
		idx := newIndex(t)
		d, ok := idx.(kvstore.Demoter)
		if !ok {
			t.Skip("index is not a kvstore.Demoter")
		}
		must(t, idx.Add(ctx, "m", "a", gpu, k[:6]))
		must(t, idx.Add(ctx, "m", "a", cpu, k[6:8]))
		must(t, idx.Record(ctx, "m", "a", k[8:10], 30*time.Second)) // a live speculative hold stays as it is
		must(t, idx.Add(ctx, "m", "b", gpu, k[:3]))                 // another endpoint is untouched
		must(t, d.Demote(ctx, "m", "a", 400*time.Millisecond))
		// Unconfirmed holds count as GPU, like speculative ones.
		expectMatch(t, idx, "m", k[:12], em("a", 10, 0), em("b", 3, 0))
		// An Add confirms a block again; Demote of nothing confirmed, of an unknown endpoint or model, is a no-op.
		must(t, idx.Add(ctx, "m", "a", gpu, k[:2]))
		must(t, d.Demote(ctx, "m", "zz", time.Second))
		must(t, d.Demote(ctx, "other", "a", time.Second))
		if err := d.Demote(ctx, "m", "a", 0); !errors.Is(err, kvstore.ErrInvalidArgument) {
			t.Fatalf("Demote ttl 0: %v", err)
		}
		time.Sleep(650 * time.Millisecond)
		// The unconfirmed ones aged out; the re-confirmed blocks and the longer speculative hold did not.
		expectMatch(t, idx, "m", k[:12], em("a", 2, 0), em("b", 3, 0))
		expectMatch(t, idx, "m", k[8:12], em("a", 2, 0))
		// ClearEndpoint still finds everything; ClearConfirmed after Demote keeps the unconfirmed holds that
		// end within kvstore.ClearKeepsHoldsWithin and drops longer ones.
		must(t, idx.Add(ctx, "m", "c", gpu, k[:4]))
		must(t, d.Demote(ctx, "m", "c", 10*time.Second))
		must(t, idx.ClearConfirmed(ctx, "m", "c"))
		expectMatch(t, idx, "m", k[:4], em("a", 2, 0), em("b", 3, 0), em("c", 4, 0))
		must(t, idx.Add(ctx, "m", "e", gpu, k[:4]))
		must(t, d.Demote(ctx, "m", "e", kvstore.ClearKeepsHoldsWithin+time.Minute))
		expectMatch(t, idx, "m", k[:4], em("a", 2, 0), em("b", 3, 0), em("c", 4, 0), em("e", 4, 0))
		must(t, idx.ClearConfirmed(ctx, "m", "e"))
		expectMatch(t, idx, "m", k[:4], em("a", 2, 0), em("b", 3, 0), em("c", 4, 0))
		must(t, idx.ClearEndpoint(ctx, "m", "c"))
		must(t, idx.ClearEndpoint(ctx, "m", "a"))
		expectMatch(t, idx, "m", k[:12], em("b", 3, 0))
		expectMatch(t, idx, "m", k[8:12])
	})
	t.Run("Apply", func(t *testing.T) {
		idx := newIndex(t)
		// In order, as Add and Remove one by one: a block added, removed and added again in one call is held.
		must(t, idx.Apply(ctx, "m", []kvstore.Update{
			{Endpoint: "a", Tier: gpu, Keys: k[:6]},
			{Endpoint: "a", Tier: cpu, Keys: k[4:8]},
			{Endpoint: "a", Tier: gpu, Remove: true, Keys: k[2:6]},
			{Endpoint: "b", Tier: gpu, Keys: k[:3]},
			{Endpoint: "a", Tier: gpu, Keys: k[2:3]},
			{Endpoint: "b", Tier: gpu, Keys: nil},
		}))
		expectMatch(t, idx, "m", k[:10], em("a", 3, 0), em("b", 3, 0))
		expectMatch(t, idx, "m", k[4:10], em("a", 0, 4))
		must(t, idx.Apply(ctx, "m", nil))
		// A bad update is refused before anything is applied.
		err := idx.Apply(ctx, "m", []kvstore.Update{{Endpoint: "a", Tier: gpu, Remove: true, Keys: k[:3]}, {Endpoint: "a", Tier: 7, Keys: k[:1]}})
		if !errors.Is(err, kvstore.ErrInvalidTier) {
			t.Fatalf("Apply with tier 7: %v", err)
		}
		if err := idx.Apply(ctx, "", []kvstore.Update{{Endpoint: "a", Tier: gpu, Keys: k[:1]}}); !errors.Is(err, kvstore.ErrInvalidArgument) {
			t.Fatalf("Apply with no model: %v", err)
		}
		expectMatch(t, idx, "m", k[:10], em("a", 3, 0), em("b", 3, 0))
	})
	t.Run("Fence", func(t *testing.T) {
		idx := newIndex(t)
		fr, ok := idx.(kvstore.Fencer)
		if !ok {
			t.Skip("index is not a kvstore.Fencer")
		}
		old, cur := fr.Fenced(kvstore.Fence{Scope: "a", Token: 4}), fr.Fenced(kvstore.Fence{Scope: "a", Token: 5})
		// With no fence recorded (a store restarted empty) writes pass, and record nothing.
		must(t, cur.Apply(ctx, "m", []kvstore.Update{{Endpoint: "a", Tier: gpu, Keys: k[:4]}}))
		must(t, old.Add(ctx, "m", "a", gpu, k[:4]))
		must(t, fr.RaiseFence(ctx, "m", kvstore.Fence{Scope: "a", Token: 4}))
		must(t, old.Add(ctx, "m", "a", gpu, k[:4]))
		must(t, fr.RaiseFence(ctx, "m", kvstore.Fence{Scope: "a", Token: 5}))
		// Every write of the older holder is refused and writes nothing.
		fenced := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, kvstore.ErrFenced) {
				t.Fatalf("%s with a stale token: %v, want ErrFenced", what, err)
			}
		}
		fenced("Apply", old.Apply(ctx, "m", []kvstore.Update{{Endpoint: "a", Tier: gpu, Keys: k[:8]}}))
		fenced("Add", old.Add(ctx, "m", "a", gpu, k[:8]))
		fenced("Remove", old.Remove(ctx, "m", "a", gpu, k[:4]))
		fenced("ClearConfirmed", old.ClearConfirmed(ctx, "m", "a"))
		fenced("ClearEndpoint", old.ClearEndpoint(ctx, "m", "a"))
		fenced("Demote", old.Demote(ctx, "m", "a", time.Minute))
		fenced("RaiseFence", fr.RaiseFence(ctx, "m", kvstore.Fence{Scope: "a", Token: 4}))
		expectMatch(t, idx, "m", k[:10], em("a", 4, 0))
		// The current holder writes; reads and speculative records are not fenced.
		must(t, cur.Apply(ctx, "m", []kvstore.Update{{Endpoint: "a", Tier: gpu, Remove: true, Keys: k[2:4]}}))
		must(t, cur.Add(ctx, "m", "a/dp1", cpu, k[:3])) // a rank sub-endpoint under the same scope
		must(t, old.Record(ctx, "m", "b", k[:1], time.Minute))
		expectMatch(t, old, "m", k[:10], em("a", 2, 0), em("a/dp1", 0, 3), em("b", 1, 0))
		// A token newer than the fence writes nothing until its holder raises the fence (a stale holder of
		// an earlier store epoch must not take the scope over); then the earlier one is refused.
		newer := fr.Fenced(kvstore.Fence{Scope: "a", Token: 9})
		fenced("Demote with a newer, unraised token", newer.Demote(ctx, "m", "a", time.Minute))
		expectMatch(t, idx, "m", k[:10], em("a", 2, 0), em("a/dp1", 0, 3), em("b", 1, 0))
		must(t, fr.RaiseFence(ctx, "m", kvstore.Fence{Scope: "a", Token: 9}))
		must(t, fr.RaiseFence(ctx, "m", kvstore.Fence{Scope: "a", Token: 9})) // again: same token
		fenced("Add after a newer holder", cur.Add(ctx, "m", "a", gpu, k[:1]))
		// Other scopes and models are separate.
		must(t, fr.RaiseFence(ctx, "m", kvstore.Fence{Scope: "c", Token: 1}))
		must(t, fr.Fenced(kvstore.Fence{Scope: "c", Token: 1}).Add(ctx, "m", "c", gpu, k[:2]))
		must(t, fr.Fenced(kvstore.Fence{Scope: "a", Token: 1}).Add(ctx, "m2", "a", gpu, k[:2]))
		must(t, newer.ClearConfirmed(ctx, "m", "a/dp1"))
		expectMatch(t, idx, "m", k[:10], em("a", 2, 0), em("b", 1, 0), em("c", 2, 0))
		expectMatch(t, idx, "m2", k[:10], em("a", 2, 0))
		if err := fr.RaiseFence(ctx, "m", kvstore.Fence{Scope: "a", Token: 0}); !errors.Is(err, kvstore.ErrInvalidArgument) {
			t.Fatalf("RaiseFence token 0: %v", err)
		}
		if err := fr.Fenced(kvstore.Fence{Scope: "", Token: 3}).Add(ctx, "m", "a", gpu, k[:1]); !errors.Is(err, kvstore.ErrInvalidArgument) {
			t.Fatalf("Add with an empty scope: %v", err)
		}
	})
	t.Run("SeveralModels", func(t *testing.T) {
		idx := newIndex(t)
		must(t, idx.Add(ctx, "m1", "a", gpu, k[:5]))
		must(t, idx.Add(ctx, "m2", "b", gpu, k[:3]))
		must(t, idx.Add(ctx, "m2", "c", cpu, k[:7]))
		expectMatch(t, idx, "m1", k[:10], em("a", 5, 0))
		expectMatch(t, idx, "m2", k[:10], em("b", 3, 0), em("c", 0, 7))
		must(t, idx.ClearEndpoint(ctx, "m2", "b"))
		expectMatch(t, idx, "m1", k[:10], em("a", 5, 0))
		expectMatch(t, idx, "m2", k[:10], em("c", 0, 7))
		// Model names with Redis-special characters.
		must(t, idx.Add(ctx, "org/model{x}:v1", "e", gpu, k[:2]))
		expectMatch(t, idx, "org/model{x}:v1", k[:4], em("e", 2, 0))
	})
	t.Run("ManyEndpointsPerKey", func(t *testing.T) {
		idx := newIndex(t)
		var want []kvstore.EndpointMatch
		for i := range 9 {
			ep := fmt.Sprintf("ep-%d", i)
			must(t, idx.Add(ctx, "m", kvstore.EndpointID(ep), gpu, k[:i+1]))
			want = append(want, em(ep, i+1, 0))
		}
		expectMatch(t, idx, "m", k[:20], want...)
		must(t, idx.ClearEndpoint(ctx, "m", "ep-2"))
		must(t, idx.Remove(ctx, "m", "ep-0", gpu, k[:1]))
		want = slices.Delete(want, 0, 1)
		want = slices.Delete(want, 1, 2)
		expectMatch(t, idx, "m", k[:20], want...)
	})
	t.Run("LongPrompt", func(t *testing.T) {
		idx := newIndex(t)
		must(t, idx.Add(ctx, "m", "a", gpu, k[:200]))
		must(t, idx.Add(ctx, "m", "a", cpu, k[150:300]))
		must(t, idx.Add(ctx, "m", "b", cpu, k[:299]))
		expectMatch(t, idx, "m", k, em("a", 200, 100), em("b", 0, 299))
	})
	t.Run("VeryLongPrompt", func(t *testing.T) {
		// 9000 blocks: past the Redis scripts' internal chunk sizes (1000 per write, 4000 per MGET).
		idx := newIndex(t)
		long := keys(77, 9000)
		must(t, idx.Add(ctx, "m", "a", gpu, long))
		must(t, idx.Add(ctx, "m", "b", cpu, long[:8500]))
		must(t, idx.Record(ctx, "m", "c", long[:4500], time.Minute))
		expectMatch(t, idx, "m", long, em("a", 9000, 0), em("b", 0, 8500), em("c", 4500, 0))
		must(t, idx.Remove(ctx, "m", "a", gpu, long[4001:4002]))
		expectMatch(t, idx, "m", long, em("a", 4001, 0), em("b", 0, 8500), em("c", 4500, 0))
		must(t, idx.ClearEndpoint(ctx, "m", "b"))
		must(t, idx.ClearEndpoint(ctx, "m", "c"))
		expectMatch(t, idx, "m", long, em("a", 4001, 0))
	})
	t.Run("InvalidInput", func(t *testing.T) {
		idx := newIndex(t)
		for _, err := range []error{
			idx.Add(ctx, "m", "a", 0, k[:1]),
			idx.Add(ctx, "m", "a", 7, k[:1]),
			idx.Remove(ctx, "m", "a", 3, k[:1]),
		} {
			if !errors.Is(err, kvstore.ErrInvalidTier) {
				t.Fatalf("want ErrInvalidTier, got %v", err)
			}
		}
		for _, err := range []error{
			idx.Add(ctx, "", "a", gpu, k[:1]),
			idx.Add(ctx, "m", "", gpu, k[:1]),
			idx.Record(ctx, "m", "a", k[:1], 0),
			idx.Record(ctx, "m", "a", k[:1], -time.Second),
			idx.ClearEndpoint(ctx, "m", ""),
			idx.ClearConfirmed(ctx, "", "a"),
			idx.ClearConfirmed(ctx, "m", "a\tb"),
			idx.Add(ctx, "m", "a\tb", gpu, k[:1]),
			idx.Record(ctx, "m", "a\nb", k[:1], time.Second),
		} {
			if !errors.Is(err, kvstore.ErrInvalidArgument) {
				t.Fatalf("want ErrInvalidArgument, got %v", err)
			}
		}
		expectMatch(t, idx, "m", k[:1])
	})
	t.Run("AgainstReferenceModel", func(t *testing.T) { runRandomized(t, newIndex(t)) })
	t.Run("Concurrent", func(t *testing.T) {
		idx := newIndex(t)
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				ep := kvstore.EndpointID(fmt.Sprintf("g%d", g))
				for i := range 20 {
					if err := idx.Add(ctx, "m", ep, gpu, k[:50]); err != nil {
						t.Error(err)
						return
					}
					if _, err := idx.Match(ctx, "m", k[:60]); err != nil {
						t.Error(err)
						return
					}
					if i%5 == 4 {
						if err := idx.ClearEndpoint(ctx, "m", ep); err != nil {
							t.Error(err)
							return
						}
					}
				}
				if err := idx.Add(ctx, "m", ep, gpu, k[:10+g]); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		expectMatch(t, idx, "m", k[:60], em("g0", 10, 0), em("g1", 11, 0), em("g2", 12, 0), em("g3", 13, 0))
	})
}

// refIndex is the obviously correct model the randomized test compares every backend with.
type refIndex map[string]map[kvstore.BlockKey]map[kvstore.EndpointID]uint8

func (r refIndex) match(model string, ks []kvstore.BlockKey) []kvstore.EndpointMatch {
	var out []kvstore.EndpointMatch
	eps := map[kvstore.EndpointID]bool{}
	if len(ks) > 0 {
		for ep, b := range r[model][ks[0]] {
			if b != 0 {
				eps[ep] = true
			}
		}
	}
	for ep := range eps {
		m := kvstore.EndpointMatch{Endpoint: ep}
		for _, key := range ks {
			b := r[model][key][ep]
			if b == 0 {
				break
			}
			if b&uint8(kvstore.TierGPU) != 0 {
				m.GPUBlocks++
			} else {
				m.CPUBlocks++
			}
		}
		out = append(out, m)
	}
	return out
}

func runRandomized(t *testing.T, idx kvstore.Index) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 11))
	ref := refIndex{}
	models := []string{"m1", "m2"}
	eps := []kvstore.EndpointID{"a", "b", "c", "d", "e", "f"}
	chains := [][]kvstore.BlockKey{keys(100, 40), keys(101, 40), keys(102, 40)}
	for op := range 600 {
		model := models[rng.IntN(len(models))]
		ep := eps[rng.IntN(len(eps))]
		ch := chains[rng.IntN(len(chains))]
		lo := rng.IntN(len(ch))
		hi := lo + 1 + rng.IntN(len(ch)-lo)
		if rng.IntN(3) == 0 {
			lo = 0
		}
		tier := kvstore.TierGPU
		if rng.IntN(3) == 0 {
			tier = kvstore.TierCPU
		}
		if ref[model] == nil {
			ref[model] = map[kvstore.BlockKey]map[kvstore.EndpointID]uint8{}
		}
		switch r := rng.IntN(20); {
		case r < 11:
			must(t, idx.Add(ctx, model, ep, tier, ch[lo:hi]))
			for _, key := range ch[lo:hi] {
				if ref[model][key] == nil {
					ref[model][key] = map[kvstore.EndpointID]uint8{}
				}
				ref[model][key][ep] |= uint8(tier)
			}
		case r < 18:
			must(t, idx.Remove(ctx, model, ep, tier, ch[lo:hi]))
			for _, key := range ch[lo:hi] {
				if ref[model][key] != nil {
					ref[model][key][ep] &^= uint8(tier)
				}
			}
		case r < 19:
			must(t, idx.ClearEndpoint(ctx, model, ep))
			for _, h := range ref[model] {
				delete(h, ep)
			}
		default: // no speculative entries here: the same effect as ClearEndpoint
			must(t, idx.ClearConfirmed(ctx, model, ep))
			for _, h := range ref[model] {
				delete(h, ep)
			}
		}
		for _, m := range models {
			for ci, c := range chains {
				got, err := idx.Match(ctx, m, c)
				if err != nil {
					t.Fatal(err)
				}
				if g, w := sorted(got), sorted(ref.match(m, c)); !slices.Equal(g, w) {
					t.Fatalf("op %d, model %s chain %d: match = %+v, reference %+v", op, m, ci, g, w)
				}
			}
		}
	}
}

// CappedIndexFactory returns a new, empty index whose entries per (model, endpoint) are bounded by
// perEndpoint (MemoryConfig.MaxKeysPerEndpoint, RedisConfig.MaxEntriesPerEndpoint).
type CappedIndexFactory func(t *testing.T, perEndpoint int) kvstore.Index

// RunEndpointCap checks the per-endpoint bound: an endpoint flooded with 1,000 distinct blocks (single
// Adds, multi-block Adds and, where the index is a Batcher, Apply) keeps between half the cap and the cap;
// another endpoint under the cap keeps everything; the flooded endpoint's clear still empties it.
func RunEndpointCap(t *testing.T, newIndex CappedIndexFactory) {
	ctx := context.Background()
	const perEp = 64
	idx := newIndex(t, perEp)
	flood := keys(77, 1000) // a chain: each block is matched alone below, so chaining does not matter
	small := keys(78, 10)
	must(t, idx.Add(ctx, "m", "small", kvstore.TierGPU, small))
	for _, k := range flood[:400] {
		must(t, idx.Add(ctx, "m", "big", kvstore.TierGPU, []kvstore.BlockKey{k}))
	}
	for i := 400; i < 700; i += 50 {
		must(t, idx.Add(ctx, "m", "big", kvstore.TierGPU, flood[i:i+50]))
	}
	if b, ok := idx.(kvstore.Batcher); ok {
		var ups []kvstore.Update
		for i := 700; i < 1000; i += 30 {
			ups = append(ups, kvstore.Update{Endpoint: "big", Tier: kvstore.TierGPU, Keys: flood[i : i+30]})
		}
		must(t, b.Apply(ctx, "m", ups))
	} else {
		must(t, idx.Add(ctx, "m", "big", kvstore.TierGPU, flood[700:]))
	}
	held := func(ep string, ks []kvstore.BlockKey) int {
		n := 0
		for _, k := range ks {
			ms, err := idx.Match(ctx, "m", []kvstore.BlockKey{k})
			must(t, err)
			for _, m := range ms {
				if string(m.Endpoint) == ep && m.GPUBlocks == 1 {
					n++
				}
			}
		}
		return n
	}
	if n := held("big", flood); n > perEp || n < perEp/2 {
		t.Fatalf("flooded endpoint holds %d blocks, want %d..%d", n, perEp/2, perEp)
	}
	if n := held("small", small); n != len(small) {
		t.Fatalf("the other endpoint holds %d of its %d blocks", n, len(small))
	}
	must(t, idx.ClearEndpoint(ctx, "m", "big"))
	if n := held("big", flood); n != 0 {
		t.Fatalf("cleared endpoint still holds %d blocks", n)
	}
	// Under the cap again: a fresh run of blocks is kept whole.
	must(t, idx.Add(ctx, "m", "big", kvstore.TierGPU, flood[:perEp/2]))
	expectMatch(t, idx, "m", flood[:perEp/2], em("big", perEp/2, 0))
}
