package kvstore

import (
	"encoding/binary"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// littleEndian reports whether this host stores uint32 little-endian, so a token slice's memory already
// is the LE32 encoding the key definition hashes.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// Hasher computes kvgate's block keys: chained 64-bit keys over full blocks of prompt tokens.
//
// # Definition (layout version 1)
//
// Block i of a prompt (tokens [i*B, (i+1)*B), B = block size in tokens) has the key
//
//	key(i) = XXH64(LE64(parent(i)) ‖ LE32(t[0]) ‖ … ‖ LE32(t[B-1]) ‖ lora ‖ salt(i), seed 0)
//
// where XXH64 is the 64-bit xxHash of Yann Collet (github.com/cespare/xxhash/v2 Sum64), LE64/LE32 are
// little-endian encodings, parent(0) = Seed (config `block_key_seed`) and parent(i) = key(i-1);
// lora = 'L' ‖ LE32(len) ‖ name bytes when ExtraKeys.LoRA is non-empty, else nothing (every block);
// salt(0) = 'S' ‖ LE32(len) ‖ salt bytes when ExtraKeys.CacheSalt is non-empty, and salt(i>0) is nothing.
// A partial tail block (fewer than B tokens) gets no key.
//
// The definition is pinned by golden vectors (testdata/keys_golden.json) computed by an independent
// pure-Python XXH64 (testdata/gen_keys_golden.py). A Hasher is a plain value, safe for concurrent use.
type Hasher struct {
	// Seed is the chain's root: the parent value of block 0 (config `block_key_seed`). Gateways that share
	// an index must use the same Seed.
	Seed uint64
}

// hashStackBytes is the scratch size kept on the stack; blocks of up to (hashStackBytes-8-extras)/4 tokens
// (block size 64 with short extras) hash without allocating.
const hashStackBytes = 384

// Keys returns the keys of the full blocks of tokens (len(tokens)/blockSize of them; nil when there are none
// or blockSize < 1).
func (h Hasher) Keys(tokens []uint32, blockSize int, extra ExtraKeys) []BlockKey {
	if blockSize < 1 || len(tokens) < blockSize {
		return nil
	}
	return h.AppendKeys(make([]BlockKey, 0, len(tokens)/blockSize), tokens, blockSize, extra)
}

// AppendKeys appends the keys of the full blocks of tokens to dst and returns the extended slice (no
// allocation when dst has room). blockSize < 1 appends nothing.
func (h Hasher) AppendKeys(dst []BlockKey, tokens []uint32, blockSize int, extra ExtraKeys) []BlockKey {
	return h.appendChain(dst, BlockKey(h.Seed), true, tokens, blockSize, extra)
}

// AppendKeysAfter appends the keys of the full blocks of tokens continuing the chain after parent: the
// first block of tokens is a child of parent (not block 0 of a prompt, so the cache salt is not folded in).
// Ingestion uses it for an engine BlockStored event whose parent block key is known.
func (h Hasher) AppendKeysAfter(dst []BlockKey, parent BlockKey, tokens []uint32, blockSize int, extra ExtraKeys) []BlockKey {
	return h.appendChain(dst, parent, false, tokens, blockSize, extra)
}

// KeyFirst returns the key of block 0 of a prompt whose first block is tokens (all of tokens form the
// block; LoRA and cache salt folded in).
func (h Hasher) KeyFirst(tokens []uint32, extra ExtraKeys) BlockKey {
	return h.keyBlock(BlockKey(h.Seed), true, tokens, extra)
}

// KeyChild returns the key of the block following parent whose tokens are tokens (all of tokens form the
// block; LoRA folded in, the cache salt never).
func (h Hasher) KeyChild(parent BlockKey, tokens []uint32, extra ExtraKeys) BlockKey {
	return h.keyBlock(parent, false, tokens, extra)
}

func (h Hasher) appendChain(dst []BlockKey, parent BlockKey, first bool, tokens []uint32, blockSize int, extra ExtraKeys) []BlockKey {
	if blockSize < 1 {
		return dst
	}
	n := len(tokens) / blockSize
	if n == 0 {
		return dst
	}
	dst = growKeys(dst, n)
	var stack [hashStackBytes]byte
	need := 8 + 4*blockSize + extrasLen(extra)
	buf := stack[:0]
	if need > len(stack) {
		buf = make([]byte, 0, need)
	}
	for i := range n {
		k := BlockKey(xxhash.Sum64(blockInput(buf, parent, first && i == 0, tokens[i*blockSize:(i+1)*blockSize], extra)))
		dst = append(dst, k)
		parent = k
	}
	return dst
}

func (h Hasher) keyBlock(parent BlockKey, first bool, tokens []uint32, extra ExtraKeys) BlockKey {
	var stack [hashStackBytes]byte
	need := 8 + 4*len(tokens) + extrasLen(extra)
	buf := stack[:0]
	if need > len(stack) {
		buf = make([]byte, 0, need)
	}
	return BlockKey(xxhash.Sum64(blockInput(buf, parent, first, tokens, extra)))
}

func extrasLen(extra ExtraKeys) int { return 10 + len(extra.LoRA) + len(extra.CacheSalt) }

// blockInput writes one block's hash input into buf[:0] (which must have room) and returns it.
func blockInput(buf []byte, parent BlockKey, first bool, block []uint32, extra ExtraKeys) []byte {
	b := binary.LittleEndian.AppendUint64(buf[:0], uint64(parent))
	if littleEndian && len(block) > 0 {
		b = append(b, unsafe.Slice((*byte)(unsafe.Pointer(&block[0])), 4*len(block))...)
	} else {
		for _, t := range block {
			b = binary.LittleEndian.AppendUint32(b, t)
		}
	}
	if extra.LoRA != "" {
		b = append(b, 'L')
		b = binary.LittleEndian.AppendUint32(b, uint32(len(extra.LoRA)))
		b = append(b, extra.LoRA...)
	}
	if first && extra.CacheSalt != "" {
		b = append(b, 'S')
		b = binary.LittleEndian.AppendUint32(b, uint32(len(extra.CacheSalt)))
		b = append(b, extra.CacheSalt...)
	}
	return b
}

func growKeys(dst []BlockKey, n int) []BlockKey {
	if cap(dst)-len(dst) >= n {
		return dst
	}
	out := make([]BlockKey, len(dst), len(dst)+n)
	copy(out, dst)
	return out
}
