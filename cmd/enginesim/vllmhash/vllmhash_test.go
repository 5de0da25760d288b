package vllmhash

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"

	"github.com/kvgate/kvgate/kvstore"
)

type refCase struct {
	ExtraKeysPerBlock [][]string `json:"extra_keys_per_block"`
	BlockHashesHex    []string   `json:"block_hashes_hex"`
	BlockHashesUint64 []uint64   `json:"block_hashes_uint64"`
	Block0InputHex    string     `json:"block0_serialized_input_hex"`
}

// refGolden is kvstore/kvevents/testdata/golden.json, the kv-events reference vectors (cbor2 + hashlib).
type refGolden struct {
	HashVectors struct {
		Inputs struct {
			TokenIDs  []uint32 `json:"token_ids"`
			BlockSize int      `json:"block_size"`
			Seed      string   `json:"PYTHONHASHSEED"`
		} `json:"inputs"`
		SHA256CBOR struct {
			NoneHashHex      string             `json:"none_hash_hex"`
			NoneHashInputHex string             `json:"none_hash_input_hex"`
			Cases            map[string]refCase `json:"cases"`
		} `json:"sha256_cbor"`
		SGLang struct {
			PageSize   int      `json:"page_size"`
			PageHashes []string `json:"page_hashes_hex"`
			EventInt64 []int64  `json:"event_int64"`
		} `json:"sglang_page_hash"`
	} `json:"hash_vectors"`
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

func hexes(ds []Digest) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = hex.EncodeToString(d[:])
	}
	return out
}

func TestReferenceGolden(t *testing.T) {
	var g refGolden
	readJSON(t, "../../../kvstore/kvevents/testdata/golden.json", &g)
	in := g.HashVectors.Inputs
	ref := g.HashVectors.SHA256CBOR
	h := New(in.Seed)
	nh := h.NoneHash()
	if got := hex.EncodeToString(nh[:]); got != ref.NoneHashHex {
		t.Fatalf("NONE_HASH %s, want %s", got, ref.NoneHashHex)
	}
	if got := hex.EncodeToString(appendText(nil, in.Seed)); got != ref.NoneHashInputHex {
		t.Fatalf("NONE_HASH input %s, want %s", got, ref.NoneHashInputHex)
	}
	extras := map[string]kvstore.ExtraKeys{
		"plain":              {},
		"lora_name=my-lora":  {LoRA: "my-lora"},
		"cache_salt=salt123": {CacheSalt: "salt123"},
		"lora+salt":          {LoRA: "my-lora", CacheSalt: "salt123"},
	}
	if len(ref.Cases) != len(extras) {
		t.Fatalf("golden has %d cases, test knows %d", len(ref.Cases), len(extras))
	}
	for name, c := range ref.Cases {
		ex := extras[name]
		ds, err := h.Blocks(in.TokenIDs, in.BlockSize, ex)
		if err != nil {
			t.Fatal(err)
		}
		got := hexes(ds)
		if len(got) != len(c.BlockHashesHex) {
			t.Fatalf("%s: %d blocks, want %d", name, len(got), len(c.BlockHashesHex))
		}
		for i := range got {
			if got[i] != c.BlockHashesHex[i] {
				t.Errorf("%s block %d: %s, want %s", name, i, got[i], c.BlockHashesHex[i])
			}
			if ev := ds[i].EventHash(); ev != c.BlockHashesUint64[i] {
				t.Errorf("%s block %d: event hash %d, want %d", name, i, ev, c.BlockHashesUint64[i])
			}
		}
		in0 := AppendBlockInput(nil, nh, in.TokenIDs[:in.BlockSize], BlockExtra(0, ex))
		if got := hex.EncodeToString(in0); got != c.Block0InputHex {
			t.Errorf("%s block 0 CBOR %s, want %s", name, got, c.Block0InputHex)
		}
	}
	sg := g.HashVectors.SGLang
	pages, err := SGLangPages(in.TokenIDs, sg.PageSize)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range pages {
		if hexes(pages)[i] != sg.PageHashes[i] || d.SGLangEventHash() != sg.EventInt64[i] {
			t.Errorf("sglang page %d: %x / %d, want %s / %d", i, d, d.SGLangEventHash(), sg.PageHashes[i], sg.EventInt64[i])
		}
	}
}

// TestExtraGolden covers every CBOR uint width, other seeds and non-ASCII / 30-byte extra keys
// (testdata/extra_golden.json from testdata/gen_extra_golden.py, cbor2 + hashlib).
func TestExtraGolden(t *testing.T) {
	var g struct {
		TokenIDs  []uint32 `json:"token_ids"`
		BlockSize int      `json:"block_size"`
		Cases     []struct {
			Seed           string   `json:"seed"`
			LoRA           string   `json:"lora"`
			CacheSalt      string   `json:"cache_salt"`
			BlockHashesHex []string `json:"block_hashes_hex"`
		} `json:"cases"`
		SGLang []string `json:"sglang_page_hashes_hex"`
	}
	readJSON(t, "testdata/extra_golden.json", &g)
	if len(g.Cases) != 5 {
		t.Fatalf("want 5 cases, have %d", len(g.Cases))
	}
	for _, c := range g.Cases {
		ds, err := New(c.Seed).Blocks(g.TokenIDs, g.BlockSize, kvstore.ExtraKeys{LoRA: c.LoRA, CacheSalt: c.CacheSalt})
		if err != nil {
			t.Fatal(err)
		}
		got := hexes(ds)
		if len(got) != len(c.BlockHashesHex) {
			t.Fatalf("%+v: %d blocks", c, len(got))
		}
		for i := range got {
			if got[i] != c.BlockHashesHex[i] {
				t.Errorf("seed %q lora %q salt %q block %d: %s, want %s", c.Seed, c.LoRA, c.CacheSalt, i, got[i], c.BlockHashesHex[i])
			}
		}
		// Single-block API agrees with the chained one.
		if d := BlockHash(New(c.Seed).NoneHash(), g.TokenIDs[:g.BlockSize], BlockExtra(0, kvstore.ExtraKeys{LoRA: c.LoRA, CacheSalt: c.CacheSalt})); d != ds[0] {
			t.Errorf("BlockHash disagrees with Blocks for block 0")
		}
	}
	pages, _ := SGLangPages(g.TokenIDs, g.BlockSize)
	for i, p := range hexes(pages) {
		if p != g.SGLang[i] {
			t.Errorf("sglang page %d: %s, want %s", i, p, g.SGLang[i])
		}
	}
}

func TestEdges(t *testing.T) {
	h := New("0")
	if _, err := h.Blocks([]uint32{1}, 0, kvstore.ExtraKeys{}); err != ErrBlockSize {
		t.Fatalf("block size 0: %v", err)
	}
	ds, _ := h.Blocks([]uint32{1, 2, 3}, 2, kvstore.ExtraKeys{})
	if len(ds) != 1 {
		t.Fatalf("partial tail hashed: %d digests", len(ds))
	}
	if _, err := SGLangPages(nil, -1); err != ErrBlockSize {
		t.Fatal("page size -1 accepted")
	}
}

func BenchmarkBlocks2k(b *testing.B) {
	h := New("0")
	toks := make([]uint32, 2048)
	for i := range toks {
		toks[i] = uint32(i * 7919 % 151000)
	}
	b.SetBytes(int64(len(toks)) * 4)
	for b.Loop() {
		_, _ = h.Blocks(toks, 16, kvstore.ExtraKeys{})
	}
}
