// Package model is one served model's text pipeline: an OpenAI chat request is rendered with the model's
// chat template (gateway/internal/chattemplate) and encoded with its tokenizer (gateway/internal/tokenizer), producing the
// exact token IDs vLLM computes for the same request; a completions prompt is encoded with special tokens
// added, as vLLM does.
//
// Multi-turn conversations re-send every earlier message on each turn. The tokenizer encodes the text
// between added tokens (the template's message delimiters such as <|im_start|> and <|im_end|>)
// independently, so EncodePrompt caches at those boundaries, exactly:
//   - a prefix cache keeps the IDs of each prompt up to its last stable delimiter (keyed by length and a
//     hash of its end, confirmed by comparing the text); the next turn finds it by searching its own
//     delimiters from the end backwards and only encodes what follows;
//   - the IDs of one conversation live in one append-only array (an arena) shared by its cached prefixes
//     and by the slices EncodePrompt returns: the next turn appends its new IDs in place, so it copies
//     nothing of the earlier turns. Results are therefore read-only (see EncodePrompt);
//   - a segment cache keeps the IDs of each long run of text between delimiters, for prompts whose prefix
//     changed (an edited system prompt, a branch).
//
// Both caches are bounded, sharded LRUs. A turn costs the encoding of its new text plus a comparison of
// the prompt with the cached prefix (memory speed, ~3 µs for 150 KB) and a few lookups
// (BenchmarkMultiTurn); a branch (an edited or regenerated message) also copies the shared prefix's IDs.
//
// A Model is safe for concurrent use.
package model

import (
	"context"
	"fmt"
	"iter"
	"slices"
	"strings"
	"sync"

	"github.com/kvgate/kvgate/gateway/internal/chattemplate"
	"github.com/kvgate/kvgate/gateway/internal/tokenizer"
)

// Renderer renders an OpenAI chat request body into a prompt string; *chattemplate.Template implements it.
type Renderer interface {
	// Render returns the prompt for an OpenAI chat request body, or a typed chattemplate error.
	Render(chatRequestJSON []byte) (string, error)
}

// ErrNoChatTemplate is returned by EncodeChat for a model whose directory has no chat template (Load
// accepts such a directory: completions still work). It is chattemplate.ErrNoTemplate.
var ErrNoChatTemplate = chattemplate.ErrNoTemplate

// Model combines a tokenizer and a chat template with a cache of encoded prompt segments.
type Model struct {
	tok         *tokenizer.Tokenizer
	tmpl        Renderer // nil: completions only
	segs        *segmentCache
	prefixes    *prefixCache
	completions *prefixCache              // completions prompts cut at text cuts (EncodeCompletion); IDs include BOS
	prompts     *chattemplate.PromptCache // recent native renders (nil: none), see render
	idText      *idTextCache              // JSON text of returned ID arrays (nil: none), see AppendIDsJSON
}

// DefaultSegmentCacheBytes bounds the segment cache of a Model built by Load or New: the text of the
// cached segments plus 4 bytes per cached token ID.
const DefaultSegmentCacheBytes = 32 << 20

// DefaultPrefixCacheBytes bounds the conversation-prefix cache of a Model built by Load or New: the prompt
// strings the cached prefixes keep alive plus 4 bytes per cached token ID (a 32k-token conversation takes
// about 256 KiB, so the default holds about 250 of them).
const DefaultPrefixCacheBytes = 64 << 20

// DefaultCompletionCacheBytes bounds the completions prefix cache of a Model built by Load or New (see
// EncodeCompletion): the prompt strings its entries keep alive plus 4 bytes per cached token ID, counted
// per entry (a 32k-token prompt takes about 256 KiB).
const DefaultCompletionCacheBytes = 32 << 20

// DefaultRenderCacheBytes bounds the rendered-prompt cache of a Model built by Load or New
// (chattemplate.PromptCache, used when the template renders natively): each entry counts the capacity of
// the prompt array it keeps alive (a 128k-token conversation's prompt is about 600 KiB), so the default
// holds the latest prompts of about 50 such conversations; a prompt over 1/16 of it is rendered uncached.
const DefaultRenderCacheBytes = 32 << 20

// Options sizes a Model's caches. Zero fields take the defaults; a negative field disables that cache.
type Options struct {
	SegmentCacheBytes    int // bytes of cached text runs and their IDs; default DefaultSegmentCacheBytes
	PrefixCacheBytes     int // bytes of cached conversation prefixes; default DefaultPrefixCacheBytes
	CompletionCacheBytes int // bytes of cached completions prompt prefixes; default DefaultCompletionCacheBytes
	RenderCacheBytes     int // bytes of cached rendered prompts; default DefaultRenderCacheBytes
	IDTextCacheBytes     int // bytes of cached token-ID JSON text; default DefaultIDTextCacheBytes
}

