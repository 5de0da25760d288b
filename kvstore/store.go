package kvstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// StoreConfig selects and configures a Store (config `store:`).
type StoreConfig struct {
	// Kind is "memory" (one gateway; the default when empty) or "redis" (shared by many gateways).
	Kind string
	// Addrs are Redis addresses "host:port" (Kind redis). With Cluster, any subset of the cluster's nodes.
	Addrs []string
	// Cluster selects a Redis Cluster client.
	Cluster bool
	// Username, Password and DB are passed to the Redis client (DB must be 0 with Cluster).
	Username, Password string
	DB                 int
	// TLS, when set, connects to Redis over TLS.
	TLS *tls.Config
	// Prefix is RedisConfig.Prefix.
	Prefix string
	// IndexLayout is RedisConfig.IndexLayout (Redis only).
	IndexLayout int
	// MaxKeys bounds the memory index (MemoryConfig.MaxKeys).
	MaxKeys int
	// MaxKeysPerEndpoint bounds one endpoint's entries in either index (MemoryConfig.MaxKeysPerEndpoint,
	// RedisConfig.MaxEntriesPerEndpoint); 0: no bound.
	MaxKeysPerEndpoint int
	// Now is the memory backends' clock (nil means time.Now).
	Now func() time.Time
	// ReservationLayout selects the Redis reservations' key layout: 0 (ReservationLayoutFollow, the
	// default) follows the store's marker <Prefix>:v1:reservation-layout (LayoutRedisReservations: the
	// single {res} tag until the operator raises it, then one tag per endpoint), 1 the single tag only
	// (RedisReservations, the layout of older releases), 2 the sharded layout only
	// (ShardedRedisReservations: a fleet with no older gateway). kvstore/RATIONALE.md, "Reservations on
	// Redis Cluster".
	ReservationLayout int
	// AllowUnreachable makes OpenStore return a Redis store even when the first ping fails (Store.StartErr
	// says why); its calls fail until Redis answers, and the client connects by itself when it does.
	AllowUnreachable bool
}

// Store bundles the parts of one shared-state backend. Every field is safe for concurrent use.
type Store struct {
	// Kind is "memory" or "redis".
	Kind string
	// Index is the KV block index (MemoryIndex or RedisIndex).
	Index Index
	// Reservations leases endpoint capacity (MemoryReservations; on Redis LayoutRedisReservations,
	// RedisReservations or ShardedRedisReservations, by StoreConfig.ReservationLayout).
	Reservations Reservations
	// Blobs holds policy blobs and active values (MemoryBlobs or RedisBlobs).
	Blobs Blobs
	// Leases are fenced named leases, e.g. ingestion ownership (the same value as Blobs).
	Leases Leases
	// Policies is the fleet's policy state: activation stacks, unload, serving reports, re-seeding (the
	// same value as Blobs).
	Policies Policies
	// Endpoints is the fleet's run-time endpoint set (the same value as Blobs).
	Endpoints Endpoints
	// Redis is the underlying client (nil for memory), for health details and tests. Its command errors
	// are classified: ErrUnavailable when Redis cannot serve (RedisUnavailable).
	Redis redis.UniversalClient
	// Epoch is the Redis store's epoch marker and connection check (nil for memory): Guarded's Remote.
	Epoch *RedisEpoch
	// StartErr is the failed first ping of a store opened with StoreConfig.AllowUnreachable (nil: it answered).
	StartErr error
}

