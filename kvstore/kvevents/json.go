package kvevents

import (
	"encoding/hex"
	"encoding/json"
)

// The JSON forms below are what `kvgate kv decode` prints: event type names as on the wire, field names as
// in vLLM's structs, hashes as decimal unsigned 64-bit numbers, raw digests (bytes hash form) as hex.

type batchJSON struct {
	TS               float64 `json:"ts"`
	Events           []Event `json:"events"`
	DataParallelRank *int    `json:"data_parallel_rank"`
	SkippedEvents    int     `json:"skipped_events,omitempty"`
}

type storedJSON struct {
	Type                     string       `json:"type"`
	BlockHashes              []EngineHash `json:"block_hashes"`
	BlockHashesHex           []string     `json:"block_hashes_hex,omitempty"`
	ParentBlockHash          *EngineHash  `json:"parent_block_hash"`
	ParentBlockHashHex       string       `json:"parent_block_hash_hex,omitempty"`
	TokenIDs                 []uint32     `json:"token_ids"`
	BlockSize                int          `json:"block_size"`
	LoRAID                   *int         `json:"lora_id"`
	Medium                   *string      `json:"medium"`
	LoRAName                 *string      `json:"lora_name"`
	ExtraKeys                []ExtraKey   `json:"extra_keys,omitempty"`
	GroupIdx                 *int         `json:"group_idx,omitempty"`
	KVCacheSpecKind          string       `json:"kv_cache_spec_kind,omitempty"`
	KVCacheSpecSlidingWindow *int         `json:"kv_cache_spec_sliding_window,omitempty"`
	CacheSalt                string       `json:"cache_salt,omitempty"`
}

type removedJSON struct {
	Type           string       `json:"type"`
	BlockHashes    []EngineHash `json:"block_hashes"`
	BlockHashesHex []string     `json:"block_hashes_hex,omitempty"`
	Medium         *string      `json:"medium"`
	GroupIdx       *int         `json:"group_idx,omitempty"`
}

func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func hexes(raw [][]byte) []string {
	if raw == nil {
		return nil
	}
	out := make([]string, len(raw))
	for i, r := range raw {
		out[i] = hex.EncodeToString(r)
	}
	return out
}

// MarshalJSON renders the batch as {"ts", "events", "data_parallel_rank", "skipped_events"}.
func (b EventBatch) MarshalJSON() ([]byte, error) {
	evs := b.Events
	if evs == nil {
		evs = []Event{}
	}
	return json.Marshal(batchJSON{TS: b.TS, Events: evs, DataParallelRank: b.DataParallelRank, SkippedEvents: b.Skipped})
}

// MarshalJSON renders the event with vLLM's field names and "type": "BlockStored"; token_ids is always a
// list, None fields are null.
func (s BlockStored) MarshalJSON() ([]byte, error) {
	toks := s.TokenIDs
	if toks == nil {
		toks = []uint32{}
	}
	hs := s.BlockHashes
	if hs == nil {
		hs = []EngineHash{}
	}
	return json.Marshal(storedJSON{
		Type: TagBlockStored, BlockHashes: hs, BlockHashesHex: hexes(s.RawBlockHashes),
		ParentBlockHash: s.ParentBlockHash, ParentBlockHashHex: hex.EncodeToString(s.RawParentBlockHash),
		TokenIDs: toks, BlockSize: s.BlockSize, LoRAID: s.LoRAID, Medium: optString(s.Medium),
		LoRAName: optString(s.LoRAName), ExtraKeys: s.ExtraKeys, GroupIdx: s.GroupIdx,
		KVCacheSpecKind: s.KVCacheSpecKind, KVCacheSpecSlidingWindow: s.KVCacheSpecSlidingWindow, CacheSalt: s.CacheSalt,
	})
}

// MarshalJSON renders the event as {"type": "BlockRemoved", "block_hashes", "medium"}.
func (r BlockRemoved) MarshalJSON() ([]byte, error) {
	hs := r.BlockHashes
	if hs == nil {
		hs = []EngineHash{}
	}
	return json.Marshal(removedJSON{Type: TagBlockRemoved, BlockHashes: hs, BlockHashesHex: hexes(r.RawBlockHashes),
		Medium: optString(r.Medium), GroupIdx: r.GroupIdx})
}

// MarshalJSON renders {"type": "AllBlocksCleared"}.
func (AllBlocksCleared) MarshalJSON() ([]byte, error) {
	return []byte(`{"type":"AllBlocksCleared"}`), nil
}
