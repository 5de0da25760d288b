package kvstore

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/kvstore/redistest"
)

// TestLayout2FenceRaisedMidBatch: on one server a layout-2 batch is WATCHed on the fence key from its reads
// to its EXEC. A RaiseFence by another client landing between the two (after the check passed) makes EXEC
// fail; the batch is checked again and refused as a whole (ErrFenced), nothing written.
func TestLayout2FenceRaisedMidBatch(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	c := srv.Client(t)
	r, err := NewRedisIndex(c, RedisConfig{IndexLayout: 2})
	if err != nil {
		t.Fatal(err)
	}
	other, _ := NewRedisIndex(srv.Client(t), RedisConfig{IndexLayout: 2})
	if err := r.RaiseFence(ctx, "m", Fence{Scope: "a", Token: 1}); err != nil {
		t.Fatal(err)
	}
	f := &Fence{Scope: "a", Token: 1}
	calls := 0
	err = r.round(ctx, "apply", "m", f, nil, func(p redis.Pipeliner) int {
		calls++
		if calls == 1 { // the check passed; a new holder raises the fence before this batch's EXEC
			if err := other.RaiseFence(ctx, "m", Fence{Scope: "a", Token: 2}); err != nil {
				t.Fatal(err)
			}
		}
		p.HSet(ctx, r.v2Hash("m", 7, "a"), keyField(42), "\x01")
		return 1
	})
	if !errors.Is(err, ErrFenced) {
		t.Fatalf("batch after a raise mid-batch: %v, want ErrFenced", err)
	}
	if calls != 1 {
		t.Fatalf("writes built %d times, want 1 (the second check refuses before building them)", calls)
	}
	if n := c.Exists(ctx, r.v2Hash("m", 7, "a")).Val(); n != 0 {
		t.Fatal("the refused batch was written")
	}
	// The current holder's batch passes.
	if err := r.round(ctx, "apply", "m", &Fence{Scope: "a", Token: 2}, nil, func(p redis.Pipeliner) int {
		p.HSet(ctx, r.v2Hash("m", 7, "a"), keyField(42), "\x01")
		return 1
	}); err != nil {
		t.Fatal(err)
	}
	if n := c.HLen(ctx, r.v2Hash("m", 7, "a")).Val(); n != 1 {
		t.Fatalf("current holder's batch: %d fields", n)
	}
}
