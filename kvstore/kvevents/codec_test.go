package kvevents

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

// golden mirrors the parts of testdata/golden.json (the reference kv-events goldens, produced by a Python generator
// with msgpack-python and cross-checked against msgspec) that the codec tests use.
type golden struct {
	HashVectors struct {
		SHA256CBOR struct {
			Cases map[string]struct {
				BlockHashesHex    []string `json:"block_hashes_hex"`
				BlockHashesUint64 []uint64 `json:"block_hashes_uint64"`
			} `json:"cases"`
		} `json:"sha256_cbor"`
		SGLang struct {
			EventInt64 []int64 `json:"event_int64"`
		} `json:"sglang_page_hash"`
		Inputs struct {
			TokenIDs  []uint32 `json:"token_ids"`
			BlockSize int      `json:"block_size"`
		} `json:"inputs"`
	} `json:"hash_vectors"`
	EventParams struct {
		TS     float64 `json:"ts"`
		DPRank int     `json:"data_parallel_rank"`
	} `json:"event_params"`
}

func loadGolden(t testing.TB) golden {
	t.Helper()
	b, err := os.ReadFile("testdata/golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

// loadPayloads reads testdata/payloads.hex.txt: "name hex" per line.
func loadPayloads(t testing.TB) map[string][]byte {
	t.Helper()
	f, err := os.Open("testdata/payloads.hex.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]byte{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, hx, ok := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		if !ok {
			continue
		}
		b, err := hex.DecodeString(hx)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = b
	}
	if len(out) != 11 {
		t.Fatalf("want 11 golden payloads, have %d", len(out))
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// expectedBatch builds, from golden.json's inputs, the batch the reference generator encoded under name.
func expectedBatch(t testing.TB, g golden, name string) (EventBatch, Layout, HashForm) {
	t.Helper()
	parts := strings.Split(name, "/")
	layout, err := ParseLayout(parts[0] + "/" + parts[1])
	if err != nil {
		t.Fatal(err)
	}
	plain := g.HashVectors.SHA256CBOR.Cases["plain"]
	tokens := g.HashVectors.Inputs.TokenIDs
	bs := g.HashVectors.Inputs.BlockSize
	form := map[string]HashForm{"hash_int": HashUint, "hash_bytes": HashBytes, "hash_int64": HashInt64}[parts[2]]
	b := EventBatch{TS: g.EventParams.TS}
	if layout != LayoutV090 {
		b.DataParallelRank = ptr(g.EventParams.DPRank)
	}
	if layout == LayoutSGLang {
		sg := g.HashVectors.SGLang.EventInt64
		h0, h1 := EngineHash(sg[0]), EngineHash(sg[1])
		b.Events = []Event{
			BlockStored{BlockHashes: []EngineHash{h0}, TokenIDs: tokens[:16], BlockSize: 16, Medium: "GPU"},
			BlockStored{BlockHashes: []EngineHash{h1}, ParentBlockHash: &h0, TokenIDs: tokens[16:], BlockSize: 16, Medium: "GPU"},
			BlockRemoved{BlockHashes: []EngineHash{h1}, Medium: "GPU"},
			AllBlocksCleared{},
		}
		return b, layout, form
	}
	hs := []EngineHash{EngineHash(plain.BlockHashesUint64[0]), EngineHash(plain.BlockHashesUint64[1])}
	var raw [][]byte
	if form == HashBytes {
		for _, x := range plain.BlockHashesHex {
			d, _ := hex.DecodeString(x)
			raw = append(raw, d)
		}
	}
	st := BlockStored{BlockHashes: hs, RawBlockHashes: raw, TokenIDs: tokens, BlockSize: bs, Medium: "GPU"}
	rm := BlockRemoved{BlockHashes: hs[1:], Medium: "CPU"}
	if raw != nil {
		rm.RawBlockHashes = raw[1:]
	}
	if layout == LayoutV090 {
		st.Medium, rm.Medium = "", ""
	}
	b.Events = []Event{st, rm, AllBlocksCleared{}}
	return b, layout, form
}

func TestEncodeGolden(t *testing.T) {
	g := loadGolden(t)
	for name, want := range loadPayloads(t) {
		t.Run(name, func(t *testing.T) {
			b, layout, form := expectedBatch(t, g, name)
			got, err := Encode(b, layout, form)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("encode %s:\n got %x\nwant %x", name, got, want)
			}
		})
	}
}

func TestDecodeGolden(t *testing.T) {
	g := loadGolden(t)
	for name, payload := range loadPayloads(t) {
		t.Run(name, func(t *testing.T) {
			want, _, _ := expectedBatch(t, g, name)
			got, err := Decode(payload)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("decode %s:\n got %#v\nwant %#v", name, got, want)
			}
		})
	}
}

// TestDecodeHashForms checks every int width and sign and byte-string lengths against hand-written bytes.
func TestDecodeHashForms(t *testing.T) {
	cases := []struct {
		hashHex string
		want    EngineHash
	}{
		{"05", 5},
		{"ff", 0xffffffffffffffff},                       // negative fixint -1
		{"d0fe", 0xfffffffffffffffe},                     // int8 -2
		{"cd0102", 0x0102},                               // uint16
		{"d3ffffffffffffff85", 0xffffffffffffff85},       // int64 -123
		{"cf8000000000000000", 0x8000000000000000},       // uint64 top bit
		{"c403010203", 0x010203},                         // bin of 3 bytes
		{"c40a00000000000000000000", 0},                  // bin of 10 zero bytes
		{"c40aff11223344556677aabb", 0x223344556677aabb}, // last 8 of 10
	}
	for _, c := range cases {
		// [ts=1.0 as fixint, [["BlockRemoved", [h]]]]
		p, _ := hex.DecodeString("92019192ac426c6f636b52656d6f76656491" + c.hashHex)
		b, err := Decode(p)
		if err != nil {
			t.Fatalf("%s: %v", c.hashHex, err)
		}
		got := b.Events[0].(BlockRemoved).BlockHashes[0]
		if got != c.want {
			t.Errorf("%s: got %#x want %#x", c.hashHex, uint64(got), uint64(c.want))
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	cases := []struct {
		name, hex string
		kind      error
	}{
		{"empty", "", ErrMalformed},
		{"truncated", "93cb41d954fc40", ErrMalformed},
		{"not a batch", "a3616263", ErrWrongType},
		{"string ts", "92a17891", ErrWrongType},
		{"huge events array", "92cbd41d954fc4020000ddffffffff", ErrTooLarge},
		{"huge string tag", "92019191dbffffffff", ErrTooLarge},
		{"negative token", "9201919aab426c6f636b53746f72656490c091ff10c0", ErrWrongType},
		{"token > uint32", "9201919aab426c6f636b53746f72656490c091cf000000010000000010c0", ErrWrongType},
		{"string block size", "9201919aab426c6f636b53746f72656490c090a131c0", ErrWrongType},
		{"map hash", "92019192ac426c6f636b52656d6f7665649181a16101", ErrWrongType},
		{"short BlockStored", "92019192ab426c6f636b53746f72656490", ErrWrongType},
		{"trailing bytes", "92019000", ErrMalformed},
		{"reserved code", "92019192a3466f6fc1", ErrMalformed},
		{"tag not a string", "920191" + strings.Repeat("91", 100) + "00", ErrWrongType},
		{"deep nesting", "92019192a3466f6f" + strings.Repeat("91", 100) + "00", ErrTooLarge},
	}
	for _, c := range cases {
		p, err := hex.DecodeString(c.hex)
		if err != nil {
			t.Fatalf("%s: bad test hex: %v", c.name, err)
		}
		_, err = Decode(p)
		var de *DecodeError
		if !errors.As(err, &de) {
			t.Errorf("%s: want *DecodeError, got %v", c.name, err)
			continue
		}
		if !errors.Is(err, c.kind) {
			t.Errorf("%s: want %v, got %v", c.name, c.kind, err)
		}
	}
}

func TestDecodeSkipsUnknown(t *testing.T) {
	// [1, [["Future", 1, {"a": [1,2]}], {"type": "AlsoFuture"}, ["AllBlocksCleared", "extra"]], 0, "x"]
	p, _ := hex.DecodeString("9401" + "93" +
		"93a6467574757265" + "01" + "81a161920102" +
		"81a474797065aa416c736f467574757265" +
		"92b0416c6c426c6f636b73436c6561726564a56578747261" +
		"00a178")
	b, err := Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	if b.Skipped != 2 || len(b.Events) != 1 || b.Events[0].Type() != TagAllBlocksCleared {
		t.Fatalf("got %+v", b)
	}
}

// TestRoundTripAllFields encodes a batch using every optional field in each layout that carries it.
func TestRoundTripAllFields(t *testing.T) {
	parent := EngineHash(0xfedcba9876543210)
	full := BlockStored{
		BlockHashes: []EngineHash{1 << 63, 7}, ParentBlockHash: &parent, TokenIDs: []uint32{0, 127, 128, 65535, 65536, 1<<32 - 1},
		BlockSize: 3, LoRAID: ptr(4), Medium: "CPU_PINNED", LoRAName: "adapter-x",
		ExtraKeys: []ExtraKey{{"adapter-x", "salt"}, nil}, GroupIdx: ptr(1), KVCacheSpecKind: "sliding_window",
		KVCacheSpecSlidingWindow: ptr(4096),
	}
	for _, layout := range []Layout{LayoutArrayLast, LayoutMap, LayoutMapBatch} {
		for _, form := range []HashForm{HashUint, HashInt64} {
			in := EventBatch{TS: 12.25, Events: []Event{full, BlockRemoved{BlockHashes: []EngineHash{3}, Medium: "GPU", GroupIdx: ptr(2)}}, DataParallelRank: ptr(3)}
			p, err := Encode(in, layout, form)
			if err != nil {
				t.Fatal(err)
			}
			out, err := Decode(p)
			if err != nil {
				t.Fatalf("%s/%s: %v", layout, form, err)
			}
			// Extra-key strings come back as strings; that is the only representation change.
			if !reflect.DeepEqual(in, out) {
				t.Fatalf("%s/%s:\n in %#v\nout %#v", layout, form, in, out)
			}
		}
	}
	if _, err := Encode(EventBatch{Events: []Event{full}}, LayoutV011, HashUint); !errors.Is(err, ErrEncode) {
		t.Fatalf("want ErrEncode for fields the layout lacks, got %v", err)
	}
	if _, err := Encode(EventBatch{Events: []Event{BlockStored{BlockHashes: []EngineHash{1}}}}, LayoutV011, HashBytes); !errors.Is(err, ErrEncode) {
		t.Fatalf("want ErrEncode for missing raw digest, got %v", err)
	}
}

// TestDecodeVariants decodes payloads packed by msgpack-python (use_bin_type=True, as msgspec) in shapes the
// goldens do not cover: SGLang's BlockStoredWithMetadata, every array field set plus a future one, and a map
// event whose tag is not first with an unknown key.
func TestDecodeVariants(t *testing.T) {
	b, err := Decode(mustHex("93cb3ff80000000000009198ab426c6f636b53746f72656491fb03dc0010000102030405060708090a0b0c0d0e0f10c0a347505581aa63616368655f73616c74a473616c7400"))
	if err != nil {
		t.Fatal(err)
	}
	s := b.Events[0].(BlockStored)
	if s.CacheSalt != "salt" || s.BlockHashes[0] != EngineHash(0xfffffffffffffffb) || *s.ParentBlockHash != 3 || s.LoRAName != "" || len(s.TokenIDs) != 16 {
		t.Fatalf("sglang metadata: %+v", s)
	}
	b, err = Decode(mustHex("93cb3ff8000000000000919dab426c6f636b53746f726564920102c0dc0020000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f1003a3475055a46c6f72619293a46c6f7261a473616c7494c40101cb3ff8000000000000fdc3c000ae66756c6c5f617474656e74696f6ec0a86c6f63616c697479c0"))
	if err != nil {
		t.Fatal(err)
	}
	want := BlockStored{BlockHashes: []EngineHash{1, 2}, TokenIDs: tokens(0, 32), BlockSize: 16, LoRAID: ptr(3), Medium: "GPU", LoRAName: "lora",
		ExtraKeys: []ExtraKey{{"lora", "salt", []any{[]byte{1}, 1.5, int64(-3), true}}, nil}, GroupIdx: ptr(0), KVCacheSpecKind: "full_attention"}
	if !reflect.DeepEqual(b.Events[0], want) || b.DataParallelRank != nil {
		t.Fatalf("all fields:\n got %#v\nwant %#v", b.Events[0], want)
	}
	b, err = Decode(mustHex("92019184a66d656469756da3435055ac626c6f636b5f68617368657391c4200101010101010101010101010101010101010101010101010101010101010101a474797065ac426c6f636b52656d6f766564a666757475726581a1789101"))
	if err != nil {
		t.Fatal(err)
	}
	r := b.Events[0].(BlockRemoved)
	if r.Medium != "CPU" || r.BlockHashes[0] != 0x0101010101010101 || len(r.RawBlockHashes[0]) != 32 || b.TS != 1 {
		t.Fatalf("map event: %+v", r)
	}
}

// TestHashForms pins the bytes of each hash form for a hash with the top bit set.
func TestHashForms(t *testing.T) {
	h := EngineHash(0xfffffffffffffffe)
	raw := append(make([]byte, 24), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe)
	b := EventBatch{TS: 0, Events: []Event{BlockRemoved{BlockHashes: []EngineHash{h}, RawBlockHashes: [][]byte{raw}}}}
	for form, wantHash := range map[HashForm]string{
		HashUint:  "cffffffffffffffffe",
		HashInt64: "fe", // -2 as a negative fixint, as msgpack-python packs the int64 -2
		HashBytes: "c420" + strings.Repeat("00", 24) + "fffffffffffffffe",
	} {
		p, err := Encode(b, LayoutV011, form)
		if err != nil {
			t.Fatal(err)
		}
		want := "93cb0000000000000000" + "9193ac426c6f636b52656d6f76656491" + wantHash + "c0c0"
		if hex.EncodeToString(p) != want {
			t.Errorf("%s: %x, want %s", form, p, want)
		}
		d, err := Decode(p)
		if err != nil || d.Events[0].(BlockRemoved).BlockHashes[0] != h {
			t.Errorf("%s: decoded %+v, %v", form, d, err)
		}
	}
}
