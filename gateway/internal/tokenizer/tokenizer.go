package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// Tokenizer encodes text to token IDs and back exactly like HF tokenizers for one model. Build it with
// Load or New. All methods are safe for concurrent use.
type Tokenizer struct {
	model     *bpe
	byteLevel bool // vocab is GPT-2 byte-level (kept as raw bytes here)
	norm      normalizer
	pre       preTokenizer
	scanner   pieceScanner // set instead of pre for the Qwen/Llama-3 split (DeepSeek-V3's is a pre)
	dec       decoder

	addedByID      map[uint32]addedToken
	addedByContent map[string]uint32
	rawAdded       *matcher // added tokens with normalized=false, matched on the raw text
	normAdded      *matcher // added tokens with normalized=true, matched on normalized text

	prefix, suffix []uint32 // post-processor IDs around the text when addSpecial is true

	bosToken, eosToken string // from tokenizer_config.json

	cache *wordCache

	textCuts bool // see TextCuts
}

// Encode returns the token IDs of text. With addSpecial the post-processor's special tokens are added
// (e.g. Llama's BOS), as HF does with add_special_tokens=true; chat prompts rendered from a template are
// encoded with addSpecial false because the template already writes them. Invalid UTF-8 is replaced by
// U+FFFD first.
func (t *Tokenizer) Encode(text string, addSpecial bool) []uint32 {
	return t.AppendEncode(make([]uint32, 0, len(text)/3+len(t.prefix)+len(t.suffix)+1), text, addSpecial)
}

