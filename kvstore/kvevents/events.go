package kvevents

import "fmt"

// EngineHash is an engine's block hash as carried in events, reduced to 64 bits: a msgpack int of any width
// or sign cast to uint64, or a byte-string digest's last 8 bytes read big-endian (vLLM's
// maybe_convert_block_hash). It is the engine's identity for a block, not kvgate's kvstore.BlockKey.
type EngineHash uint64

// Event is one KV-cache event: BlockStored, BlockRemoved or AllBlocksCleared (a closed set).
type Event interface {
	// Type returns the event's tag as on the wire ("BlockStored", "BlockRemoved", "AllBlocksCleared").
	Type() string
	isEvent()
}

// Wire tags of the three event types (msgspec tag = class name).
const (
	TagBlockStored      = "BlockStored"
	TagBlockRemoved     = "BlockRemoved"
	TagAllBlocksCleared = "AllBlocksCleared"
)

// ExtraKey is one block's extra-keys tuple as vLLM sends it in BlockStored.extra_keys (LoRA name, multimodal
// identifiers, cache salt, ...). Elements are string, []byte, int64, uint64, float64, bool, nil or []any.
// A nil ExtraKey is Python None (the block has no extra keys).
type ExtraKey []any

// BlockStored mirrors vLLM's BlockStored (and SGLang's, one page per event): blocks that became full and
// cached on an endpoint, in chain order. Field order on the wire is the declaration order here up to
// KVCacheSpecSlidingWindow.
type BlockStored struct {
	// BlockHashes are the engine's hashes of the stored blocks, first to last.
	BlockHashes []EngineHash
	// RawBlockHashes are the full digests behind BlockHashes when the hash form is bytes (vLLM with
	// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0): filled by Decode for byte-string hashes, required by Encode for
	// HashBytes. Nil otherwise.
	RawBlockHashes [][]byte
	// ParentBlockHash is the hash of the block before BlockHashes[0], nil when the run starts at block 0.
	ParentBlockHash *EngineHash
	// RawParentBlockHash is the parent's full digest in the bytes hash form (as RawBlockHashes).
	RawParentBlockHash []byte
	// TokenIDs are the tokens of all stored blocks, len(BlockHashes)*BlockSize of them for GPU stores; empty
	// for vLLM's CPU-offload placeholders.
	TokenIDs []uint32
	// BlockSize is tokens per block (0 in CPU-offload placeholders).
	BlockSize int
	// LoRAID is vLLM's deprecated numeric LoRA adapter ID (nil = no LoRA).
	LoRAID *int
	// Medium is the tier: "GPU", "CPU", SGLang's "CPU_PINNED", ...; "" is None on the wire.
	Medium string
	// LoRAName is the LoRA adapter name (vLLM ≥ #27577); "" is None on the wire.
	LoRAName string
	// ExtraKeys has one entry per block (vLLM ≥ #33304); nil is None on the wire.
	ExtraKeys []ExtraKey
	// GroupIdx is the KV-cache group (vLLM ≥ #37688), nil = None.
	GroupIdx *int
	// KVCacheSpecKind is "full_attention", "sliding_window", "mamba", ... (vLLM ≥ #40984); "" = None.
	KVCacheSpecKind string
	// KVCacheSpecSlidingWindow is the sliding window in tokens (vLLM ≥ #40984), nil = None.
	KVCacheSpecSlidingWindow *int
	// CacheSalt is SGLang's BlockStoredWithMetadata metadata.cache_salt (decoded only; never encoded).
	CacheSalt string
}

// BlockRemoved mirrors vLLM's BlockRemoved: blocks an endpoint evicted from Medium.
type BlockRemoved struct {
	// BlockHashes are the engine hashes of the removed blocks.
	BlockHashes []EngineHash
	// RawBlockHashes are the full digests in the bytes hash form (see BlockStored.RawBlockHashes).
	RawBlockHashes [][]byte
	// Medium is the tier the blocks left ("" = None, which vLLM v0.9 implies to be GPU).
	Medium string
	// GroupIdx is the KV-cache group, nil = None.
	GroupIdx *int
}

// AllBlocksCleared mirrors vLLM's AllBlocksCleared (BlockPool.reset_prefix_cache, SGLang reset()): the
// endpoint dropped its whole prefix cache.
type AllBlocksCleared struct{}

// Type implements Event.
func (BlockStored) Type() string { return TagBlockStored }

// Type implements Event.
func (BlockRemoved) Type() string { return TagBlockRemoved }

// Type implements Event.
func (AllBlocksCleared) Type() string { return TagAllBlocksCleared }

func (BlockStored) isEvent()      {}
func (BlockRemoved) isEvent()     {}
func (AllBlocksCleared) isEvent() {}

