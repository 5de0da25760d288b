package kvstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/conformance"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

func TestMemoryStoreBlobsAndLeases(t *testing.T) {
	conformance.RunBlobsAndLeases(t, func(t *testing.T) *kvstore.Store {
		s, err := kvstore.OpenStore(context.Background(), kvstore.StoreConfig{Kind: "memory"})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestRedisStoreBlobsAndLeases(t *testing.T) {
	srv := redistest.Start(t)
	conformance.RunBlobsAndLeases(t, func(t *testing.T) *kvstore.Store {
		s, err := kvstore.OpenStore(context.Background(), kvstore.StoreConfig{Kind: "redis", Addrs: []string{srv.Addr}, Prefix: freshPrefix()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

func TestOpenStoreErrors(t *testing.T) {
	t.Parallel() // waits on its own redis-server only; no TTL or latency bound
	ctx := context.Background()
	for _, cfg := range []kvstore.StoreConfig{
		{Kind: "etcd"},
		{Kind: "redis"},
		{Kind: "redis", Addrs: []string{"a:1", "b:2"}},
		{Kind: "redis", Addrs: []string{"a:1"}, Prefix: "x{"},
	} {
		if _, err := kvstore.OpenStore(ctx, cfg); !errors.Is(err, kvstore.ErrInvalidArgument) {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
	// Unreachable Redis: an error, not a hang past the context.
	srv := redistest.Start(t)
	addr := srv.Addr
	srv.Stop()
	if _, err := kvstore.OpenStore(ctx, kvstore.StoreConfig{Kind: "redis", Addrs: []string{addr}}); err == nil {
		t.Fatal("open of a stopped redis succeeded")
	}
	// A store survives a Redis restart: Ping recovers once the server is back.
	srv.Restart()
	s, err := kvstore.OpenStore(ctx, kvstore.StoreConfig{Kind: "redis", Addrs: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	srv.Restart()
	if err := s.Ping(ctx); err != nil {
		// the first command after a restart may see the dropped connection; the next one reconnects
		if err := s.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
