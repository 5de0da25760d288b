package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// preTokenizer cuts normalized text into pieces (HF's PreTokenizer). Offsets are not tracked except for
// one bit: first says that s starts at offset 0 of the encoded text (HF's offsets_original().0 == 0),
// which Metaspace's prepend_scheme "first" depends on.
type preTokenizer interface {
	// each calls fn with every non-empty piece of s, in order, and whether that piece starts the text.
	each(s string, first bool, fn func(piece string, first bool))
}

type preJSON struct {
	Type          string            `json:"type"`
	Pretokenizers []json.RawMessage `json:"pretokenizers"`
	Pattern       struct {
		String *string `json:"String"`
		Regex  *string `json:"Regex"`
	} `json:"pattern"`
	Behavior       string  `json:"behavior"`
	Invert         bool    `json:"invert"`
	AddPrefixSpace bool    `json:"add_prefix_space"`
	UseRegex       *bool   `json:"use_regex"`
	Replacement    string  `json:"replacement"`
	PrependScheme  *string `json:"prepend_scheme"`
	Split          *bool   `json:"split"`
}

// The split patterns of Qwen2/3 and Llama-3 (they differ only in how many digits a number piece holds),
// which gptScanner implements by hand.
const (
	qwenPattern   = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// gpt2Pattern is what ByteLevel(use_regex=true) splits with.
	gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// buildPreTokenizer returns the generic pre-tokenizer chain, whether the model is byte-level, and, when the
// whole chain is the Qwen/Llama-3 split, the hand scanner alone (pre is nil then).
func buildPreTokenizer(raw json.RawMessage, path string) (pre preTokenizer, byteLevel bool, scan pieceScanner, err error) {
	stages, byteLevel, err := preStages(raw, path)
	if err != nil {
		return nil, false, nil, err
	}
	if isDeepseekChain(stages) {
		return deepseekScanner{}, byteLevel, nil, nil
	}
	switch len(stages) {
	case 0:
		return nil, byteLevel, nil, nil
	case 1:
		if s, ok := stages[0].(*gptScanner); ok {
			return nil, byteLevel, s, nil
		}
		return stages[0], byteLevel, nil, nil
	}
	return seqPre(stages), byteLevel, nil, nil
}

// pieceScanner is a hand-written pre-tokenizer: next returns the end of the piece starting at s[i].
type pieceScanner interface {
	next(s string, i int) int
}

// isDeepseekChain reports whether stages are exactly DeepSeek-V3's three isolated regex splits.
func isDeepseekChain(stages []preTokenizer) bool {
	if len(stages) != 3 {
		return false
	}
	for k, want := range []string{deepseekDigits, deepseekCJK, deepseekWords} {
		sp, ok := stages[k].(*splitPre)
		if !ok || sp.re == nil || sp.pattern != want || sp.behavior != "Isolated" || sp.invert {
			return false
		}
	}
	return true
}

// preStages flattens Sequence and drops stages that are no-ops on raw bytes (ByteLevel without prefix
// space or regex: this package keeps the vocab in raw bytes, so the byte-to-unicode mapping is implicit).
func preStages(raw json.RawMessage, path string) ([]preTokenizer, bool, error) {
	if isNull(raw) {
		return nil, false, nil
	}
	var p preJSON
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, false, fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	switch p.Type {
	case "Sequence":
		var out []preTokenizer
		bl := false
		for i, r := range p.Pretokenizers {
			s, b, err := preStages(r, fmt.Sprintf("%s.pretokenizers[%d]", path, i))
			if err != nil {
				return nil, false, err
			}
			out = append(out, s...)
			bl = bl || b
		}
		return out, bl, nil
	case "ByteLevel":
		var out []preTokenizer
		if p.AddPrefixSpace {
			out = append(out, prefixSpacePre{})
		}
		if p.UseRegex == nil || *p.UseRegex {
			re, err := compileRegex(gpt2Pattern, path)
			if err != nil {
				return nil, false, err
			}
			out = append(out, &splitPre{re: re, behavior: "Isolated"})
		}
		return out, true, nil
	case "Split":
		if p.Pattern.Regex != nil && !p.Invert && p.Behavior == "Isolated" {
			switch *p.Pattern.Regex {
			case qwenPattern:
				return []preTokenizer{&gptScanner{maxDigits: 1}}, false, nil
			case llama3Pattern:
				return []preTokenizer{&gptScanner{maxDigits: 3}}, false, nil
			}
		}
		sp := &splitPre{behavior: p.Behavior, invert: p.Invert}
		switch p.Behavior {
		case "Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous":
		default:
			return nil, false, unsupported(path, "Split", "behavior "+p.Behavior)
		}
		switch {
		case p.Pattern.String != nil:
			if *p.Pattern.String == "" {
				return nil, false, unsupported(path, "Split", "empty pattern")
			}
			sp.lit = *p.Pattern.String
		case p.Pattern.Regex != nil:
			re, err := compileRegex(*p.Pattern.Regex, path)
			if err != nil {
				return nil, false, err
			}
			sp.re, sp.pattern = re, *p.Pattern.Regex
		default:
			return nil, false, unsupported(path, "Split", "missing pattern")
		}
		return []preTokenizer{sp}, false, nil
	case "Metaspace":
		scheme := "always"
		if p.PrependScheme != nil {
			scheme = *p.PrependScheme
		}
		if scheme != "always" && scheme != "never" && scheme != "first" {
			return nil, false, unsupported(path, "Metaspace", "prepend_scheme "+scheme)
		}
		rep := p.Replacement
		if rep == "" {
			rep = "\u2581"
		}
		return []preTokenizer{&metaspacePre{rep: rep, scheme: scheme, split: p.Split == nil || *p.Split}}, false, nil
	}
	return nil, false, unsupported(path, p.Type, "")
}

func compileRegex(pat, path string) (*regexp2.Regexp, error) {
	re, err := regexp2.Compile(pat, regexp2.None)
	if err != nil {
		return nil, unsupported(path, "Split", fmt.Sprintf("regex %q: %v", pat, err))
	}
	return re, nil
}

type seqPre []preTokenizer

func (s seqPre) each(x string, first bool, fn func(string, bool)) { s.run(0, x, first, fn) }

func (s seqPre) run(k int, x string, first bool, fn func(string, bool)) {
	if k == len(s) {
		fn(x, first)
		return
	}
	s[k].each(x, first, func(p string, f bool) { s.run(k+1, p, f, fn) })
}

// prefixSpacePre is ByteLevel's add_prefix_space: a space before any piece not starting with one.
type prefixSpacePre struct{}

func (prefixSpacePre) each(s string, first bool, fn func(string, bool)) {
	if s != "" && s[0] != ' ' {
		s = " " + s
	}
	if s != "" {
		fn(s, first)
	}
}

// metaspacePre is HF's Metaspace pre-tokenizer: spaces become the replacement character, which is
// prepended to every piece (scheme "always"), to the piece that starts the text ("first") or never.
type metaspacePre struct {
	rep    string
	scheme string
	split  bool
}

func (m *metaspacePre) each(s string, first bool, fn func(string, bool)) {
	s = strings.ReplaceAll(s, " ", m.rep)
	if (m.scheme == "always" || (m.scheme == "first" && first)) && s != "" && !strings.HasPrefix(s, m.rep) {
		s = m.rep + s
	}
	if !m.split {
		if s != "" {
			fn(s, first)
		}
		return
	}
	(&splitPre{lit: m.rep, behavior: "MergedWithNext"}).each(s, first, fn)
}

// splitPre is HF's Split pre-tokenizer on a literal or a regexp2 pattern.
type splitPre struct {
	lit      string
	re       *regexp2.Regexp
	pattern  string // the regex source, when re is set
	behavior string
	invert   bool
}

type span struct {
	start, end int
	match      bool
}

// spans covers s with alternating match / non-match ranges (HF's Pattern::find_matches).
func (sp *splitPre) spans(s string) []span {
	var out []span
	prev := 0
	add := func(a, b int) {
		if a > prev {
			out = append(out, span{prev, a, false})
		}
		out = append(out, span{a, b, true})
		prev = b
	}
	if sp.lit != "" {
		for i := 0; i < len(s); {
			k := strings.Index(s[i:], sp.lit)
			if k < 0 {
				break
			}
			add(i+k, i+k+len(sp.lit))
			i += k + len(sp.lit)
		}
	} else {
		// regexp2 reports rune offsets; walk a byte cursor alongside.
		runePos, bytePos := 0, 0
		toByte := func(r int) int {
			for runePos < r {
				_, w := utf8.DecodeRuneInString(s[bytePos:])
				bytePos += w
				runePos++
			}
			return bytePos
		}
		m, err := sp.re.FindStringMatch(s)
		for err == nil && m != nil {
			if m.Length > 0 {
				a := toByte(m.Index)
				b := toByte(m.Index + m.Length)
				add(a, b)
			}
			m, err = sp.re.FindNextMatch(m)
		}
	}
	if prev < len(s) {
		out = append(out, span{prev, len(s), false})
	}
	if sp.invert {
		for i := range out {
			out[i].match = !out[i].match
		}
	}
	return out
}

func (sp *splitPre) each(s string, first bool, fn func(string, bool)) {
	sps := sp.spans(s)
	switch sp.behavior {
	case "Isolated":
	case "Removed":
		k := 0
		for _, x := range sps {
			if !x.match {
				sps[k] = x
				k++
			}
		}
		sps = sps[:k]
	case "Contiguous":
		k := 0
		for i, x := range sps {
			if i > 0 && sps[k-1].match == x.match {
				sps[k-1].end = x.end
				continue
			}
			sps[k] = x
			k++
		}
		sps = sps[:k]
	case "MergedWithPrevious":
		var out []span
		prevMatch := false
		for _, x := range sps {
			if x.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].end = x.end
			} else {
				out = append(out, x)
			}
			prevMatch = x.match
		}
		sps = out
	case "MergedWithNext":
		var out []span
		prevMatch := false
		for i := len(sps) - 1; i >= 0; i-- {
			x := sps[i]
			if x.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].start = x.start
			} else {
				out = append(out, x)
			}
			prevMatch = x.match
		}
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
		sps = out
	}
	for _, x := range sps {
		if x.end > x.start {
			fn(s[x.start:x.end], first && x.start == 0)
		}
	}
}
