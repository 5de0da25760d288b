package tpu

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// backendFactory returns an allocator on a fresh backend and a function that lets time pass on its clock
// (a fake clock on memory, a real sleep on Redis, whose scripts read TIME).
type backendFactory func(t *testing.T) (*Allocator, func(time.Duration))

var poolSeq atomic.Int64

func newPool() string { return fmt.Sprintf("p%d-%d", time.Now().UnixNano()%1e6, poolSeq.Add(1)) }

func hostsN(prefix string, n int) []Host {
	out := make([]Host, n)
	for i := range out {
		out[i] = Host{Name: fmt.Sprintf("%s-h%d", prefix, i), WorkerID: i}
	}
	return out
}

func mustRegister(t *testing.T, a *Allocator, pool, id, gen, topo string, hosts int) {
	t.Helper()
	if err := a.Register(context.Background(), pool, SliceSpec{ID: id, Generation: gen, Topology: topo, Hosts: hostsN(id, hosts)}); err != nil {
		t.Fatalf("register %s %s %s: %v", id, gen, topo, err)
	}
}

func ip(i int) *int { return &i }

func reserve(t *testing.T, a *Allocator, pool string, r Request) Lease {
	t.Helper()
	if r.Holder == "" {
		r.Holder = "test"
	}
	if r.TTL == 0 {
		r.TTL = time.Minute
	}
	l, err := a.Reserve(context.Background(), pool, r)
	if err != nil {
		t.Fatalf("reserve %+v: %v", r, err)
	}
	return l
}

func refuse(t *testing.T, a *Allocator, pool string, r Request, want error) {
	t.Helper()
	if r.Holder == "" {
		r.Holder = "test"
	}
	if r.TTL == 0 {
		r.TTL = time.Minute
	}
	l, err := a.Reserve(context.Background(), pool, r)
	if !errors.Is(err, want) {
		t.Fatalf("reserve %+v: got lease %v err %v, want %v", r, l.ID, err, want)
	}
}

func freeBlocks(t *testing.T, a *Allocator, pool, slice string) map[string]int {
	t.Helper()
	si, err := a.Inspect(context.Background(), pool, slice)
	if err != nil {
		t.Fatal(err)
	}
	return si.FreeBlocks
}

func eqInts(a []int, b ...int) bool { return slices.Equal(a, b) }

