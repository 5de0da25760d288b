package conformance

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore"
)

// StoreFactory returns a new, empty store for one subtest.
type StoreFactory func(t *testing.T) *kvstore.Store

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// RunBlobsAndLeases runs the Blobs, Leases, Policies and Endpoints conformance suites against stores made by newStore.
func RunBlobsAndLeases(t *testing.T, newStore StoreFactory) {
	ctx := context.Background()
	t.Run("Policies", func(t *testing.T) { RunPolicies(t, newStore) })
	t.Run("Endpoints", func(t *testing.T) { RunEndpoints(t, newStore) })
	t.Run("Blobs", func(t *testing.T) {
		s := newStore(t)
		b := s.Blobs
		if err := s.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ch := b.Subscribe(sctx)
		wasm := []byte("\x00asm\x01\x00\x00\x00 policy v1")
		if err := b.PutBlob(ctx, "prefix-v1", digest(wasm), wasm); err != nil {
			t.Fatal(err)
		}
		if err := b.PutBlob(ctx, "bad", digest([]byte("other")), wasm); !errors.Is(err, kvstore.ErrDigestMismatch) {
			t.Fatalf("digest mismatch: %v", err)
		}
		if err := b.PutBlob(ctx, "", digest(wasm), wasm); !errors.Is(err, kvstore.ErrInvalidArgument) {
			t.Fatalf("empty name: %v", err)
		}
		if err := b.PutBlob(ctx, "empty", digest(nil), nil); err != nil {
			t.Fatal(err)
		}
		sha, data, err := b.GetBlob(ctx, "prefix-v1")
		if err != nil || sha != digest(wasm) || string(data) != string(wasm) {
			t.Fatalf("get: %s %q %v", sha, data, err)
		}
		if _, _, err := b.GetBlob(ctx, "missing"); !errors.Is(err, kvstore.ErrNotFound) {
			t.Fatalf("missing blob: %v", err)
		}
		list, err := b.ListBlobs(ctx)
		if err != nil || len(list) != 2 || list[0] != (kvstore.BlobInfo{Name: "empty", SHA256: digest(nil), Size: 0}) ||
			list[1] != (kvstore.BlobInfo{Name: "prefix-v1", SHA256: digest(wasm), Size: len(wasm)}) {
			t.Fatalf("list: %+v %v", list, err)
		}
		if _, err := b.GetActive(ctx, "m"); !errors.Is(err, kvstore.ErrNotFound) {
			t.Fatalf("active before set: %v", err)
		}
		if all, err := b.ListActive(ctx); err != nil || all == nil || len(all) != 0 {
			t.Fatalf("list active before set: %v %v", all, err)
		}
		if err := b.SetActive(ctx, "m", []byte(`{"policy":"prefix-v1"}`)); err != nil {
			t.Fatal(err)
		}
		if v, err := b.GetActive(ctx, "m"); err != nil || string(v) != `{"policy":"prefix-v1"}` {
			t.Fatalf("active: %q %v", v, err)
		}
		if err := b.SetActive(ctx, "m2", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		if all, err := b.ListActive(ctx); err != nil || len(all) != 2 || string(all["m"]) != `{"policy":"prefix-v1"}` ||
			string(all["m2"]) != `{}` {
			t.Fatalf("list active: %q %v", all, err)
		}

		// Delete: gone from Get and List, a second delete and an unknown name are ErrNotFound (and notify
		// nothing: the notifications below would be out of order), the name can be put again.
		if err := b.DeleteBlob(ctx, "missing"); !errors.Is(err, kvstore.ErrNotFound) {
			t.Fatalf("delete of a missing blob: %v", err)
		}
		if err := b.DeleteBlob(ctx, ""); !errors.Is(err, kvstore.ErrInvalidArgument) {
			t.Fatalf("delete with an empty name: %v", err)
		}
		if err := b.DeleteBlob(ctx, "prefix-v1"); err != nil {
			t.Fatal(err)
		}
		if _, _, err := b.GetBlob(ctx, "prefix-v1"); !errors.Is(err, kvstore.ErrNotFound) {
			t.Fatalf("get after delete: %v", err)
		}
		if list, err := b.ListBlobs(ctx); err != nil || len(list) != 1 || list[0].Name != "empty" {
			t.Fatalf("list after delete: %+v %v", list, err)
		}
		if err := b.DeleteBlob(ctx, "prefix-v1"); !errors.Is(err, kvstore.ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}
		if v, err := b.GetActive(ctx, "m"); err != nil || string(v) != `{"policy":"prefix-v1"}` {
			t.Fatalf("active value after deleting the blob it names: %q %v", v, err)
		}
		wasm2 := []byte("\x00asm\x01\x00\x00\x00 policy v1, again")
		if err := b.PutBlob(ctx, "prefix-v1", digest(wasm2), wasm2); err != nil {
			t.Fatal(err)
		}
		if sha, data, err := b.GetBlob(ctx, "prefix-v1"); err != nil || sha != digest(wasm2) || string(data) != string(wasm2) {
			t.Fatalf("get after put again: %s %q %v", sha, data, err)
		}
		if err := b.DeleteBlob(ctx, "empty"); err != nil {
			t.Fatal(err)
		}
		if list, err := b.ListBlobs(ctx); err != nil || len(list) != 1 ||
			list[0] != (kvstore.BlobInfo{Name: "prefix-v1", SHA256: digest(wasm2), Size: len(wasm2)}) {
			t.Fatalf("list after put again: %+v %v", list, err)
		}
		// One notification per change. Their order is not part of the contract: on Redis Cluster a PUBLISH
		// goes to any node and reaches the subscriber's node over the cluster bus, so two changes in a row can
		// be announced in either order (seen here). A failed put or delete announces nothing: an extra
		// notification would take the place of one of these.
		want := []string{"active:m", "active:m2", "blob:empty", "blob:empty", "blob:prefix-v1", "blob:prefix-v1", "blob:prefix-v1"}
		var got []string
		for len(got) < len(want) {
			select {
			case n := <-ch:
				got = append(got, n)
			case <-time.After(5 * time.Second):
				t.Fatalf("notifications %q, want %q in any order", got, want)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("notifications %q, want %q in any order", got, want)
		}
		cancel()
		for range ch { // closed after cancel
		}
	})
	t.Run("Leases", func(t *testing.T) {
		s := newStore(t)
		l := s.Leases
		tok1, ok, err := l.AcquireLease(ctx, "ingest/ep-1", "gw-a", 300*time.Millisecond)
		if err != nil || !ok || tok1 <= 0 {
			t.Fatalf("acquire: %d %v %v", tok1, ok, err)
		}
		if _, ok, err := l.AcquireLease(ctx, "ingest/ep-1", "gw-b", time.Second); err != nil || ok {
			t.Fatalf("second holder got the lease: %v %v", ok, err)
		}
		if tok, ok, err := l.AcquireLease(ctx, "ingest/ep-1", "gw-a", 300*time.Millisecond); err != nil || !ok || tok != tok1 {
			t.Fatalf("re-acquire by holder: %d %v %v", tok, ok, err)
		}
		if ok, err := l.RenewLease(ctx, "ingest/ep-1", "gw-a", tok1, 300*time.Millisecond); err != nil || !ok {
			t.Fatalf("renew: %v %v", ok, err)
		}
		if ok, _ := l.RenewLease(ctx, "ingest/ep-1", "gw-b", tok1, time.Second); ok {
			t.Fatal("renew by another holder succeeded")
		}
		if ok, _ := l.RenewLease(ctx, "ingest/ep-1", "gw-a", tok1+1, time.Second); ok {
			t.Fatal("renew with a wrong token succeeded")
		}
		time.Sleep(450 * time.Millisecond)
		// Expired: another holder takes it with a larger fencing token; the stale holder cannot renew.
		tok2, ok, err := l.AcquireLease(ctx, "ingest/ep-1", "gw-b", time.Minute)
		if err != nil || !ok || tok2 <= tok1 {
			t.Fatalf("acquire after expiry: %d (old %d) %v %v", tok2, tok1, ok, err)
		}
		if ok, _ := l.RenewLease(ctx, "ingest/ep-1", "gw-a", tok1, time.Second); ok {
			t.Fatal("stale holder renewed")
		}
		if err := l.ReleaseLease(ctx, "ingest/ep-1", "gw-a", tok1); err != nil { // stale: no effect
			t.Fatal(err)
		}
		if _, ok, _ := l.AcquireLease(ctx, "ingest/ep-1", "gw-c", time.Second); ok {
			t.Fatal("stale release freed the lease")
		}
		if err := l.ReleaseLease(ctx, "ingest/ep-1", "gw-b", tok2); err != nil {
			t.Fatal(err)
		}
		tok3, ok, err := l.AcquireLease(ctx, "ingest/ep-1", "gw-c", time.Second)
		if err != nil || !ok || tok3 <= tok2 {
			t.Fatalf("acquire after release: %d %v %v", tok3, ok, err)
		}
		if _, _, err := l.AcquireLease(ctx, "", "gw", time.Second); !errors.Is(err, kvstore.ErrInvalidArgument) {
			t.Fatalf("empty name: %v", err)
		}
		if _, _, err := l.AcquireLease(ctx, "x", "gw", 0); !errors.Is(err, kvstore.ErrInvalidArgument) {
			t.Fatalf("zero ttl: %v", err)
		}
	})
}
