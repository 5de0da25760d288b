//go:build hftokenizers

package hftokenizers

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	hf "github.com/daulet/tokenizers"

	"github.com/kvgate/kvgate/gateway/internal/tokenizer"
)

// Tokenizer encodes and decodes with HF's Rust library. Token lookups (TokenID) come from the pure-Go
// tokenizer loaded from the same files, since the C API has no token_to_id. Close releases the Rust side.
type Tokenizer struct {
	hf     *hf.Tokenizer
	lookup *tokenizer.Tokenizer
}

var _ tokenizer.Interface = (*Tokenizer)(nil)

// Load reads tokenizer.json (or tokenizer.json.gz) from an HF model directory into the Rust library.
func Load(dir string) (*Tokenizer, error) {
	data, err := readFile(dir)
	if err != nil {
		return nil, err
	}
	h, err := hf.FromBytes(data)
	if err != nil {
		return nil, fmt.Errorf("hftokenizers: %s: %w", dir, err)
	}
	lk, err := tokenizer.Load(dir)
	if err != nil {
		h.Close()
		return nil, err
	}
	return &Tokenizer{hf: h, lookup: lk}, nil
}

func readFile(dir string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return b, err
	}
	f, err := os.Open(filepath.Join(dir, "tokenizer.json.gz"))
	if err != nil {
		return nil, fmt.Errorf("hftokenizers: %w", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("hftokenizers: %w", err)
	}
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, zr); err != nil {
		return nil, fmt.Errorf("hftokenizers: %w", err)
	}
	return buf.Bytes(), nil
}

// Encode returns the token IDs of text (add_special_tokens = addSpecial).
func (t *Tokenizer) Encode(text string, addSpecial bool) []uint32 {
	ids, _ := t.hf.Encode(text, addSpecial)
	return ids
}

// Decode returns the text of ids (skip_special_tokens=false).
func (t *Tokenizer) Decode(ids []uint32) string { return t.hf.Decode(ids, false) }

// TokenID looks a token up in the added tokens and the vocab.
func (t *Tokenizer) TokenID(tok string) (uint32, bool) { return t.lookup.TokenID(tok) }

// Close releases the Rust tokenizer.
func (t *Tokenizer) Close() error { return t.hf.Close() }