// runConformance is the one suite every backend passes: the 24 worked cases of the TPU reference notes (section 4),
// then registration, renewal and state checks.
func runConformance(t *testing.T, newBackend backendFactory) {
	ctx := context.Background()
	a, advance := newBackend(t)

	t.Run("01_WholeV6e4x4", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s", "v6e", "4x4", 4)
		l := reserve(t, a, p, Request{Whole: true, Shape: "4x4"})
		if l.ChipCount != 16 || l.HostCount != 4 || l.TensorCoreCount != 16 || l.HBMBytes != 16*32<<30 || l.PodType != "v6e-16" ||
			l.Kind != "slice" || len(l.Chips) != 16 || !slices.Equal(l.Hosts, []string{"s-h0", "s-h1", "s-h2", "s-h3"}) || l.Head != "s-h0" {
			t.Fatalf("lease %+v", l)
		}
		if l.Env["TPU_WORKER_HOSTNAMES"] != "s-h0,s-h1,s-h2,s-h3" || l.Env["TPU_HOST_BOUNDS"] != "2,2,1" ||
			l.Env["TPU_CHIPS_PER_HOST_BOUNDS"] != "2,2,1" || l.Env["TPU_TOPOLOGY"] != "4x4" || l.HostEnv[3].Env["TPU_WORKER_ID"] != "3" {
			t.Fatalf("env %v %v", l.Env, l.HostEnv)
		}
	})
	t.Run("02_Sub2x2", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s", "v6e", "4x4", 4)
		if fb := freeBlocks(t, a, p, "s"); fb["2x2"] != 4 || fb["2x4"] != 2 || fb["4x4"] != 1 {
			t.Fatalf("free blocks %v", fb)
		}
		l := reserve(t, a, p, Request{Shape: "2x2"})
		if !eqInts(l.Origin, 0, 0) || l.Index != 0 || l.HostCount != 1 || l.Hosts[0] != "s-h0" || l.ID != "s.2x2.0" ||
			!slices.EqualFunc(l.Chips, [][]int{{0, 0}, {1, 0}, {0, 1}, {1, 1}}, slices.Equal) || l.Env["TPU_HOST_BOUNDS"] != "1,1,1" {
			t.Fatalf("lease %+v", l)
		}
	})
	t.Run("03_Misaligned", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s", "v6e", "4x4", 4)
		refuse(t, a, p, Request{Shape: "2x2", Offset: []int{1, 1}}, ErrMisaligned)
		l := reserve(t, a, p, Request{Shape: "2x2", Offset: []int{2, 2}})
		if l.Index != 3 || l.Hosts[0] != "s-h3" {
			t.Fatalf("lease at offset (2,2): %+v", l)
		}
	})
	t.Run("04_06_12_InvalidShapes", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s", "v6e", "4x4", 4)
		for _, s := range []string{"3x3", "4x2", "2x2x1", "2x", "0x2"} {
			refuse(t, a, p, Request{Shape: s}, ErrInvalidShape)
		}
	})
	t.Run("05_Sub2x4", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s", "v6e", "4x4", 4)
		l := reserve(t, a, p, Request{Shape: "2x4"})
		if !eqInts(l.Origin, 0, 0) || l.ChipCount != 8 || !slices.Equal(l.Hosts, []string{"s-h0", "s-h2"}) || !eqInts(l.WorkerIDs, 0, 2) ||
			l.Env["TPU_HOST_BOUNDS"] != "1,2,1" || l.HostEnv[1].Env["TPU_WORKER_ID"] != "1" {
			t.Fatalf("lease %+v", l)
		}
	})
	t.Run("07_08_WholeAndExceeds", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s", "v6e", "4x4", 4)
		refuse(t, a, p, Request{Shape: "4x4"}, ErrUseWholeSlice)
		refuse(t, a, p, Request{Shape: "8x8"}, ErrShapeExceedsParent)
	})
	t.Run("09_Index", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s", "v6e", "4x4", 4)
		l := reserve(t, a, p, Request{Shape: "2x4", Index: ip(1)})
		if !eqInts(l.Origin, 2, 0) || !slices.Equal(l.Hosts, []string{"s-h1", "s-h3"}) {
			t.Fatalf("lease %+v", l)
		}
		refuse(t, a, p, Request{Shape: "2x4", Index: ip(2)}, ErrInvalidIndex)
		refuse(t, a, p, Request{Shape: "2x4", Index: ip(1), Slice: "s"}, ErrNoCapacity)
		refuse(t, a, p, Request{Shape: "2x4", Slice: "nope"}, ErrUnknownSlice)
	})
	t.Run("10_FirstFitFragments", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s", "v6e", "4x4", 4)
		l1 := reserve(t, a, p, Request{Shape: "2x2", Strategy: FirstFit})
		l2 := reserve(t, a, p, Request{Shape: "2x2", Strategy: FirstFit})
		if !eqInts(l1.Origin, 0, 0) || !eqInts(l2.Origin, 2, 0) {
			t.Fatalf("origins %v %v", l1.Origin, l2.Origin)
		}
		refuse(t, a, p, Request{Shape: "2x4", Strategy: FirstFit}, ErrNoCapacity)
		if si, _ := a.Inspect(ctx, p, "s"); si.FreeChips != 8 || si.LeasedChips != 8 {
			t.Fatalf("free %d leased %d", si.FreeChips, si.LeasedChips)
		}
	})
	t.Run("11_BestFitPacks", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s", "v6e", "4x4", 4)
		l1 := reserve(t, a, p, Request{Shape: "2x2"})
		l2 := reserve(t, a, p, Request{Shape: "2x2"})
		l3 := reserve(t, a, p, Request{Shape: "2x4"})
		if !eqInts(l1.Origin, 0, 0) || !eqInts(l2.Origin, 0, 2) || !eqInts(l3.Origin, 2, 0) {
			t.Fatalf("origins %v %v %v", l1.Origin, l2.Origin, l3.Origin)
		}
	})
	t.Run("13_SingleHostSubHost", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s", "v6e", "2x4", 1)
		refuse(t, a, p, Request{Shape: "2x2"}, ErrBelowHostGranularity)
		l := reserve(t, a, p, Request{Shape: "2x2", AllowSubHost: true})
		l2 := reserve(t, a, p, Request{Shape: "2x2", AllowSubHost: true})
		if !eqInts(l.Origin, 0, 0) || !eqInts(l2.Origin, 0, 2) || l.HostCount != 1 || l2.Hosts[0] != "s-h0" || l.Env["TPU_CHIPS_PER_HOST_BOUNDS"] != "2,2,1" {
			t.Fatalf("leases %+v %+v", l, l2)
		}
		refuse(t, a, p, Request{Shape: "1x1", AllowSubHost: true}, ErrNoCapacity)
	})
	t.Run("14_15_V5pCube", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s", "v5p", "4x4x4", 16)
		fb := freeBlocks(t, a, p, "s")
		if fb["2x2x4"] != 4 || fb["2x2x2"] != 8 || fb["2x2x1"] != 16 || fb["2x4x4"] != 2 || fb["4x4x4"] != 1 {
			t.Fatalf("free blocks %v", fb)
		}
		l := reserve(t, a, p, Request{Shape: "2x2x4"})
		if l.ChipCount != 16 || l.HostCount != 4 || l.TensorCoreCount != 32 || l.PodType != "v5p-32" || l.HBMBytes != 16*95<<30 ||
			!eqInts(l.WorkerIDs, 0, 4, 8, 12) || l.Env["TPU_HOST_BOUNDS"] != "1,1,4" {
			t.Fatalf("lease %+v", l)
		}
	})
	t.Run("16_V5pInvalid", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s", "v5p", "4x4x4", 16)
		for _, s := range []string{"4x4x2", "4x2x4", "2x2x3"} {
			refuse(t, a, p, Request{Shape: s}, ErrInvalidShape)
		}
	})
	t.Run("17_V5pTwoCubes", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s", "v5p", "4x4x8", 32)
		if fb := freeBlocks(t, a, p, "s"); fb["4x4x4"] != 2 {
			t.Fatalf("free blocks %v", fb)
		}
		l1 := reserve(t, a, p, Request{Shape: "4x4x4"})
		l2 := reserve(t, a, p, Request{Shape: "4x4x4"})
		if !eqInts(l1.Origin, 0, 0, 0) || !eqInts(l2.Origin, 0, 0, 4) {
			t.Fatalf("origins %v %v", l1.Origin, l2.Origin)
		}
		refuse(t, a, p, Request{Shape: "4x4x4"}, ErrNoCapacity)
	})
	t.Run("18_Tpu7xWhole", func(t *testing.T) {
		p := newPool()
		if err := a.Register(ctx, p, SliceSpec{ID: "s", Generation: "tpu7x", Topology: "4x4x4", Hosts: hostsN("s", 16), DevicesPerChip: 2}); err != nil {
			t.Fatal(err)
		}
		mustRegister(t, a, p, "t", "v7x", "4x4x4", 16)
		l := reserve(t, a, p, Request{Whole: true, Shape: "4x4x4"})
		l2 := reserve(t, a, p, Request{Whole: true, Shape: "4x4x4"})
		if l.Slice != "s" || l.ChipCount != 64 || l.HostCount != 16 || l.TensorCoreCount != 128 || l.HBMBytes != 12288<<30 ||
			l.PodType != "tpu7x-128" || l.DeviceCount != 128 || l2.Slice != "t" || l2.DeviceCount != 64 || l.GKEAccelerator != "tpu7x" {
			t.Fatalf("leases %+v\n%+v", l, l2)
		}
		if err := a.Register(ctx, p, SliceSpec{ID: "u", Generation: "v6e", Topology: "4x4", Hosts: hostsN("u", 4), DevicesPerChip: 2}); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("v6e with 2 devices per chip: %v", err)
		}
	})
	t.Run("19_Tpu7xSub", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s", "tpu7x", "4x4x4", 16)
		fb := freeBlocks(t, a, p, "s")
		if fb["2x2x1"] != 16 || fb["2x2x4"] != 4 {
			t.Fatalf("free blocks %v", fb)
		}
		reserve(t, a, p, Request{Shape: "2x2x1"})
		reserve(t, a, p, Request{Shape: "2x2x4"})
		refuse(t, a, p, Request{Shape: "4x4x8"}, ErrShapeExceedsParent)
	})
	t.Run("20_WholeSkipsUsed", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s1", "v6e", "4x4", 4)
		mustRegister(t, a, p, "s2", "v6e", "4x4", 4)
		sub := reserve(t, a, p, Request{Shape: "2x2"})
		w := reserve(t, a, p, Request{Whole: true, Shape: "4x4"})
		if sub.Slice != "s1" || w.Slice != "s2" {
			t.Fatalf("sub on %s, whole on %s", sub.Slice, w.Slice)
		}
		refuse(t, a, p, Request{Whole: true, Shape: "4x4"}, ErrNoCapacity)
		if _, err := a.Release(ctx, p, sub.ID, sub.Token); err != nil {
			t.Fatal(err)
		}
		if w := reserve(t, a, p, Request{Whole: true, Shape: "4x4"}); w.Slice != "s1" {
			t.Fatalf("whole after release on %s", w.Slice)
		}
	})
	t.Run("21_ExpiryFences", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s", "v6e", "4x4", 4)
		old := reserve(t, a, p, Request{Shape: "2x2", Index: ip(0), TTL: 300 * time.Millisecond, Holder: "old"})
		if _, err := a.Renew(ctx, p, old.ID, old.Token, 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		refuse(t, a, p, Request{Shape: "2x2", Index: ip(0)}, ErrNoCapacity)
		advance(450 * time.Millisecond)
		nw := reserve(t, a, p, Request{Shape: "2x2", Index: ip(0), Holder: "new"})
		if nw.ID != old.ID || nw.Token <= old.Token {
			t.Fatalf("new lease %s token %d, old %s token %d", nw.ID, nw.Token, old.ID, old.Token)
		}
		if _, err := a.Renew(ctx, p, old.ID, old.Token, time.Minute); !errors.Is(err, ErrStaleToken) {
			t.Fatalf("stale renew: %v", err)
		}
		if _, err := a.Release(ctx, p, old.ID, old.Token); !errors.Is(err, ErrStaleToken) {
			t.Fatalf("stale release: %v", err)
		}
		if si, _ := a.Inspect(ctx, p, "s"); si.LeasedChips != 4 || si.Owners[0] != nw.ID || si.Leases[0].Holder != "new" {
			t.Fatalf("after stale calls: %+v", si)
		}
		if ok, err := a.Release(ctx, p, nw.ID, nw.Token); !ok || err != nil {
			t.Fatalf("release: %v %v", ok, err)
		}
		if _, err := a.Renew(ctx, p, old.ID, old.Token, time.Minute); !errors.Is(err, ErrLeaseNotFound) {
			t.Fatalf("renew of a gone lease: %v", err)
		}
	})
	t.Run("22_Race50", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s", "v6e", "4x4", 4)
		var ok, full atomic.Int64
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Go(func() {
				_, err := a.Reserve(ctx, p, Request{Shape: "2x2", Holder: fmt.Sprint("g", i), TTL: time.Minute})
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, ErrNoCapacity):
					full.Add(1)
				default:
					t.Error(err)
				}
			})
		}
		wg.Wait()
		checkDisjoint(t, a, p, "s", 4)
		if ok.Load() != 4 || full.Load() != 46 {
			t.Fatalf("%d granted, %d refused", ok.Load(), full.Load())
		}
	})
	t.Run("23_UnhealthyHost", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s", "v6e", "4x4", 4)
		if err := a.SetHealth(ctx, p, "s", "s-h3", false); err != nil {
			t.Fatal(err)
		}
		refuse(t, a, p, Request{Whole: true, Shape: "4x4"}, ErrNoCapacity)
		refuse(t, a, p, Request{Shape: "2x4", Index: ip(1)}, ErrNoCapacity)
		fb := freeBlocks(t, a, p, "s")
		if fb["2x2"] != 3 || fb["2x4"] != 1 || fb["4x4"] != 0 {
			t.Fatalf("free blocks %v", fb)
		}
		l := reserve(t, a, p, Request{Shape: "2x4"})
		if !eqInts(l.Origin, 0, 0) || !eqInts(l.WorkerIDs, 0, 2) {
			t.Fatalf("lease %+v", l)
		}
		if si, _ := a.Inspect(ctx, p, "s"); si.UnhealthyChips != 4 || si.Hosts[3].Healthy || !si.Hosts[2].Healthy {
			t.Fatalf("inspect %+v", si)
		}
		if err := a.SetHealth(ctx, p, "s", "s-h3", true); err != nil {
			t.Fatal(err)
		}
		reserve(t, a, p, Request{Shape: "2x4", Index: ip(1)})
		if err := a.SetHealth(ctx, p, "s", "nope", false); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("unknown host: %v", err)
		}
		if err := a.SetHealth(ctx, p, "zz", "s-h0", false); !errors.Is(err, ErrUnknownSlice) {
			t.Fatalf("unknown slice: %v", err)
		}
	})
	t.Run("24_ReleaseTwice", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s", "v6e", "4x4", 4)
		l := reserve(t, a, p, Request{Shape: "2x2"})
		if ok, err := a.Release(ctx, p, l.ID, l.Token); !ok || err != nil {
			t.Fatalf("first release %v %v", ok, err)
		}
		if ok, err := a.Release(ctx, p, l.ID, l.Token); ok || err != nil {
			t.Fatalf("second release %v %v", ok, err)
		}
		if si, _ := a.Inspect(ctx, p, "s"); si.FreeChips != 16 || len(si.Leases) != 0 {
			t.Fatalf("after release %+v", si)
		}
	})
	t.Run("RegisterIdempotent", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s", "v6e", "4x4", 4)
		l := reserve(t, a, p, Request{Shape: "2x2"})
		mustRegister(t, a, p, "s", "v6e", "4x4", 4) // same spec: no-op, the lease stays
		if si, _ := a.Inspect(ctx, p, "s"); si.LeasedChips != 4 || si.Owners[0] != l.ID {
			t.Fatalf("re-register reset the slice: %+v", si)
		}
		if err := a.Register(ctx, p, SliceSpec{ID: "s", Generation: "v6e", Topology: "4x8", Hosts: hostsN("s", 8)}); !errors.Is(err, ErrSliceExists) {
			t.Fatalf("conflicting register: %v", err)
		}
		for _, bad := range []SliceSpec{
			{ID: "a", Generation: "v9", Topology: "4x4", Hosts: hostsN("a", 4)},
			{ID: "a", Generation: "v6e", Topology: "4x4", Hosts: hostsN("a", 3)},
			{ID: "a.b", Generation: "v6e", Topology: "4x4", Hosts: hostsN("a", 4)},
			{ID: "a", Generation: "v6e", Topology: "4x4", Hosts: []Host{{"x", 0}, {"x", 1}, {"y", 2}, {"z", 3}}},
		} {
			if err := a.Register(ctx, p, bad); !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("register %+v: %v", bad, err)
			}
		}
		if err := a.Register(ctx, p, SliceSpec{ID: "a", Generation: "v6e", Topology: "3x3", Hosts: hostsN("a", 2)}); !errors.Is(err, ErrInvalidShape) {
			t.Fatalf("3x3 slice: %v", err)
		}
		for _, bad := range []string{"a{b}", "", "a b", "x}"} { // a brace would move the pool's keys to another slot
			if err := a.Register(ctx, bad, SliceSpec{ID: "s", Generation: "v6e", Topology: "4x4", Hosts: hostsN("s", 4)}); !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("pool %q: %v", bad, err)
			}
		}
		pools, err := a.Pools(ctx)
		if err != nil || !slices.Contains(pools, p) {
			t.Fatalf("pools %v %v", pools, err)
		}
	})
	t.Run("RegisterHeld", func(t *testing.T) {
		p := newPool()
		spec := SliceSpec{ID: "s", Generation: "v6e", Topology: "4x4", Hosts: hostsN("s", 4)}
		h := Hold{Holder: "quarantine", TTL: 300 * time.Millisecond, Unhealthy: []string{"s-h1"}}
		created, err := a.RegisterHeld(ctx, p, spec, h)
		if err != nil || !created {
			t.Fatalf("register held: %v %v", created, err)
		}
		si, err := a.Inspect(ctx, p, "s")
		if err != nil || si.LeasedChips != 16 || si.FreeChips != 0 || si.UnhealthyChips != 4 || si.Hosts[1].Healthy || !si.Hosts[0].Healthy ||
			len(si.Leases) != 1 || si.Leases[0].ID != "s.4x4.0" || si.Leases[0].Holder != "quarantine" || si.Leases[0].Kind != "slice" ||
			si.Leases[0].ChipCount != 16 || si.Owners[15] != "s.4x4.0" {
			t.Fatalf("held slice: %+v %v", si, err)
		}
		held := si.Leases[0]
		refuse(t, a, p, Request{Shape: "2x2"}, ErrNoCapacity)
		refuse(t, a, p, Request{Whole: true, Slice: "s"}, ErrNoCapacity)
		// The same spec again: nothing written (the hold is not renewed or replaced).
		if created, err := a.RegisterHeld(ctx, p, spec, Hold{Holder: "second", TTL: time.Hour}); err != nil || created {
			t.Fatalf("second register held: %v %v", created, err)
		}
		if si, _ := a.Inspect(ctx, p, "s"); len(si.Leases) != 1 || si.Leases[0].Token != held.Token || si.Leases[0].Holder != "quarantine" {
			t.Fatalf("after a second register: %+v", si.Leases)
		}
		// Bad holds write nothing.
		for _, bad := range []Hold{{Unhealthy: []string{"nope"}}, {Holder: "x", TTL: 0}, {Holder: string(make([]byte, 257)), TTL: time.Second}} {
			if _, err := a.RegisterHeld(ctx, p, SliceSpec{ID: "b", Generation: "v6e", Topology: "4x4", Hosts: hostsN("b", 4)}, bad); !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("hold %+v: %v", bad, err)
			}
		}
		if _, err := a.Inspect(ctx, p, "b"); !errors.Is(err, ErrUnknownSlice) {
			t.Fatalf("a refused hold registered the slice: %v", err)
		}
		// The hold expires like any lease; the unhealthy host stays unhealthy.
		advance(450 * time.Millisecond)
		refuse(t, a, p, Request{Whole: true, Slice: "s"}, ErrNoCapacity)
		refuse(t, a, p, Request{Shape: "2x2", Index: ip(1)}, ErrNoCapacity) // on s-h1
		l := reserve(t, a, p, Request{Shape: "2x2", Index: ip(2)})
		if l.Token <= held.Token || l.Hosts[0] != "s-h2" {
			t.Fatalf("after the hold: %+v (hold token %d)", l, held.Token)
		}
		// A hold can be released early by whoever holds its token.
		p2 := newPool()
		if _, err := a.RegisterHeld(ctx, p2, spec, Hold{Holder: "q", TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		si, _ = a.Inspect(ctx, p2, "s")
		if ok, err := a.Release(ctx, p2, si.Leases[0].ID, si.Leases[0].Token); !ok || err != nil {
			t.Fatalf("release the hold: %v %v", ok, err)
		}
		reserve(t, a, p2, Request{Whole: true, Slice: "s"})
		// No hold: the same as Register.
		p3 := newPool()
		if created, err := a.RegisterHeld(ctx, p3, spec, Hold{}); err != nil || !created {
			t.Fatal(created, err)
		}
		reserve(t, a, p3, Request{Whole: true, Slice: "s"})
	})
	t.Run("RegisterHeldRace", func(t *testing.T) {
		// Gateways re-registering a lost slice race each other and the fleet's reservations: exactly one
		// registration creates it, and no reservation is granted before the hold expires.
		p := newPool()
		spec := SliceSpec{ID: "s", Generation: "v6e", Topology: "4x4", Hosts: hostsN("s", 4)}
		var created, granted atomic.Int32
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i%2 == 0 {
					c, err := a.RegisterHeld(ctx, p, spec, Hold{Holder: fmt.Sprintf("g%d", i), TTL: time.Hour})
					if err != nil {
						t.Error(err)
					}
					if c {
						created.Add(1)
					}
					return
				}
				for range 20 {
					if _, err := a.Reserve(ctx, p, Request{Shape: "2x2", Holder: "job", TTL: time.Minute}); err == nil {
						granted.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		si, err := a.Inspect(ctx, p, "s")
		if err != nil || created.Load() != 1 || granted.Load() != 0 || len(si.Leases) != 1 || si.LeasedChips != 16 {
			t.Fatalf("created %d, granted %d, leases %+v, %v", created.Load(), granted.Load(), si.Leases, err)
		}
	})
	t.Run("RenewExtends", func(t *testing.T) {
		p := newPool()
		mustRegister(t, a, p, "s", "v6e", "4x4", 4)
		l := reserve(t, a, p, Request{Shape: "2x2", TTL: 300 * time.Millisecond})
		for range 3 {
			advance(150 * time.Millisecond)
			r, err := a.Renew(ctx, p, l.ID, l.Token, 300*time.Millisecond)
			if err != nil || r.Token != l.Token || !r.ExpiresAt.After(l.ExpiresAt) {
				t.Fatalf("renew %+v %v", r, err)
			}
		}
		if si, _ := a.Inspect(ctx, p, "s"); si.LeasedChips != 4 {
			t.Fatalf("renewed lease lost: %+v", si)
		}
	})
}

// checkDisjoint inspects slice and checks that the leases' chips are disjoint, match the owners, and
// number want.
func checkDisjoint(t *testing.T, a *Allocator, pool, slice string, want int) {
	t.Helper()
	si, err := a.Inspect(context.Background(), pool, slice)
	if err != nil {
		t.Fatal(err)
	}
	if len(si.Leases) != want {
		t.Fatalf("%d leases, want %d", len(si.Leases), want)
	}
	seen := map[string]string{}
	for _, l := range si.Leases {
		for _, c := range l.Chips {
			k := fmt.Sprint(c)
			if o, dup := seen[k]; dup {
				t.Fatalf("chip %s owned by %s and %s", k, o, l.ID)
			}
			seen[k] = l.ID
			idx := c[0] + c[1]*4
			if si.Owners[idx] != l.ID {
				t.Fatalf("chip %s owner %q, lease %s", k, si.Owners[idx], l.ID)
			}
		}
	}
}
