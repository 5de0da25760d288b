package sim

import (
	"github.com/kvgate/kvgate/cmd/enginesim/vllmhash"
	"github.com/kvgate/kvgate/kvstore"
)

// blockHasher computes the engine block hashes of a prompt's full blocks, as the simulated vLLM would with
// --prefix-caching-hash-algo sha256_cbor.
type blockHasher struct {
	h vllmhash.Hasher
}

// newBlockHasher returns the sha256_cbor hasher rooted at PYTHONHASHSEED=seed (cmd/enginesim/vllmhash).
func newBlockHasher(seed string) (blockHasher, error) {
	return blockHasher{h: vllmhash.New(seed)}, nil
}

// blockHashes returns the digests of the prompt's full blocks with the LoRA name (every block) and cache
// salt (block 0) folded in as vLLM folds its extra keys.
func (b blockHasher) blockHashes(tokens []uint32, blockSize int, lora, salt string) []digest {
	ds, err := b.h.Blocks(tokens, blockSize, kvstore.ExtraKeys{LoRA: lora, CacheSalt: salt})
	if err != nil {
		// Only a block size below 1 fails, which Config.Validate rules out.
		return nil
	}
	out := make([]digest, len(ds))
	for i, d := range ds {
		out[i] = digest(d)
	}
	return out
}

// next returns the digest of the block after hashes (block len(hashes) of a request) holding tokens.
func (b blockHasher) next(hashes []digest, tokens []uint32, lora, salt string) digest {
	parent := b.h.NoneHash()
	if len(hashes) > 0 {
		parent = vllmhash.Digest(hashes[len(hashes)-1])
	}
	extra := vllmhash.BlockExtra(len(hashes), kvstore.ExtraKeys{LoRA: lora, CacheSalt: salt})
	return digest(vllmhash.BlockHash(parent, tokens, extra))
}