func (o Options) limits() (segs, prefixes, completions, renders, idText int) {
	segs, prefixes, completions, renders, idText = o.SegmentCacheBytes, o.PrefixCacheBytes, o.CompletionCacheBytes, o.RenderCacheBytes, o.IDTextCacheBytes
	if segs == 0 {
		segs = DefaultSegmentCacheBytes
	}
	if prefixes == 0 {
		prefixes = DefaultPrefixCacheBytes
	}
	if completions == 0 {
		completions = DefaultCompletionCacheBytes
	}
	if renders == 0 {
		renders = DefaultRenderCacheBytes
	}
	if idText == 0 {
		idText = DefaultIDTextCacheBytes
	}
	return max(segs, 0), max(prefixes, 0), max(completions, 0), max(renders, 0), max(idText, 0)
}

// minCachedSegment is the length below which a segment is encoded directly (the tokenizer's word cache
// makes that as cheap as an LRU lookup).
const minCachedSegment = 64

// New builds a Model from a loaded tokenizer and a renderer (nil for a model without chat template), with
// the default cache sizes.
func New(tok *tokenizer.Tokenizer, tmpl Renderer) *Model { return NewWithOptions(tok, tmpl, Options{}) }

// NewWithOptions is New with explicit cache sizes.
func NewWithOptions(tok *tokenizer.Tokenizer, tmpl Renderer, opts Options) *Model {
	segs, prefixes, completions, renders, idText := opts.limits()
	return &Model{tok: tok, tmpl: tmpl, segs: newSegmentCache(segs), prefixes: newPrefixCache(prefixes),
		completions: newPrefixCache(completions), prompts: chattemplate.NewPromptCache(renders), idText: newIDTextCache(idText)}
}

// Tokenizer returns the model's tokenizer.
func (m *Model) Tokenizer() *tokenizer.Tokenizer { return m.tok }

// EncodeChat renders an OpenAI chat request body (messages, tools, add_generation_prompt,
// chat_template_kwargs, ...) with the chat template and encodes the prompt without adding special tokens
// (the template writes them, and vLLM encodes chat prompts with add_special_tokens=false). Errors are the
// renderer's (*chattemplate.RenderError, *chattemplate.RequestError) or ErrNoChatTemplate. The IDs are
// read-only, as EncodePrompt's.
func (m *Model) EncodeChat(body []byte) (prompt string, ids []uint32, err error) {
	if m.tmpl == nil {
		return "", nil, ErrNoChatTemplate
	}
	if cr, ok := m.tmpl.(CachedRenderer); ok {
		prompt, err = cr.RenderCached(context.Background(), body, m.prompts)
	} else {
		prompt, err = m.tmpl.Render(body)
	}
	if err != nil {
		return "", nil, err
	}
	return prompt, m.EncodePrompt(prompt), nil
}

// RequestRenderer is a Renderer that also renders a chat body already decoded by chattemplate.ParseRequest
// (*chattemplate.Template implements it).
type RequestRenderer interface {
	// RenderRequest renders r exactly as Render renders the body r was parsed from.
	RenderRequest(ctx context.Context, r *chattemplate.Request) (string, error)
}

// EncodeChatRequest is EncodeChat for a chat body already decoded by chattemplate.ParseRequest (the
// gateway's openai.ParseRequest does it while reading the routing fields), so the body is not scanned
// again: same prompt, same IDs, same errors. A renderer that is not a RequestRenderer renders r.Body().
func (m *Model) EncodeChatRequest(r *chattemplate.Request) (prompt string, ids []uint32, err error) {
	if m.tmpl == nil {
		return "", nil, ErrNoChatTemplate
	}
	prompt, err = m.render(r)
	if err != nil {
		return "", nil, err
	}
	return prompt, m.EncodePrompt(prompt), nil
}

// CachedRenderer is a RequestRenderer that renders through a chattemplate.PromptCache
// (*chattemplate.Template implements it): the same prompts and errors as Render and RenderRequest, and
// the next turn of a conversation writes only its new messages. The Model passes its own cache.
type CachedRenderer interface {
	RenderCached(ctx context.Context, body []byte, pc *chattemplate.PromptCache) (string, error)
	RenderRequestCached(ctx context.Context, r *chattemplate.Request, pc *chattemplate.PromptCache) (string, error)
}

// render renders a decoded chat request through the model's rendered-prompt cache when the renderer
// takes one. The prompt of a cached render shares memory with the conversation's previous prompt, which
// makes EncodePrompt's comparison with the cached prefix cost nothing (the same pointer).
func (m *Model) render(r *chattemplate.Request) (string, error) {
	switch rr := m.tmpl.(type) {
	case CachedRenderer:
		return rr.RenderRequestCached(context.Background(), r, m.prompts)
	case RequestRenderer:
		return rr.RenderRequest(context.Background(), r)
	}
	return m.tmpl.Render(r.Body())
}

