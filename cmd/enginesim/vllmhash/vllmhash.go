// Package vllmhash reproduces engines' own prefix-cache block hashes, so the engine simulator (package
// sim, its only user outside tests) announces the hashes a real engine would, and the KV-event tests can
// build the values vLLM sends. The gateway does not use it: it keys blocks with its own hash
// (kvstore.Hasher) and learns engines' hashes from their KV events.
//
//   - vLLM v1's sha256_cbor (--prefix-caching-hash-algo sha256_cbor, vllm/v1/core/kv_cache_utils.py
//     hash_block_tokens with vllm/utils/hashing.py sha256_cbor): block i's digest is
//     SHA-256(canonical CBOR of [parent digest as bstr(32), [token IDs as uints], extra keys or null]),
//     parent(0) = NONE_HASH = SHA-256(CBOR text of the PYTHONHASHSEED string); the 64-bit value events carry
//     is the digest's last 8 bytes, big-endian (maybe_convert_block_hash).
//   - SGLang's page hash (mem_cache get_hash_str / hash_str_to_int64): SHA-256(prior digest ‖ LE32 tokens),
//     the event value being the first 8 bytes big-endian as a signed int64.
//
// Both are pinned by golden vectors produced with cbor2 + hashlib (kvstore/kvevents/testdata/golden.json and
// testdata/extra_golden.json). The canonical CBOR encoder
// here covers exactly the types these inputs use (bstr, uint, array, text, null). All functions are safe for
// concurrent use.
package vllmhash

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"

	"github.com/kvgate/kvgate/kvstore"
)

// Digest is one full SHA-256 block digest.
type Digest [32]byte

// EventHash returns the value vLLM puts in its events for d (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the
// default): the last 8 bytes read big-endian.
func (d Digest) EventHash() uint64 { return binary.BigEndian.Uint64(d[24:]) }

// SGLangEventHash returns the value SGLang puts in its events for a page digest: the first 8 bytes read
// big-endian, as a signed int64 (hash_str_to_int64).
func (d Digest) SGLangEventHash() int64 { return int64(binary.BigEndian.Uint64(d[:8])) }

// ErrBlockSize is returned for a block size below 1.
var ErrBlockSize = errors.New("vllmhash: block size must be at least 1")

// Hasher computes vLLM sha256_cbor block hashes for one PYTHONHASHSEED. Build it with New; the zero value
// is not usable. It is an immutable value.
type Hasher struct {
	none Digest
}

// New returns the Hasher of engines started with PYTHONHASHSEED=pythonHashSeed (the string as set in the
// environment, e.g. "0"). Engines without PYTHONHASHSEED use a random root and cannot be reproduced.
func New(pythonHashSeed string) Hasher {
	return Hasher{none: NoneHash(pythonHashSeed)}
}

// NoneHash returns vLLM's NONE_HASH for a PYTHONHASHSEED string: SHA-256 of its CBOR text encoding
// (init_none_hash hashes the string itself).
func NoneHash(pythonHashSeed string) Digest {
	return sha256.Sum256(appendText(nil, pythonHashSeed))
}

// NoneHash returns the chain root (the parent digest of block 0).
func (h Hasher) NoneHash() Digest { return h.none }

// BlockExtra returns the extra-keys tuple vLLM attaches to block i of a request (generate_block_hash_extra_keys):
// the LoRA name on every block, then the cache salt on block 0 only; nil (CBOR null) when empty. Multimodal and
// prompt-embeds keys are not supported.
func BlockExtra(i int, extra kvstore.ExtraKeys) []string {
	var out []string
	if extra.LoRA != "" {
		out = append(out, extra.LoRA)
	}
	if i == 0 && extra.CacheSalt != "" {
		out = append(out, extra.CacheSalt)
	}
	return out
}

// BlockHash returns one block's digest: SHA-256 over canonical CBOR [parent, tokens, extra] (extra nil or
// empty → null).
func BlockHash(parent Digest, tokens []uint32, extra []string) Digest {
	var stack [256]byte
	return sha256.Sum256(AppendBlockInput(stack[:0], parent, tokens, extra))
}

// AppendBlockInput appends the canonical CBOR that BlockHash digests (exposed for tests and debugging).
func AppendBlockInput(dst []byte, parent Digest, tokens []uint32, extra []string) []byte {
	dst = append(dst, 0x83, 0x58, 0x20) // array(3), bstr with 1-byte length 32
	dst = append(dst, parent[:]...)
	dst = appendHead(dst, 4, uint64(len(tokens)))
	for _, t := range tokens {
		dst = appendHead(dst, 0, uint64(t))
	}
	if len(extra) == 0 {
		return append(dst, 0xf6) // null
	}
	dst = appendHead(dst, 4, uint64(len(extra)))
	for _, s := range extra {
		dst = appendText(dst, s)
	}
	return dst
}

// Blocks returns the digests of the full blocks of tokens (a partial tail is not hashed), chained from
// NONE_HASH, with extra keys folded in as vLLM does (see BlockExtra).
func (h Hasher) Blocks(tokens []uint32, blockSize int, extra kvstore.ExtraKeys) ([]Digest, error) {
	if blockSize < 1 {
		return nil, ErrBlockSize
	}
	n := len(tokens) / blockSize
	out := make([]Digest, n)
	buf := make([]byte, 0, 3+32+5+9*blockSize+16+len(extra.LoRA)+len(extra.CacheSalt))
	parent := h.none
	for i := range n {
		buf = AppendBlockInput(buf[:0], parent, tokens[i*blockSize:(i+1)*blockSize], BlockExtra(i, extra))
		out[i] = sha256.Sum256(buf)
		parent = out[i]
	}
	return out, nil
}

// SGLangPages returns SGLang's chained page digests of the full pages of tokens (a partial tail is not
// hashed): page i = SHA-256(page i-1 digest ‖ LE32(t) for each token), page 0 without a prior digest.
func SGLangPages(tokens []uint32, pageSize int) ([]Digest, error) {
	if pageSize < 1 {
		return nil, ErrBlockSize
	}
	n := len(tokens) / pageSize
	out := make([]Digest, n)
	buf := make([]byte, 0, 32+4*pageSize)
	for i := range n {
		buf = buf[:0]
		if i > 0 {
			buf = append(buf, out[i-1][:]...)
		}
		for _, t := range tokens[i*pageSize : (i+1)*pageSize] {
			buf = binary.LittleEndian.AppendUint32(buf, t)
		}
		out[i] = sha256.Sum256(buf)
	}
	return out, nil
}

// appendHead appends a CBOR head of major type major with argument v in its shortest form (canonical).
func appendHead(dst []byte, major byte, v uint64) []byte {
	m := major << 5
	switch {
	case v < 24:
		return append(dst, m|byte(v))
	case v <= 0xff:
		return append(dst, m|24, byte(v))
	case v <= 0xffff:
		return append(dst, m|25, byte(v>>8), byte(v))
	case v <= 0xffffffff:
		return append(dst, m|26, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, m|27), v)
}

// appendText appends a CBOR text string.
func appendText(dst []byte, s string) []byte {
	return append(appendHead(dst, 3, uint64(len(s))), s...)
}
