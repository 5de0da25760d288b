package tokenizer

import "strings"

// TokenString returns the token an ID stands for as the tokenizer file spells it, as HF's
// convert_ids_to_tokens does (vLLM's /tokenize token_strs): an added token's content, or a vocab entry in
// the file's own alphabet (GPT-2 byte-level for byte-level models, e.g. "Ġthe"). ok is false for an ID the
// tokenizer does not define.
func (t *Tokenizer) TokenString(id uint32) (tok string, ok bool) {
	if at, ok := t.addedByID[id]; ok {
		return at.content, true
	}
	if !t.model.vocab.defines(id) {
		return "", false
	}
	raw := t.model.vocab.token(id)
	if !t.byteLevel {
		return raw, true
	}
	var b strings.Builder
	for i := 0; i < len(raw); i++ {
		b.WriteRune(byteToRune[raw[i]])
	}
	return b.String(), true
}

// Defines reports whether id is a token of the tokenizer (a vocab entry or an added token).
func (t *Tokenizer) Defines(id uint32) bool {
	if _, ok := t.addedByID[id]; ok {
		return true
	}
	return t.model.vocab.defines(id)
}