// EventBatch mirrors vLLM's KVEventBatch: the events of one scheduler step.
type EventBatch struct {
	// TS is the publisher's wall clock when the batch was built, seconds since the Unix epoch.
	TS float64
	// Events are the step's events in the order the engine produced them. Elements are BlockStored,
	// BlockRemoved or AllBlocksCleared values (not pointers).
	Events []Event
	// DataParallelRank is vLLM's data_parallel_rank / SGLang's attn_dp_rank; nil = None or absent.
	DataParallelRank *int
	// Skipped counts events Decode dropped because their tag is unknown (newer engines); ignored by Encode.
	Skipped int
}

// Layout names one wire layout of an EventBatch (which fields, arrays or maps).
type Layout int

// The layouts Encode writes. Decode needs no layout: it accepts all of them.
const (
	// LayoutV090 is vLLM v0.9.0 (#16750): a 2-element batch [ts, events]; BlockStored has 6 elements (no
	// medium), BlockRemoved 2.
	LayoutV090 Layout = iota + 1
	// LayoutV011 is vLLM v0.11 (#19737): batch [ts, events, dp_rank]; BlockStored 7 elements (+medium),
	// BlockRemoved 3.
	LayoutV011
	// LayoutLoRAName adds lora_name (#27577): BlockStored 8 elements.
	LayoutLoRAName
	// LayoutArrayLast is the last array-like layout (vLLM ≤ 0.23): BlockStored 12 elements (+extra_keys,
	// group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window), BlockRemoved 4 (+group_idx).
	LayoutArrayLast
	// LayoutMap is vLLM ≥ 0.24 (#42892): events are tagged maps {"type": tag, field: value} with defaulted
	// fields omitted when they hold their default; the batch stays an array.
	LayoutMap
	// LayoutMapBatch is LayoutMap events inside a map-encoded batch {"ts", "events", "data_parallel_rank"}
	// (one stored vLLM version; data_parallel_rank omitted when nil).
	LayoutMapBatch
	// LayoutSGLang is SGLang's array layout with medium: batch [ts, events, attn_dp_rank], BlockStored 7
	// elements, BlockRemoved 3 (same shape as LayoutV011; SGLang sends one page per BlockStored).
	LayoutSGLang
)

var layoutNames = map[Layout]string{
	LayoutV090:      "vllm/array_v0_9_0",
	LayoutV011:      "vllm/array_v0_11",
	LayoutLoRAName:  "vllm/array_lora_name",
	LayoutArrayLast: "vllm/array_last",
	LayoutMap:       "vllm/map",
	LayoutMapBatch:  "vllm/map_batch",
	LayoutSGLang:    "sglang/array_medium",
}

// Layouts lists every Layout, oldest first.
var Layouts = []Layout{LayoutV090, LayoutV011, LayoutLoRAName, LayoutArrayLast, LayoutMap, LayoutMapBatch, LayoutSGLang}

// String returns the layout's name as used in the reference goldens ("vllm/array_v0_11", ...).
func (l Layout) String() string {
	if s, ok := layoutNames[l]; ok {
		return s
	}
	return fmt.Sprintf("Layout(%d)", int(l))
}

// ParseLayout returns the layout named s (as Layout.String prints it).
func ParseLayout(s string) (Layout, error) {
	for l, n := range layoutNames {
		if n == s {
			return l, nil
		}
	}
	return 0, fmt.Errorf("kvevents: unknown layout %q", s)
}

// HashForm says how Encode writes block hashes.
type HashForm int

const (
	// HashUint writes hashes as unsigned msgpack ints of the narrowest width (vLLM's default,
	// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1).
	HashUint HashForm = iota + 1
	// HashInt64 writes hashes as signed 64-bit values of the narrowest width, so values ≥ 2^63 go out
	// negative (SGLang's hash_str_to_int64, vLLM's old builtin hash()).
	HashInt64
	// HashBytes writes each hash's raw digest as a msgpack bin (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0); the
	// Raw* fields must be set.
	HashBytes
)

// String returns "int", "int64" or "bytes".
func (f HashForm) String() string {
	switch f {
	case HashUint:
		return "int"
	case HashInt64:
		return "int64"
	case HashBytes:
		return "bytes"
	}
	return fmt.Sprintf("HashForm(%d)", int(f))
}

// HashFromDigest reduces a digest to its EngineHash: its last 8 bytes read big-endian (fewer bytes are read
// as a shorter big-endian number), as vLLM's maybe_convert_block_hash does.
func HashFromDigest(d []byte) EngineHash {
	if len(d) > 8 {
		d = d[len(d)-8:]
	}
	var v uint64
	for _, b := range d {
		v = v<<8 | uint64(b)
	}
	return EngineHash(v)
}
