// Package kvstore holds kvgate's shared state: the KV block index (which endpoint holds which prompt
// blocks, on which tier), block keys, and capacity reservations (leases), on two backends behind the same
// interfaces: in memory (one gateway) and Redis (many gateways). Engine KV events are decoded and ingested
// by kvstore/kvevents.
//
// Block keys come from Hasher. The index is NewMemoryIndex or NewRedisIndex, reservations
// NewMemoryReservations or NewRedisReservations; Blobs and Leases hold shared policy blobs and fenced
// named leases; OpenStore builds all of them from a StoreConfig. Both backends pass the same suite
// (kvstore/conformance). Errors are the sentinels in errors.go, wrapped with "kvstore: op" context.
// Design notes and the Redis key layout: RATIONALE.md.
package kvstore

import (
	"context"
	"errors"
	"time"
)

// BlockKey is kvgate's own 64-bit chained key of one full block of prompt tokens (see Hasher). It is not the
// engine's block hash; ingestion maps engine hashes to block keys per endpoint.
type BlockKey uint64

// EndpointID names one engine replica (one vLLM/SGLang server or data-parallel rank), unique across models.
type EndpointID string

// Tier says where an endpoint holds a block.
type Tier uint8

const (
	// TierGPU is device memory (vLLM medium "GPU").
	TierGPU Tier = 1
	// TierCPU is offloaded host memory (vLLM medium "CPU", SGLang "CPU_PINNED").
	TierCPU Tier = 2
)

// String returns "GPU" or "CPU" (the medium names on the wire), or "unknown".
func (t Tier) String() string {
	switch t {
	case TierGPU:
		return "GPU"
	case TierCPU:
		return "CPU"
	}
	return "unknown"
}

// ExtraKeys are folded into block keys as vLLM folds extra keys into its block hashes: the LoRA adapter name
// into every block, the cache salt into the first block only. Empty strings fold in nothing.
type ExtraKeys struct {
	LoRA      string
	CacheSalt string
}

// EndpointMatch is one endpoint's prefix match for a prompt: the longest run of consecutive blocks from block
// 0 that it holds, split into blocks held on GPU and blocks held only on CPU. GPUBlocks+CPUBlocks is the run
// length in blocks.
type EndpointMatch struct {
	Endpoint  EndpointID
	GPUBlocks int
	CPUBlocks int
}

// Index is the KV block index of one store. Implementations are safe for concurrent use.
type Index interface {
	// Match returns, for every endpoint holding at least block 0 of keys under model, its prefix match
	// (confirmed and speculative entries both count, speculative as GPU). Endpoints with no match are
	// omitted. The order of the result is unspecified. On remote backends a prompt whose block 0 nobody
	// holds costs one lookup and one round trip; otherwise at most two round trips.
	Match(ctx context.Context, model string, keys []BlockKey) ([]EndpointMatch, error)
	// Record writes speculative entries: ep is assumed to hold keys on GPU for ttl (the gateway records what
	// it just routed so a burst of siblings sticks together before the engine's events arrive).
	Record(ctx context.Context, model string, ep EndpointID, keys []BlockKey, ttl time.Duration) error
	// Add marks keys as held by ep on tier (an engine's BlockStored).
	Add(ctx context.Context, model string, ep EndpointID, tier Tier, keys []BlockKey) error
	// Remove drops ep's hold of keys on tier (an engine's BlockRemoved). Unknown keys are ignored.
	Remove(ctx context.Context, model string, ep EndpointID, tier Tier, keys []BlockKey) error
	// ClearEndpoint drops every entry of ep under model, confirmed and speculative, at a cost proportional
	// to ep's own entries (an endpoint removed from the fleet).
	ClearEndpoint(ctx context.Context, model string, ep EndpointID) error
	// ClearConfirmed drops ep's confirmed entries under model (both tiers: everything Add wrote) and keeps
	// its live speculative entries (Record) that expire within ClearKeepsHoldsWithin of now, at a cost
	// proportional to ep's own entries. Ingestion calls it whenever it must forget what an engine reported
	// (a new ingester taking over the endpoint, AllBlocksCleared, an engine restart, lost events): short
	// speculative entries are the gateways' record of what they just routed, not the engine's, and expire
	// on their own TTL. Longer holds (a routed hit's refresh, Demote's unconfirmed entries) stand for what
	// the engine held before, so they go too.
	ClearConfirmed(ctx context.Context, model string, ep EndpointID) error
	// Apply applies updates of one model in order, with the same effect as calling Add and Remove one by
	// one, but on remote backends in one round trip (Redis: one pipelined script per update). Ingestion
	// applies a whole event batch at once this way. A validation error (tier, names) is returned before
	// anything is applied; a store error may leave a prefix of the updates applied, and re-applying the
	// same updates is safe (set semantics).
	Apply(ctx context.Context, model string, updates []Update) error
}

