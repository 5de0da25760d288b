// Package kvevents is kvgate's one codec for engine KV-cache events (vLLM and SGLang `KVEventBatch`es as
// published on their ZMQ PUB socket) and the per-endpoint ingestion that applies them to a kvstore.Index.
//
// # Codec
//
// Types mirror vLLM's vllm/distributed/kv_events.py (BlockStored, BlockRemoved, AllBlocksCleared inside an
// EventBatch). Encode writes every wire layout kvgate knows (see Layout) in either hash form (see HashForm),
// byte for byte as msgspec / msgpack-python emit them; Decode accepts all of them without being told which:
// array or map batches, array-like or tagged-map events, hashes as msgpack ints of any width and sign (cast
// to uint64) or as byte strings (last 8 bytes, big-endian). Bad input yields a *DecodeError wrapping one of
// ErrMalformed, ErrWrongType or ErrTooLarge, never a panic; events with unknown tags are skipped and counted
// in EventBatch.Skipped.
//
// # Ingestion
//
// An Ingester subscribes to one endpoint's publisher (frames [topic, seq as 8-byte big-endian, payload]),
// decodes each batch and applies it, in order, to a kvstore.Index under kvgate's own block keys
// (kvstore.Hasher over the event's token IDs), keeping a reference-counted engine-hash → block-key map per
// endpoint. A batch's index updates go out in one kvstore.Batcher.Apply; messages that queue up while the
// index is busy are committed together. Sequence gaps are repaired through the publisher's replay ROUTER
// socket when one is configured, else the endpoint's confirmed entries are dropped (Index.ClearConfirmed:
// the gateways' speculative entries stay); see RATIONALE.md.
package kvevents
