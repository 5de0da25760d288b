// Package model is one served model's text pipeline: an OpenAI chat request is rendered with the model's
// chat template (gateway/chattemplate) and encoded with its tokenizer (gateway/tokenizer), producing the
// exact token IDs vLLM computes for the same request; a completions prompt is encoded with special tokens
// added, as vLLM does.
//
// Multi-turn conversations re-send every earlier message on each turn. EncodeChat therefore cuts the
// rendered prompt at its added-token matches (the template's message delimiters such as <|im_start|> and
// <|im_end|>), which is exact because the tokenizer encodes the text between added tokens independently,
// and caches the IDs of each run of text in a bounded, sharded LRU. A turn then costs a scan of the prompt
// for delimiters plus the encoding of its new text only (BenchmarkMultiTurn).
//
// A Model is safe for concurrent use.
package model

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/kvgate/kvgate/gateway/tokenizer"
)

// Renderer renders an OpenAI chat request body into a prompt string; *chattemplate.Template implements it.
type Renderer interface {
	Render(chatRequestJSON []byte) (string, error)
}

// ErrNoChatTemplate is returned by EncodeChat for a model whose directory has no chat template.
var ErrNoChatTemplate = errors.New("model: the model has no chat template")

// Model combines a tokenizer and a chat template with a cache of encoded prompt segments.
type Model struct {
	tok  *tokenizer.Tokenizer
	tmpl Renderer // nil: completions only
	segs *segmentCache
}

// DefaultSegmentCacheBytes bounds the segment cache of a Model built by Load or New: the text of the
// cached segments plus 4 bytes per cached token ID.
const DefaultSegmentCacheBytes = 64 << 20

// minCachedSegment is the length below which a segment is encoded directly (the tokenizer's word cache
// makes that as cheap as an LRU lookup).
const minCachedSegment = 64

// New builds a Model from a loaded tokenizer and a renderer (nil for a model without chat template).
func New(tok *tokenizer.Tokenizer, tmpl Renderer) *Model {
	return &Model{tok: tok, tmpl: tmpl, segs: newSegmentCache(DefaultSegmentCacheBytes)}
}

// Tokenizer returns the model's tokenizer.
func (m *Model) Tokenizer() *tokenizer.Tokenizer { return m.tok }

// EncodeChat renders an OpenAI chat request body (messages, tools, add_generation_prompt,
// chat_template_kwargs, ...) with the chat template and encodes the prompt without adding special tokens
// (the template writes them, and vLLM encodes chat prompts with add_special_tokens=false). Errors are the
// renderer's (*chattemplate.RenderError, *chattemplate.RequestError) or ErrNoChatTemplate.
func (m *Model) EncodeChat(body []byte) (prompt string, ids []uint32, err error) {
	if m.tmpl == nil {
		return "", nil, ErrNoChatTemplate
	}
	prompt, err = m.tmpl.Render(body)
	if err != nil {
		return "", nil, err
	}
	return prompt, m.EncodePrompt(prompt), nil
}

// EncodeCompletion encodes a completions prompt with special tokens added (e.g. Llama's BOS), as vLLM does.
func (m *Model) EncodeCompletion(prompt string) []uint32 {
	return m.tok.Encode(prompt, true)
}

// EncodePrompt encodes an already rendered prompt without adding special tokens, through the segment
// cache. It returns exactly m.Tokenizer().Encode(prompt, false).
func (m *Model) EncodePrompt(prompt string) []uint32 {
	if !utf8.ValidString(prompt) {
		prompt = strings.ToValidUTF8(prompt, "\uFFFD")
	}
	out := make([]uint32, 0, len(prompt)/3+8)
	m.tok.SplitAdded(prompt, func(s string) {
		if len(s) < minCachedSegment {
			out = m.tok.AppendEncodeText(out, s)
			return
		}
		if ids, ok := m.segs.get(s); ok {
			out = append(out, ids...)
			return
		}
		start := len(out)
		out = m.tok.AppendEncodeText(out, s)
		m.segs.put(strings.Clone(s), append([]uint32(nil), out[start:]...))
	}, func(id uint32) {
		out = append(out, id)
	})
	return out
}

// Load reads an HF model directory: the tokenizer (tokenizer.json or tokenizer.json.gz,
// tokenizer_config.json) and the chat template of tokenizer_config.json.
func Load(dir string) (*Model, error) {
	tok, err := tokenizer.Load(dir)
	if err != nil {
		return nil, err
	}
	tmpl, err := loadTemplate(dir)
	if err != nil {
		return nil, fmt.Errorf("model: %s: %w", dir, err)
	}
	return New(tok, tmpl), nil
}
