package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestKVDecodeGolden decodes every reference payload (kvstore/kvevents/testdata, the reference kv-events goldens)
// and checks the JSON against golden.json's hash values and inputs.
func TestKVDecodeGolden(t *testing.T) {
	var g struct {
		HashVectors struct {
			SHA256CBOR struct {
				Cases map[string]struct {
					U64 []uint64 `json:"block_hashes_uint64"`
				} `json:"cases"`
			} `json:"sha256_cbor"`
			SGLang struct {
				EventInt64 []int64 `json:"event_int64"`
			} `json:"sglang_page_hash"`
		} `json:"hash_vectors"`
	}
	gb, err := os.ReadFile("../kvstore/kvevents/testdata/golden.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(gb, &g); err != nil {
		t.Fatal(err)
	}
	plain := g.HashVectors.SHA256CBOR.Cases["plain"].U64
	f, err := os.Open("../kvstore/kvevents/testdata/payloads.hex.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	n := 0
	for sc.Scan() {
		name, hx, _ := strings.Cut(sc.Text(), " ")
		var out bytes.Buffer
		if err := kvDecode(strings.NewReader("0x"+hx[:10]+"\n "+hx[10:]+"\n"), &out, false); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var got struct {
			TS     float64 `json:"ts"`
			Events []struct {
				Type        string   `json:"type"`
				BlockHashes []uint64 `json:"block_hashes"`
				TokenIDs    []uint32 `json:"token_ids"`
				BlockSize   int      `json:"block_size"`
				Medium      *string  `json:"medium"`
				LoRAName    *string  `json:"lora_name"`
			} `json:"events"`
		}
		dec := json.NewDecoder(&out)
		dec.UseNumber()
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		wantStored := plain
		wantTypes := "BlockStored,BlockRemoved,AllBlocksCleared"
		if strings.HasPrefix(name, "sglang") {
			wantStored = []uint64{uint64(g.HashVectors.SGLang.EventInt64[0])}
			wantTypes = "BlockStored,BlockStored,BlockRemoved,AllBlocksCleared"
		}
		var types []string
		for _, e := range got.Events {
			types = append(types, e.Type)
		}
		if strings.Join(types, ",") != wantTypes {
			t.Fatalf("%s: types %v", name, types)
		}
		st := got.Events[0]
		if len(st.BlockHashes) != len(wantStored) || st.BlockHashes[0] != wantStored[0] || st.BlockSize != 16 || st.TokenIDs[0] != 1 || st.TokenIDs[15] != 16 {
			t.Fatalf("%s: BlockStored %+v", name, st)
		}
		if hasMedium := st.Medium != nil && *st.Medium == "GPU"; hasMedium == strings.Contains(name, "v0_9_0") {
			t.Fatalf("%s: medium %v", name, st.Medium)
		}
		if got.TS != 1700000000.5 {
			t.Fatalf("%s: ts %v", name, got.TS)
		}
		n++
	}
	if n != 11 {
		t.Fatalf("decoded %d payloads, want 11", n)
	}
}

func TestKVDecodeRejects(t *testing.T) {
	for _, in := range []string{"", "zz", "c1", "93cb41d954fc4020", "920190ff"} {
		var out bytes.Buffer
		if err := kvDecode(strings.NewReader(in), &out, false); err == nil {
			t.Errorf("%q accepted: %s", in, out.String())
		}
	}
}