// OpenStore builds the Store cfg describes. For Redis it pings the server once, returning the error if
// Redis is unreachable within ctx (unless cfg.AllowUnreachable); the client reconnects by itself afterwards.
// Errors of a Redis that cannot serve are ErrUnavailable (ClassifyRedisErrors); on a standalone Redis every
// new connection is checked against the expected epoch (RedisEpoch).
// Redis calls honour their context's deadline (go-redis ContextTimeoutEnabled), so a caller's deadline
// bounds a call to a hung server. The client speaks RESP2 (Protocol 2): nothing here uses RESP3's push
// replies or client-side caching, and go-redis's RESP3 client checks for pushed messages before every
// command (RATIONALE.md, "The hot path": measured). Close releases it.
func OpenStore(ctx context.Context, cfg StoreConfig) (*Store, error) {
	switch cfg.Kind {
	case "", "memory":
		mb := NewMemoryBlobs(cfg.Now)
		return &Store{
			Kind:         "memory",
			Index:        NewMemoryIndex(MemoryConfig{MaxKeys: cfg.MaxKeys, MaxKeysPerEndpoint: cfg.MaxKeysPerEndpoint, Now: cfg.Now}),
			Reservations: NewMemoryReservations(cfg.Now),
			Blobs:        mb,
			Leases:       mb,
			Policies:     mb,
			Endpoints:    mb,
		}, nil
	case "redis":
	default:
		return nil, fmt.Errorf("kvstore: store kind %q (want memory or redis): %w", cfg.Kind, ErrInvalidArgument)
	}
	if len(cfg.Addrs) == 0 {
		return nil, fmt.Errorf("kvstore: redis store without addrs: %w", ErrInvalidArgument)
	}
	ep, err := NewRedisEpoch(nil, RedisConfig{Prefix: cfg.Prefix})
	if err != nil {
		return nil, err
	}
	var c redis.UniversalClient
	if cfg.Cluster {
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: cfg.Addrs, Username: cfg.Username, Password: cfg.Password,
			TLSConfig: cfg.TLS, ContextTimeoutEnabled: true, Protocol: 2})
	} else {
		if len(cfg.Addrs) != 1 {
			return nil, fmt.Errorf("kvstore: %d redis addrs without cluster: %w", len(cfg.Addrs), ErrInvalidArgument)
		}
		c = redis.NewClient(&redis.Options{Addr: cfg.Addrs[0], Username: cfg.Username, Password: cfg.Password, DB: cfg.DB,
			TLSConfig: cfg.TLS, ContextTimeoutEnabled: true, OnConnect: ep.checkConn, Protocol: 2})
	}
	ep.c = c
	ClassifyRedisErrors(c)
	rc := RedisConfig{Prefix: cfg.Prefix}
	idx, err1 := NewRedisIndex(c, RedisConfig{Prefix: cfg.Prefix, MaxEntriesPerEndpoint: cfg.MaxKeysPerEndpoint, IndexLayout: cfg.IndexLayout})
	var res Reservations
	var err2 error
	switch cfg.ReservationLayout {
	case ReservationLayoutFollow:
		res, err2 = NewLayoutRedisReservations(c, rc)
	case ReservationLayoutSingle:
		res, err2 = NewRedisReservations(c, rc)
	case ReservationLayoutSharded:
		res, err2 = NewShardedRedisReservations(c, rc)
	default:
		err2 = fmt.Errorf("kvstore: reservation layout %d (want 0, 1 or 2): %w", cfg.ReservationLayout, ErrInvalidArgument)
	}
	bl, err3 := NewRedisBlobs(c, rc)
	if err := errors.Join(err1, err2, err3); err != nil {
		_ = c.Close()
		return nil, err
	}
	s := &Store{Kind: "redis", Index: idx, Reservations: res, Blobs: bl, Leases: bl, Policies: bl, Endpoints: bl, Redis: c, Epoch: ep}
	if err := s.Ping(ctx); err != nil {
		if cfg.AllowUnreachable {
			s.StartErr = err
			return s, nil
		}
		_ = c.Close()
		return nil, err
	}
	return s, nil
}

// Ping reports whether the store is reachable (always nil for memory).
func (s *Store) Ping(ctx context.Context) error {
	if s.Redis == nil {
		return nil
	}
	if err := s.Redis.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("kvstore: redis ping: %w", err)
	}
	return nil
}

// Close releases the store's connections.
func (s *Store) Close() error {
	if s.Redis == nil {
		return nil
	}
	if ri, ok := s.Index.(*RedisIndex); ok {
		_ = ri.Close() // its subscription to the shared speculative records
	}
	if lr, ok := s.Reservations.(*LayoutRedisReservations); ok {
		_ = lr.Close() // its reads of the reservation-layout marker
	}
	return s.Redis.Close()
}
