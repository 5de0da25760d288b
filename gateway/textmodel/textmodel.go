// Package textmodel is the gateway's text pipeline for programs outside gateway/ that must tokenize
// exactly as the gateway does: the engine simulator (cmd/enginesim/sim) and the benchmark
// (cmd/kvgate-bench). A Model renders an OpenAI chat body with the model's chat template and encodes it,
// encodes completion prompts and plain text, and decodes token IDs, with the same code and caches the
// gateway routes with (gateway/internal/model); this package only narrows that API to what those programs call.
//
// A Model is safe for concurrent use. The slices it returns are read-only.
package textmodel

import (
	"github.com/kvgate/kvgate/gateway/internal/model"
	"github.com/kvgate/kvgate/gateway/internal/tokenizer"
)

// Model is one model directory's tokenizer and, unless loaded with LoadTokenizer, its chat template.
type Model struct{ m *model.Model }

// Load reads a Hugging Face model directory: tokenizer.json (or tokenizer.json.gz), tokenizer_config.json
// and the chat template. Errors: the tokenizer's (missing or malformed files) or the chat template's
// (one that does not parse); a directory without a chat template loads, and its EncodeChat fails.
func Load(dir string) (*Model, error) {
	m, err := model.Load(dir)
	if err != nil {
		return nil, err
	}
	return &Model{m: m}, nil
}

// LoadTokenizer reads only dir's tokenizer (as Load, without the chat template): EncodeChat then always
// fails. The simulator uses it for a directory whose chat template does not load.
func LoadTokenizer(dir string) (*Model, error) {
	tok, err := tokenizer.Load(dir)
	if err != nil {
		return nil, err
	}
	return &Model{m: model.New(tok, nil)}, nil
}

// EncodeChat renders an OpenAI chat request body with the chat template and encodes the prompt without
// adding special tokens (the template writes them, as vLLM encodes chat prompts). Errors describe a bad
// request (malformed body, a template error) or a model without chat template; they are the client's
// fault.
func (m *Model) EncodeChat(body []byte) (prompt string, ids []uint32, err error) {
	return m.m.EncodeChat(body)
}

// EncodeCompletion encodes a completions prompt with the special tokens (BOS) the tokenizer adds, as vLLM
// does.
func (m *Model) EncodeCompletion(prompt string) []uint32 { return m.m.EncodeCompletion(prompt) }

// EncodeText encodes text without adding special tokens.
func (m *Model) EncodeText(text string) []uint32 { return m.m.Tokenizer().Encode(text, false) }

// Decode returns the text of token IDs, special tokens included (HF decode with
// skip_special_tokens=false); unknown IDs are skipped.
func (m *Model) Decode(ids []uint32) string { return m.m.Tokenizer().Decode(ids) }