// AppendEncode is Encode appending to dst, for callers that reuse a buffer.
func (t *Tokenizer) AppendEncode(dst []uint32, text string, addSpecial bool) []uint32 {
	if !utf8.ValidString(text) {
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	if addSpecial {
		dst = append(dst, t.prefix...)
	}
	e := encoder{t: t, out: dst}
	if t.rawAdded == nil {
		if text != "" {
			e.normalizeText(text, true)
		}
	} else {
		t.rawAdded.splitSpans(text, func(a, b int) { e.normalizeText(text[a:b], a == 0) },
			func(_, _ int, at *addedToken) { e.token(at.id) })
	}
	if addSpecial {
		e.out = append(e.out, t.suffix...)
	}
	return e.out
}

// encoder carries the output slice through the callbacks of one Encode call.
type encoder struct {
	t   *Tokenizer
	out []uint32
}

func (e *encoder) token(id uint32) { e.out = append(e.out, id) }

// normalizeText handles a run of text between raw-matched added tokens; first says it starts the input.
func (e *encoder) normalizeText(s string, first bool) {
	if e.t.norm != nil {
		s = e.t.norm.normalize(s)
	}
	if e.t.normAdded != nil {
		e.t.normAdded.splitSpans(s, func(a, b int) { e.preTokenize(s[a:b], first && a == 0) },
			func(_, _ int, at *addedToken) { e.token(at.id) })
		return
	}
	e.preTokenize(s, first)
}

func (e *encoder) preTokenize(s string, first bool) {
	t := e.t
	switch {
	case t.scanner != nil:
		for i := 0; i < len(s); {
			j := t.scanner.next(s, i)
			e.piece(s[i:j])
			i = j
		}
	case t.pre != nil:
		t.pre.each(s, first, e.pieceFirst)
	default:
		if s != "" {
			e.piece(s)
		}
	}
}

func (e *encoder) pieceFirst(w string, _ bool) { e.piece(w) }

// piece BPE-encodes one pre-token through the word cache.
func (e *encoder) piece(w string) {
	t := e.t
	if len(w) > maxCachedWord {
		e.out = t.model.encodeWord(e.out, w, t.byteLevel)
		return
	}
	out, h, ok := t.cache.get(e.out, w)
	if ok {
		e.out = out
		return
	}
	start := len(e.out)
	e.out = t.model.encodeWord(e.out, w, t.byteLevel)
	t.cache.put(h, w, e.out[start:])
}

// Decode turns IDs back into text like HF's decode(ids, skip_special_tokens=false): every token, added
// ones included, goes through the model's decoder chain (Gemma's "▁▁" added tokens decode to spaces).
// Unknown IDs are skipped.
func (t *Tokenizer) Decode(ids []uint32) string {
	toks := make([]string, 0, len(ids))
	for _, id := range ids {
		if at, ok := t.addedByID[id]; ok {
			toks = append(toks, at.decoded)
			continue
		}
		if t.model.vocab.defines(id) {
			toks = append(toks, t.model.vocab.token(id))
		}
	}
	return t.dec.decode(toks)
}

// TokenID returns the ID of a token: an added (special or not) token's content, or a vocab entry in the
// file's own spelling (GPT-2 byte-level alphabet for byte-level models, e.g. "Ġthe").
func (t *Tokenizer) TokenID(tok string) (uint32, bool) {
	if id, ok := t.addedByContent[tok]; ok {
		return id, true
	}
	key := tok
	if t.byteLevel {
		key = byteLevelDecode(tok)
	}
	return t.model.vocab.get(key)
}

// IsSpecial reports whether id is an added token flagged special.
func (t *Tokenizer) IsSpecial(id uint32) bool {
	at, ok := t.addedByID[id]
	return ok && at.special
}

// BOS returns the beginning-of-sequence token named by tokenizer_config.json and its ID; ok is false when
// the config names none or the token is unknown.
func (t *Tokenizer) BOS() (tok string, id uint32, ok bool) {
	if t.bosToken == "" {
		return "", 0, false
	}
	id, ok = t.TokenID(t.bosToken)
	return t.bosToken, id, ok
}

// EOS returns the end-of-sequence token named by tokenizer_config.json and its ID; ok is false when the
// config names none or the token is unknown.
func (t *Tokenizer) EOS() (tok string, id uint32, ok bool) {
	if t.eosToken == "" {
		return "", 0, false
	}
	id, ok = t.TokenID(t.eosToken)
	return t.eosToken, id, ok
}

// SpecialPrefix returns the IDs Encode(text, true) puts before the text (e.g. Llama's BOS); the caller must
// not modify the slice.
func (t *Tokenizer) SpecialPrefix() []uint32 { return t.prefix }

// SpecialSuffix returns the IDs Encode(text, true) puts after the text; the caller must not modify it.
func (t *Tokenizer) SpecialSuffix() []uint32 { return t.suffix }

// VocabSize returns one more than the largest token ID (model vocab and added tokens).
func (t *Tokenizer) VocabSize() int {
	n := t.model.vocab.size()
	for id := range t.addedByID {
		n = max(n, int(id)+1)
	}
	return n
}

// ResetCache empties the word cache (benchmarks use it to measure cold encoding).
func (t *Tokenizer) ResetCache() { t.cache.reset() }

// SplitAdded cuts text at added tokens exactly as the first step of Encode does (the tokens HF matches on
// the raw text: normalized=false), calling text for each run of ordinary text s[start:end] and token for
// each added token s[start:end] with its ID, in order. Encode(s, false) equals the concatenation of
// AppendEncodeText over the text runs and the token IDs, so a caller may cache the encoding of repeated
// runs (gateway/internal/model does, per chat turn).
//
// stable is true when the token's match would end at end whatever text followed it, so that
// Encode(s[:end]+x, false) starts with Encode(s[:end], false) for any x: a prefix of a prompt cut there can
// be cached. s must be valid UTF-8 (see Encode).
func (t *Tokenizer) SplitAdded(s string, text func(start, end int), token func(start, end int, id uint32, stable bool)) {
	if t.rawAdded == nil {
		if s != "" {
			text(0, len(s))
		}
		return
	}
	m := t.rawAdded
	m.splitSpans(s, text, func(a, b int, at *addedToken) {
		token(a, b, at.id, m.stableEnd(s, b, at))
	})
}

// AddedTokenEnds calls fn with every position p, from len(s) down to 1, where the text of an added token
// matched on the raw text ends (s[:p] ends with it), until fn returns false. These are the only places
// SplitAdded can report a token end; they are candidates, not matches (a match must still win the
// leftmost-longest scan). gateway/internal/model uses them to find a cached prompt prefix from the end of a new
// prompt without scanning all of it.
func (t *Tokenizer) AddedTokenEnds(s string, fn func(p int) bool) {
	m := t.rawAdded
	if m == nil {
		return
	}
	for p := len(s); p > 0; p-- {
		if m.endsAt(s, p) && !fn(p) {
			return
		}
	}
}

// AppendEncodeText appends the IDs of one run of text from SplitAdded (normalization, the normalized
// added tokens, pre-tokenization and BPE; no post-processor) to dst. atStart says the run starts the text
// (SplitAdded's start == 0): a Metaspace pre-tokenizer with prepend_scheme "first" treats that run
// differently, so a caller caching runs must not reuse one across that distinction.
func (t *Tokenizer) AppendEncodeText(dst []uint32, s string, atStart bool) []uint32 {
	e := encoder{t: t, out: dst}
	e.normalizeText(s, atStart)
	return e.out
}
