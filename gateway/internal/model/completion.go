package model

import (
	"slices"
)

// EncodeCompletion encodes a completions prompt with special tokens added (e.g. Llama's BOS), as vLLM does:
// exactly m.Tokenizer().Encode(prompt, true).
//
// For a tokenizer with text cuts (tokenizer.TextCuts: Qwen2/3, Llama-3, DeepSeek-V3) a completions prefix
// cache keeps the IDs of each prompt up to its last text cut (a newline followed by a letter), so a prompt
// that extends a recently seen one (the next turn of an agent that renders its own prompts) encodes only
// what follows that cut. The result is read-only, as EncodePrompt's, and clipped (cap == len). Other
// tokenizers encode the whole prompt.
//
// The next prompt appends its IDs in place after the cached prefix when the IDs of the previous prompt's
// last line are the start of its own (a prompt ending "\nAssistant:" continued by " answer..."); when
// they are not (the previous prompt ended inside a word or with punctuation its continuation merges with),
// the prefix's IDs are copied once, as for a branch of a chat (RATIONALE.md).
func (m *Model) EncodeCompletion(prompt string) []uint32 {
	if len(prompt) <= minPrefix || !m.completions.enabled() || !m.tok.TextCuts() {
		ids := m.tok.Encode(prompt, true)
		return view(ids, len(ids))
	}
	probes := 0
	prompt, hit := m.completions.longest(prompt, func(yield func(int) bool) {
		m.tok.TextCutsBefore(prompt, len(prompt), func(p int) bool {
			if p < minPrefix || probes == maxProbes {
				return false
			}
			probes++
			return yield(p)
		})
	})
	base, head, arena := hit.base, hit.ids, hit.arena
	// The cuts below are found in the repaired prompt.
	cut := -1 // the prompt's last text cut after base: where the next cached prefix ends
	m.tok.TextCutsBefore(prompt, len(prompt), func(p int) bool {
		if p > base && p >= minPrefix {
			cut = p
		}
		return false
	})
	// out holds the IDs after base: [BOS when base == 0] prompt[base:cut], then prompt[cut:].
	var out []uint32
	var scratch *[]uint32
	if base > 0 {
		scratch = scratchIDs.Get().(*[]uint32)
		out = (*scratch)[:0]
	} else {
		out = make([]uint32, 0, len(prompt)/2+16)
		out = append(out, m.tok.SpecialPrefix()...)
	}
	mid := len(out)
	if cut > 0 {
		out = m.tok.AppendEncode(out, prompt[base:cut], false)
		mid = len(out)
		out = m.tok.AppendEncode(out, prompt[cut:], false)
	} else {
		out = m.tok.AppendEncode(out, prompt[base:], false)
	}
	if base == 0 {
		if cut < 0 {
			return view(out, len(out))
		}
		if cap(out) > arenaCap(len(out)) {
			out = append(make([]uint32, 0, arenaCap(len(out))), out...)
		}
		arena = newArena(out)
		m.completions.put(prompt, cut, view(out, mid), arena, len(prompt)+4*cap(out))
		return view(out, len(out))
	}
	ids, capacity, ok := arena.Extend(len(head), out)
	switch {
	case ok:
		if cut > 0 {
			m.completions.put(prompt, cut, view(ids, len(head)+mid), arena, len(prompt)+4*capacity)
		}
	default:
		// A branch: the cached prefix's array continues with another prompt's IDs (see EncodePrompt).
		n := len(head) + len(out)
		ids = make([]uint32, n)
		copy(ids[copy(ids, head):], out)
		ids = view(ids, n)
		if cut > 0 {
			m.completions.putBranch(prompt, cut, head, slices.Clone(out[:mid]), len(prompt)+4*n)
		}
	}
	if cap(out) <= maxScratchIDs {
		*scratch = out[:0]
		scratchIDs.Put(scratch)
	}
	return ids
}