// EncodePrompt encodes an already rendered prompt without adding special tokens, through the prefix and
// segment caches. It returns exactly m.Tokenizer().Encode(prompt, false).
//
// The result is read-only: it may share memory with the prefix cache and with the results of other calls
// (the same conversation's earlier and later turns), so the caller must not write its elements (writing
// would corrupt later results of that conversation); slices.Clone it to own a copy. Its capacity equals
// its length, so appending to it copies it and is safe.
func (m *Model) EncodePrompt(prompt string) []uint32 {
	var ends iter.Seq[int] // where a cached prefix may end
	if len(prompt) > minPrefix && m.prefixes.enabled() {
		ends = func(yield func(int) bool) { m.prefixes.probeEnds(prompt, m.tok.AddedTokenEnds, yield) }
	}
	prompt, hit := m.prefixes.longest(prompt, ends)
	base, prefix, arena := hit.base, hit.ids, hit.arena
	var out []uint32 // the IDs of prompt[base:]
	var scratch *[]uint32
	if base > 0 {
		scratch = scratchIDs.Get().(*[]uint32)
		out = (*scratch)[:0]
	} else {
		// Byte-level BPE averages 3 to 4.5 bytes per token on text; /2 leaves room for code and CJK.
		out = make([]uint32, 0, len(prompt)/2+16)
	}
	rest := prompt[base:]
	lastStable, lastStableIDs, lastStableTok := -1, 0, ""
	m.tok.SplitAdded(rest, func(a, b int) {
		s := rest[a:b]
		if atStart := base+a == 0; atStart || len(s) < minCachedSegment {
			// The run that starts the prompt may encode differently (Metaspace prepend_scheme "first"):
			// it is never taken from or put into the cache.
			out = m.tok.AppendEncodeText(out, s, atStart)
			return
		}
		if ids, ok := m.segs.get(s); ok {
			out = append(out, ids...)
			return
		}
		start := len(out)
		out = m.tok.AppendEncodeText(out, s, false)
		m.segs.put(strings.Clone(s), append([]uint32(nil), out[start:]...))
	}, func(a, b int, id uint32, stable bool) {
		out = append(out, id)
		if stable {
			lastStable, lastStableIDs, lastStableTok = base+b, len(out), rest[a:b]
		}
	})
	if base == 0 {
		if lastStable < minPrefix || !m.prefixes.enabled() {
			return view(out, len(out)) // nothing shares it, but the contract is the same
		}
		if cap(out) > arenaCap(len(out)) {
			// Do not keep the estimate's spare capacity (a copy, next to a full encode).
			out = append(make([]uint32, 0, arenaCap(len(out))), out...)
		}
		arena = newArena(out)
		m.prefixes.noteEnd(lastStableTok)
		m.prefixes.put(prompt, lastStable, view(out, lastStableIDs), arena, len(prompt)+4*cap(out))
		return view(out, len(out))
	}
	ids, capacity, ok := arena.Extend(len(prefix), out)
	switch {
	case ok:
		if lastStable > base {
			m.prefixes.noteEnd(lastStableTok)
			m.prefixes.put(prompt, lastStable, view(ids, len(prefix)+lastStableIDs), arena, len(prompt)+4*capacity)
		}
	default:
		// A branch (an edited or regenerated message): the cached prefix's array continues with other
		// IDs. The result is a fresh copy, and the cache keeps only the prefix's view and the IDs after
		// it (a regenerated answer repeated many times must not keep a copy of the prefix each).
		n := len(prefix) + len(out)
		ids = make([]uint32, n)
		copy(ids[copy(ids, prefix):], out)
		ids = view(ids, n)
		if lastStable > base {
			m.prefixes.noteEnd(lastStableTok)
			m.prefixes.putBranch(prompt, lastStable, prefix, slices.Clone(out[:lastStableIDs]), len(prompt)+4*n)
		}
	}
	if cap(out) <= maxScratchIDs {
		*scratch = out[:0]
		scratchIDs.Put(scratch)
	}
	return ids
}

// scratchIDs holds the buffers (*[]uint32) EncodePrompt encodes a cached prefix's continuation into before
// appending it to the prefix's arena; buffers above maxScratchIDs are dropped.
var scratchIDs = sync.Pool{New: func() any { return new([]uint32) }}

const maxScratchIDs = 1 << 16

// Load reads an HF model directory: the tokenizer (tokenizer.json or tokenizer.json.gz,
// tokenizer_config.json) and the chat template (gateway/internal/chattemplate.Load). A directory without a chat
// template loads; its EncodeChat returns ErrNoChatTemplate.
func Load(dir string) (*Model, error) { return LoadWithOptions(dir, Options{}) }

// LoadWithOptions is Load with explicit cache sizes.
func LoadWithOptions(dir string, opts Options) (*Model, error) {
	tok, err := tokenizer.Load(dir)
	if err != nil {
		return nil, err
	}
	tmpl, err := loadTemplate(dir)
	if err != nil {
		return nil, fmt.Errorf("model: %s: %w", dir, err)
	}
	return NewWithOptions(tok, tmpl, opts), nil
}
