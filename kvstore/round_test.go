package kvstore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// TestSharedRoundOneRoundTrip runs a repeated request's Match and in-flight read concurrently on one real
// redis-server, each with a context of one kvstore.SharedRound (as route.Plan does), on index layouts 1
// and 2 and both reservation layouts: the answers are those of the calls made alone, and Redis processed
// one read for the two (INFO stats total_reads_processed), where the calls made alone cost two.
func TestSharedRoundOneRoundTrip(t *testing.T) {
	for _, il := range []int{1, 2} {
		for _, rl := range []int{kvstore.ReservationLayoutSingle, kvstore.ReservationLayoutSharded} {
			t.Run("index"+strconv.Itoa(il)+"/reservations"+strconv.Itoa(rl), func(t *testing.T) { sharedRound(t, il, rl) })
		}
	}
}

func sharedRound(t *testing.T, indexLayout, resLayout int) {
	ctx := context.Background()
	srv := redistest.Start(t)
	c := srv.Client(t)
	st, err := kvstore.OpenStore(ctx, kvstore.StoreConfig{Kind: "redis", Addrs: []string{c.Options().Addr}, Prefix: "sr",
		IndexLayout: indexLayout, ReservationLayout: resLayout})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ks := kvstore.Hasher{}.Keys(make([]uint32, 16*128), 16, kvstore.ExtraKeys{})
	fams := make([]kvstore.Family, len(ks))
	for i := range fams {
		fams[i] = kvstore.FamilyOf(ks[0])
	}
	if err := st.Index.Apply(ctx, "m", []kvstore.Update{{Endpoint: "a", Tier: kvstore.TierGPU, Keys: ks, Families: fams}}); err != nil {
		t.Fatal(err)
	}
	eps := []kvstore.EndpointID{"a", "b"}
	lease, err := st.Reservations.Reserve(ctx, []kvstore.Candidate{{Endpoint: "a", Limits: kvstore.Limits{MaxRequests: 4}}},
		kvstore.Cost{Requests: 1, Tokens: 2048}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Reservations.Release(ctx, lease)
	reads := func() int64 {
		for _, l := range strings.Split(c.Info(ctx, "stats").Val(), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "total_reads_processed:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		t.Fatal("no total_reads_processed")
		return 0
	}
	both := func(shared bool) ([]kvstore.EndpointMatch, map[kvstore.EndpointID]kvstore.Cost, int64) {
		ictx, mctx := ctx, ctx
		if shared {
			sr := kvstore.NewSharedRound()
			ictx, mctx = sr.Join(ctx), sr.Join(ctx)
		}
		r0 := reads()
		type inf struct {
			m   map[kvstore.EndpointID]kvstore.Cost
			err error
		}
		ch := make(chan inf, 1)
		go func() {
			m, err := st.Reservations.InFlight(ictx, eps)
			kvstore.LeaveRound(ictx)
			ch <- inf{m, err}
		}()
		m, err := st.Index.Match(mctx, "m", ks)
		kvstore.LeaveRound(mctx)
		in := <-ch
		n := reads() - r0 - 1 // less the second INFO
		if err != nil || in.err != nil {
			t.Fatal(err, in.err)
		}
		return m, in.m, n
	}
	for range 2 { // warm: the index's memo of block 0, layout 2's registry, the records channel
		both(false)
	}
	// The fewest reads of three tries each: layout 2's registry (cached for a second) may be read again
	// in between on a slow machine, one read more that is not the calls'.
	alone, shared := int64(1<<30), int64(1<<30)
	var m0, m1 []kvstore.EndpointMatch
	var in0, in1 map[kvstore.EndpointID]kvstore.Cost
	for range 3 {
		var n int64
		m0, in0, n = both(false)
		alone = min(alone, n)
		m1, in1, n = both(true)
		shared = min(shared, n)
	}
	if len(m1) != 1 || m1[0] != m0[0] || m1[0].GPUBlocks != 128 {
		t.Errorf("Match in a shared round: %+v, alone %+v", m1, m0)
	}
	if len(in1) != 1 || in1["a"] != in0["a"] || in1["a"].Requests != 1 {
		t.Errorf("InFlight in a shared round: %+v, alone %+v", in1, in0)
	}
	if alone != 2 || shared != 1 {
		t.Errorf("reads processed by Redis: alone %d, shared %d; want 2 and 1", alone, shared)
	}
}

// TestSharedRoundLeave checks that a call of a round that sends nothing releases the other when it leaves,
// and that a waiting call returns when its context ends, with ErrUnavailable for a deadline (what
// go-redis's error hook makes of a deadline on a hung server, so Guarded goes store-down the same way).
func TestSharedRoundLeave(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	c := srv.Client(t)
	st, err := kvstore.OpenStore(ctx, kvstore.StoreConfig{Kind: "redis", Addrs: []string{c.Options().Addr}, Prefix: "sl", IndexLayout: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ks := kvstore.Hasher{}.Keys(make([]uint32, 64), 16, kvstore.ExtraKeys{})
	sr := kvstore.NewSharedRound()
	ictx, mctx := sr.Join(ctx), sr.Join(ctx)
	go kvstore.LeaveRound(ictx) // the other call sends nothing and returns, whenever
	if _, err := st.Index.Match(mctx, "m", ks); err != nil {
		t.Fatal(err)
	}
	kvstore.LeaveRound(mctx)
	sr = kvstore.NewSharedRound()
	_ = sr.Join(ctx) // never used, never left
	wctx, cancel := context.WithTimeout(sr.Join(ctx), 50*time.Millisecond)
	defer cancel()
	if _, err := st.Index.Match(wctx, "m", ks); !errors.Is(err, kvstore.ErrUnavailable) || wctx.Err() == nil {
		t.Fatalf("a Match waiting for a call that never comes: %v (context %v), want ErrUnavailable at the deadline", err, wctx.Err())
	}
}
