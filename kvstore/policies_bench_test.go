package kvstore_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// BenchmarkPolicies measures the fleet-state scripts a gateway runs: ReadFleet (every reconcile, 500 ms, and
// every admin operation), an Activate + Rollback pair (the admin API's two writes), and ReportServing (every
// reconcile). The store holds 4 models with 8-entry stacks and 3 modules of 2.6 MB (the built-in's size).
func BenchmarkPolicies(b *testing.B) {
	ctx := context.Background()
	stores := map[string]*kvstore.Store{"memory": func() *kvstore.Store {
		s, _ := kvstore.OpenStore(ctx, kvstore.StoreConfig{Kind: "memory"})
		return s
	}()}
	if !testing.Short() {
		srv := redistest.Start(b)
		s, err := kvstore.OpenStore(ctx, kvstore.StoreConfig{Kind: "redis", Addrs: []string{srv.Addr}, Prefix: freshPrefix()})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		stores["redis"] = s
	}
	for _, kind := range []string{"memory", "redis"} {
		s := stores[kind]
		if s == nil {
			continue
		}
		data := make([]byte, 2_600_000)
		for i := range 3 {
			data[0] = byte(i)
			if err := s.Blobs.PutBlob(ctx, fmt.Sprintf("p%d@%d", i, i), sha(data), data); err != nil {
				b.Fatal(err)
			}
		}
		for m := range 4 {
			model := fmt.Sprintf("m%d", m)
			if _, err := s.Policies.SeedStack(ctx, model, kvstore.PolicyEntry{Version: "builtin@0", Config: []byte(`{"imbalance_threshold":8}`)}, false); err != nil {
				b.Fatal(err)
			}
			for e := range 7 {
				if _, err := s.Policies.Activate(ctx, model, kvstore.PolicyEntry{Version: fmt.Sprintf("p%d@%d", e%3, e%3), Config: []byte(`{}`)},
					kvstore.ActivateOptions{NeedBlob: true}); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.Run(kind+"/ReadFleet", func(b *testing.B) {
			for b.Loop() {
				if _, err := s.Policies.ReadFleet(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(kind+"/ActivateRollback", func(b *testing.B) {
			e := kvstore.PolicyEntry{Version: "p1@1", Config: []byte(`{"k":1}`)}
			for b.Loop() {
				if _, err := s.Policies.Activate(ctx, "m0", e, kvstore.ActivateOptions{NeedBlob: true}); err != nil {
					b.Fatal(err)
				}
				if _, err := s.Policies.Rollback(ctx, "m0", ""); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(kind+"/ReportServing", func(b *testing.B) {
			rep := []byte(`{"gateway":"gw","models":{"m0":{"serving":"p1@1","want":"p1@1"}}}`)
			for b.Loop() {
				if err := s.Policies.ReportServing(ctx, "gw", rep, 3*time.Second); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
