package tokenizer

import (
	"golang.org/x/text/unicode/norm"
	"strings"
	"unicode"
	"unicode/utf8"
)

// TextCuts reports whether the tokenizer has text cuts (see TextCutsBefore): true for the pre-tokenizers
// whose pieces provably never span a newline followed by a letter (the Qwen2/3 and Llama-3 split, DeepSeek-V3's
// three splits), with no normalizer or NFC, no post-processor suffix, and no added token that could match
// across such a cut. Other tokenizers (Llama-2 and Gemma's whole-text BPE, GPT-2's split, Metaspace) have
// none: their callers encode the whole text.
func (t *Tokenizer) TextCuts() bool { return t.textCuts }

// textCutsSafe computes Tokenizer.textCuts once the tokenizer is built.
func (t *Tokenizer) textCutsSafe() bool {
	_, gpt := t.scanner.(*gptScanner)
	_, deepseek := t.pre.(deepseekScanner)
	if !(gpt && t.pre == nil) && !(deepseek && t.scanner == nil) {
		return false
	}
	switch n := t.norm.(type) {
	case nil:
	case unicodeNorm:
		// NFC: a newline is a starter that composes with nothing, so NFC(a+"\n"+b) is NFC(a+"\n")+NFC(b).
		if n.f != norm.NFC {
			return false
		}
	default:
		return false
	}
	if len(t.suffix) > 0 {
		return false
	}
	for _, at := range t.addedByID {
		if at.lstrip || at.rstrip || at.singleWord || crossesCut(at.match) || crossesCut(at.content) {
			return false
		}
	}
	return true
}

// crossesCut reports whether s holds a newline followed by a letter (an added token matched across a cut).
func crossesCut(s string) bool {
	for i := strings.IndexByte(s, '\n'); i >= 0; {
		if isCutLetter(s, i+1) {
			return true
		}
		j := strings.IndexByte(s[i+1:], '\n')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return false
}

// isCutLetter reports whether s[i:] starts with a letter (\p{L}).
func isCutLetter(s string, i int) bool {
	if i >= len(s) {
		return false
	}
	if c := s[i]; c < utf8.RuneSelf {
		return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
	}
	r, _ := utf8.DecodeRuneInString(s[i:])
	return unicode.IsLetter(r)
}

// TextCutsBefore calls fn with the text cuts of s below end, from end backwards, until fn returns false:
// the positions p (0 < p < end) with s[p-1] == '\n' and a letter starting at s[p]. When TextCuts is true,
// Encode(s, false) equals Encode(s[:p], false) followed by Encode(s[p:], false) for every such p and any
// s (RATIONALE.md, "Text cuts"); s must be valid UTF-8. It calls nothing when TextCuts is false.
func (t *Tokenizer) TextCutsBefore(s string, end int, fn func(p int) bool) {
	if !t.textCuts {
		return
	}
	end = min(end, len(s))
	for hi := end; hi > 0; {
		i := strings.LastIndexByte(s[:hi-1], '\n')
		if i < 0 {
			return
		}
		if p := i + 1; p < end && isCutLetter(s, p) && !fn(p) {
			return
		}
		hi = i + 1
	}
}
