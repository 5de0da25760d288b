package sim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvgate/kvgate/gateway/tokenizer"
)

// hasTokenizerFiles reports whether dir holds a tokenizer.json or tokenizer.json.gz.
func hasTokenizerFiles(dir string) bool {
	for _, f := range []string{"tokenizer.json", "tokenizer.json.gz"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err == nil && !st.IsDir() {
			return true
		}
	}
	return false
}

// loadTextModel returns the model's text pipeline: its own tokenizer and chat template when dir holds
// tokenizer files, else the byte-level fallback.
func loadTextModel(dir string) (textModel, error) {
	if !hasTokenizerFiles(dir) {
		return byteModel{}, nil
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("sim: load tokenizer from %s: %w", dir, err)
	}
	return &hfModel{tok: tok}, nil
}

// hfModel is the pipeline of a model directory: gateway/tokenizer for encoding and decoding.
type hfModel struct {
	tok *tokenizer.Tokenizer
}

func (m *hfModel) Kind() string { return "tokenizer" }

func (m *hfModel) EncodeCompletion(prompt string) []uint32 { return m.tok.Encode(prompt, true) }

func (m *hfModel) Decode(ids []uint32) string { return m.tok.Decode(ids) }

func (m *hfModel) EncodeChat(body []byte) (string, []uint32, error) {
	return "", nil, errors.New("chat template rendering is not wired yet; send prompt_token_ids")
}
