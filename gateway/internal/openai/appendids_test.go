package openai

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// TestAppendUint32 checks the decimal formatter against strconv at every digit-count boundary and on
// random values.
func TestAppendUint32(t *testing.T) {
	vals := []uint32{0, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 151642, 151643, 999999, 1000000, math.MaxUint32}
	for p := uint64(1); p <= math.MaxUint32; p *= 10 {
		vals = append(vals, uint32(p-1), uint32(p), uint32(min(p+1, math.MaxUint32)))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		vals = append(vals, rng.Uint32(), rng.Uint32N(200000))
	}
	for _, v := range vals {
		got := string(appendUint32([]byte("x"), v))
		if want := "x" + strconv.FormatUint(uint64(v), 10); got != want {
			t.Fatalf("appendUint32(%d) = %q, want %q", v, got, want)
		}
	}
}

// TestAppendIDsJSON checks that AppendIDs writes a JSON array that decodes back to the same IDs.
func TestAppendIDsJSON(t *testing.T) {
	edges := []uint32{0, 9, 10, 99, 100, 999, 1000, 9999, 10000, 10001, 99999, 100000, 151643, 9999999,
		99999999, 100000000, 100000001, math.MaxUint32}
	rng := rand.New(rand.NewPCG(5, 6))
	var random []uint32
	for range 5000 {
		random = append(random, rng.Uint32N(262144), rng.Uint32())
	}
	for _, ids := range [][]uint32{{}, {0}, {7, 151643, 0, 42, math.MaxUint32}, edges, random} {
		out := AppendIDs([]byte("prefix"), ids)
		if string(out[:6]) != "prefix" {
			t.Fatalf("prefix lost: %q", out)
		}
		var back []uint32
		if err := json.Unmarshal(out[6:], &back); err != nil {
			t.Fatalf("%q: %v", out, err)
		}
		if len(back) != len(ids) {
			t.Fatalf("%q decodes to %v", out, back)
		}
		for i := range ids {
			if back[i] != ids[i] {
				t.Fatalf("%q decodes to %v", out, back)
			}
		}
		// Byte for byte what strconv writes.
		want := []byte("prefix[")
		for i, id := range ids {
			if i > 0 {
				want = append(want, ',')
			}
			want = strconv.AppendUint(want, uint64(id), 10)
		}
		if want = append(want, ']'); string(out) != string(want) {
			t.Fatalf("AppendIDs differs from strconv for %v", ids[:min(len(ids), 8)])
		}
	}
}

// BenchmarkAppendIDs formats 2,000 token IDs of a 152k vocabulary (one routed prompt's worth).
func BenchmarkAppendIDs(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	ids := make([]uint32, 2000)
	for i := range ids {
		ids[i] = rng.Uint32N(151643)
	}
	buf := make([]byte, 0, 16<<10)
	for b.Loop() {
		buf = AppendIDs(buf[:0], ids)
	}
}

// BenchmarkSpliceChatTokenIDs splices 2,000 token IDs into an 8 KB chat body (the engine-simulator path).
func BenchmarkSpliceChatTokenIDs(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	ids := make([]uint32, 2000)
	for i := range ids {
		ids[i] = rng.Uint32N(151643)
	}
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 8000) + `"}]}`)
	for b.Loop() {
		SpliceChatTokenIDs(body, ids)
	}
}

// TestSpliceAllocatesOnce: the chat splice reserves what AppendIDs needs (one allocation, no regrowth),
// for IDs of every digit count.
func TestSpliceAllocatesOnce(t *testing.T) {
	body := []byte(`{"model":"m","messages":[]}`)
	for _, top := range []uint32{0, 9, 10, 99999, 151643, 999999, 1000000, math.MaxUint32} {
		ids := []uint32{1, top, 22, top, 333}
		if n := testing.AllocsPerRun(10, func() { SpliceChatTokenIDs(body, ids) }); n != 1 {
			t.Fatalf("top %d: %v allocations, want 1", top, n)
		}
		var back struct {
			IDs []uint32 `json:"prompt_token_ids"`
		}
		if err := json.Unmarshal(SpliceChatTokenIDs(body, ids), &back); err != nil || len(back.IDs) != 5 || back.IDs[1] != top {
			t.Fatalf("top %d: %v %v", top, back.IDs, err)
		}
	}
}
