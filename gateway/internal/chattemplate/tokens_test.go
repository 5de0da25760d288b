package chattemplate_test

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/gateway/internal/tokenizer"
	"github.com/kvgate/kvgate/kvstore/testenv"
)

// needModel returns the directory of a reference model fetched by `make models`; a missing model skips the
// test, or fails it when CI=true (kvstore/testenv.ModelDir).
func needModel(t *testing.T, model string) string { t.Helper(); return testenv.ModelDir(t, model) }

// TestRenderTokenIDs encodes every reference render (add_special_tokens=false, as vLLM encodes chat
// prompts) with gateway/internal/tokenizer and compares with the IDs HF's Rust tokenizers produced
// (testdata/render_ids.json, written by testdata/gen/render_ids.mjs). It also checks that what Render
// returns for each conversation encodes to the same IDs.
func TestRenderTokenIDs(t *testing.T) {
	if testing.Short() {
		t.Skip("loads four tokenizers; run without -short (make test-unit does)")
	}
	var golden map[string]map[string][]uint32
	if err := json.Unmarshal(readFile(t, "testdata/render_ids.json"), &golden); err != nil {
		t.Fatal(err)
	}
	convs := loadConversations(t)
	total := 0
	for _, m := range models {
		tok, err := tokenizer.Load(needModel(t, m))
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		tmpl := newTemplate(t, m)
		for _, c := range convs {
			want, ok := golden[m][c.Name]
			if !ok {
				continue // the template raised for this conversation: no IDs
			}
			total++
			t.Run(m+"/"+c.Name, func(t *testing.T) {
				text := string(readFile(t, filepath.Join("testdata/renders_py", m, c.Name+".txt")))
				if got := tok.Encode(text, false); !slices.Equal(got, want) {
					t.Fatalf("Encode(reference render) differs from HF:\n got %v\nwant %v", got, want)
				}
				prompt, err := tmpl.Render(requestBody(t, c, true))
				if err != nil {
					t.Fatal(err)
				}
				if got := tok.Encode(prompt, false); !slices.Equal(got, want) {
					t.Fatalf("Encode(Render(request)) differs from HF:\n got %v\nwant %v", got, want)
				}
			})
		}
	}
	if total != 27 {
		t.Fatalf("checked %d renders, want 27 (28 minus gemma3's raised tools_call)", total)
	}
}
