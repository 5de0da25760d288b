package kvstore

import (
	"encoding/json"
	"os"
	"slices"
	"strconv"
	"testing"
)

type goldenKeyCase struct {
	Name      string   `json:"name"`
	Seed      string   `json:"seed"`
	BlockSize int      `json:"block_size"`
	LoRA      string   `json:"lora"`
	CacheSalt string   `json:"cache_salt"`
	Tokens    []uint32 `json:"tokens"`
	Keys      []string `json:"keys"`
}

// TestHasherGolden checks Keys against vectors from the independent Python XXH64 in testdata.
func TestHasherGolden(t *testing.T) {
	raw, err := os.ReadFile("testdata/keys_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct{ Cases []goldenKeyCase }
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Cases) < 7 {
		t.Fatalf("only %d golden cases", len(g.Cases))
	}
	for _, c := range g.Cases {
		t.Run(c.Name, func(t *testing.T) {
			seed, err := strconv.ParseUint(c.Seed, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			h := Hasher{Seed: seed}
			got := h.Keys(c.Tokens, c.BlockSize, ExtraKeys{LoRA: c.LoRA, CacheSalt: c.CacheSalt})
			if len(got) != len(c.Keys) {
				t.Fatalf("got %d keys, want %d", len(got), len(c.Keys))
			}
			for i, k := range c.Keys {
				want, _ := strconv.ParseUint(k, 10, 64)
				if uint64(got[i]) != want {
					t.Fatalf("key %d = %d, want %d", i, got[i], want)
				}
			}
			// The single-block helpers and the after-parent variant walk the same chain.
			ex := ExtraKeys{LoRA: c.LoRA, CacheSalt: c.CacheSalt}
			for i := range got {
				blk := c.Tokens[i*c.BlockSize : (i+1)*c.BlockSize]
				var k BlockKey
				if i == 0 {
					k = h.KeyFirst(blk, ex)
				} else {
					k = h.KeyChild(got[i-1], blk, ex)
				}
				if k != got[i] {
					t.Fatalf("single-block key %d = %d, want %d", i, k, got[i])
				}
			}
			if len(got) > 1 {
				rest := h.AppendKeysAfter(nil, got[0], c.Tokens[c.BlockSize:], c.BlockSize, ex)
				if !slices.Equal(rest, got[1:]) {
					t.Fatalf("AppendKeysAfter = %v, want %v", rest, got[1:])
				}
			}
		})
	}
}

func testTokens(n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(i*2654435761) % 151936
	}
	return out
}

func TestHasherProperties(t *testing.T) {
	h := Hasher{Seed: 42}
	toks := testTokens(100)
	full := h.Keys(toks, 16, ExtraKeys{})
	if len(full) != 6 {
		t.Fatalf("100 tokens / 16 = %d keys, want 6 (partial tail dropped)", len(full))
	}
	// Prefix stability: a prefix's keys are a prefix of the longer prompt's keys.
	pre := h.Keys(toks[:40], 16, ExtraKeys{})
	if !slices.Equal(pre, full[:2]) {
		t.Fatalf("prefix keys %v not a prefix of %v", pre, full)
	}
	// Changing a token in block 3 changes keys 3.. only.
	mod := slices.Clone(toks)
	mod[50]++
	mk := h.Keys(mod, 16, ExtraKeys{})
	if !slices.Equal(mk[:3], full[:3]) || mk[3] == full[3] || mk[5] == full[5] {
		t.Fatalf("edit in block 3: %v vs %v", mk, full)
	}
	// Seed changes everything.
	if other := (Hasher{Seed: 43}).Keys(toks, 16, ExtraKeys{}); other[0] == full[0] || other[5] == full[5] {
		t.Fatal("seed did not change keys")
	}
	// Salt changes block 0's key and hence the chain, but folds into block 0 only: block 1 with a salted
	// parent equals KeyChild of that parent without any salt.
	salted := h.Keys(toks, 16, ExtraKeys{CacheSalt: "s"})
	for i := range salted {
		if salted[i] == full[i] {
			t.Fatalf("salted key %d equals unsalted", i)
		}
	}
	if got := h.KeyChild(salted[0], toks[16:32], ExtraKeys{}); got != salted[1] {
		t.Fatal("salt folded into block 1")
	}
	// LoRA folds into every block.
	lora := h.Keys(toks, 16, ExtraKeys{LoRA: "a"})
	if got := h.KeyChild(lora[0], toks[16:32], ExtraKeys{}); got == lora[1] {
		t.Fatal("lora not folded into block 1")
	}
	if got := h.KeyChild(lora[0], toks[16:32], ExtraKeys{LoRA: "a"}); got != lora[1] {
		t.Fatal("KeyChild with lora disagrees with Keys")
	}
	// Edge cases.
	if k := h.Keys(toks[:15], 16, ExtraKeys{}); k != nil {
		t.Fatalf("partial only: %v", k)
	}
	if k := h.Keys(toks, 0, ExtraKeys{}); k != nil {
		t.Fatalf("block size 0: %v", k)
	}
	if k := h.Keys(nil, 16, ExtraKeys{}); k != nil {
		t.Fatalf("nil tokens: %v", k)
	}
	// Large blocks (heap scratch) agree with the chain definition.
	big := h.Keys(testTokens(1000), 200, ExtraKeys{LoRA: "x"})
	if len(big) != 5 || big[1] != h.KeyChild(big[0], testTokens(1000)[200:400], ExtraKeys{LoRA: "x"}) {
		t.Fatal("block size 200 chain mismatch")
	}
}

func TestAppendKeysNoAlloc(t *testing.T) {
	h := Hasher{}
	toks := testTokens(2048)
	dst := make([]BlockKey, 0, 128)
	allocs := testing.AllocsPerRun(20, func() { dst = h.AppendKeys(dst[:0], toks, 16, ExtraKeys{LoRA: "l", CacheSalt: "s"}) })
	if allocs != 0 {
		t.Fatalf("AppendKeys allocated %.0f times", allocs)
	}
}

func BenchmarkKeys2k(b *testing.B) {
	h := Hasher{Seed: 1}
	toks := testTokens(2048)
	dst := make([]BlockKey, 0, 128)
	for b.Loop() {
		dst = h.AppendKeys(dst[:0], toks, 16, ExtraKeys{})
	}
}