// ClearKeepsHoldsWithin bounds the speculative holds ClearConfirmed keeps: those expiring at most this long
// after the clear (the router's speculative_ttl is 2 s; the shared records of a Redis store are at most
// DefaultSharedRecordMaxTTL, the same 30 s). Holds that last longer are a routed hit's refresh or a demoted
// entry (index_unconfirmed_ttl, 5 min): what the engine held before, which its clear says is gone.
// RATIONALE.md, "Why does ingestion clear only confirmed entries (ClearConfirmed)?".
const ClearKeepsHoldsWithin = 30 * time.Second

// Demoter is implemented by both index backends (an optional interface beside Index, like Batcher).
type Demoter interface {
	// Demote turns every confirmed entry of ep under model (both tiers) into an unconfirmed one: a
	// speculative hold, counted by Match as GPU, that expires ttl from now (or later, when a live hold
	// already lasts longer) unless Add confirms the block again; live speculative entries stay as they are.
	// Ingestion calls it when it can no longer vouch for what an engine reported (an ingester taking over
	// without the engine-hash map, lost events its replay cannot cover) but has no evidence that the engine
	// dropped the blocks: they keep their score until they age out. Cost proportional to ep's confirmed
	// entries. ttl must be positive (ErrInvalidArgument).
	Demote(ctx context.Context, model string, ep EndpointID, ttl time.Duration) error
}

var (
	_ Demoter = (*MemoryIndex)(nil)
	_ Demoter = (*RedisIndex)(nil)
)

// Limits cap one endpoint's in-flight work; they come from config and travel with each Reserve call.
// Zero means unlimited.
type Limits struct {
	MaxRequests int64
	MaxTokens   int64
}

// Cost is what one request claims of an endpoint's capacity: requests (usually 1) and tokens (prompt plus
// expected output tokens).
type Cost struct {
	Requests int64
	Tokens   int64
}

// Candidate is one endpoint offered to Reserve, in ranked order, with its limits.
type Candidate struct {
	Endpoint EndpointID
	Limits   Limits
}

// Lease is a counted claim on one endpoint's capacity, held until Release or until it expires on the store's
// clock.
type Lease struct {
	ID       string
	Endpoint EndpointID
	Cost     Cost
	// Expires is when the lease stops counting unless renewed (store clock, as last seen).
	Expires time.Time
}

// ErrNoCapacity is returned by Reserve when every candidate is at one of its limits.
var ErrNoCapacity = errors.New("kvstore: no candidate endpoint has capacity")

// Reservations leases endpoint capacity atomically. Implementations are safe for concurrent use, and on
// Redis every call is one Lua script (one round trip).
type Reservations interface {
	// Reserve leases cost on the first candidate, in order, that stays within its limits with it; it returns
	// ErrNoCapacity when none does. Choice and claim are one atomic step.
	Reserve(ctx context.Context, ranked []Candidate, cost Cost, ttl time.Duration) (Lease, error)
	// Renew extends a live lease by ttl from now; it fails if the lease has expired or was released.
	Renew(ctx context.Context, l Lease, ttl time.Duration) (Lease, error)
	// Release ends a lease; releasing twice or after expiry is not an error.
	Release(ctx context.Context, l Lease) error
	// InFlight returns the live leased cost per endpoint (endpoints with nothing in flight may be omitted).
	InFlight(ctx context.Context, eps []EndpointID) (map[EndpointID]Cost, error)
}
