package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// addedToken is one entry of tokenizer.json's added_tokens.
type addedToken struct {
	id         uint32
	content    string // the token's text, as decoded
	match      string // the text matched in the input (content, normalized when normalized is true)
	decoded    string // content in model space (raw bytes for byte-level models), as Decode sees it
	singleWord bool
	lstrip     bool
	rstrip     bool
	normalized bool
	special    bool
}

// matcher finds added tokens leftmost-longest (HF uses an Aho-Corasick automaton in LeftmostLongest mode;
// a byte trie probed only at bytes that can start a token gives the same matches).
type matcher struct {
	first  [256]bool
	nodes  []trieNode
	toks   []addedToken
	maxLen int // longest match string, in bytes

	last  [256]bool  // bytes that end a match string
	rtrie []trieNode // the match strings reversed, for finding where tokens end scanning backwards
}

type trieNode struct {
	next map[byte]int32
	tok  int32 // index into toks of the token ending here, -1 if none
}

func newMatcher(toks []addedToken) *matcher {
	if len(toks) == 0 {
		return nil
	}
	m := &matcher{toks: toks, nodes: []trieNode{{tok: -1}}}
	for i, t := range toks {
		if t.match == "" {
			continue
		}
		m.first[t.match[0]] = true
		m.maxLen = max(m.maxLen, len(t.match))
		n := int32(0)
		for k := 0; k < len(t.match); k++ {
			c := t.match[k]
			if m.nodes[n].next == nil {
				m.nodes[n].next = map[byte]int32{}
			}
			nx, ok := m.nodes[n].next[c]
			if !ok {
				nx = int32(len(m.nodes))
				m.nodes = append(m.nodes, trieNode{tok: -1})
				m.nodes[n].next[c] = nx
			}
			n = nx
		}
		m.nodes[n].tok = int32(i) // a later duplicate wins, as in HF's map
	}
	m.rtrie = []trieNode{{tok: -1}}
	for i, t := range toks {
		if t.match == "" {
			continue
		}
		m.last[t.match[len(t.match)-1]] = true
		n := int32(0)
		for k := len(t.match) - 1; k >= 0; k-- {
			c := t.match[k]
			if m.rtrie[n].next == nil {
				m.rtrie[n].next = map[byte]int32{}
			}
			nx, ok := m.rtrie[n].next[c]
			if !ok {
				nx = int32(len(m.rtrie))
				m.rtrie = append(m.rtrie, trieNode{tok: -1})
				m.rtrie[n].next[c] = nx
			}
			n = nx
		}
		m.rtrie[n].tok = int32(i)
	}
	return m
}

// endsAt reports whether some match string ends exactly at s[:p].
func (m *matcher) endsAt(s string, p int) bool {
	if p == 0 || !m.last[s[p-1]] {
		return false
	}
	n := int32(0)
	for j := p - 1; j >= 0; j-- {
		nx, ok := m.rtrie[n].next[s[j]]
		if !ok {
			return false
		}
		n = nx
		if m.rtrie[n].tok >= 0 {
			return true
		}
	}
	return false
}

// find returns the leftmost-longest match at or after from: its byte range and token index, or tok -1.
func (m *matcher) find(s string, from int) (start, end int, tok int32) {
	for i := from; i < len(s); i++ {
		if !m.first[s[i]] {
			continue
		}
		n, best, bestEnd := int32(0), int32(-1), 0
		for j := i; j < len(s); j++ {
			nx, ok := m.nodes[n].next[s[j]]
			if !ok {
				break
			}
			n = nx
			if m.nodes[n].tok >= 0 {
				best, bestEnd = m.nodes[n].tok, j+1
			}
		}
		if best >= 0 {
			return i, bestEnd, best
		}
	}
	return -1, -1, -1
}

// split cuts s at added tokens the way HF's AddedVocabulary::find_matches does and calls text for each
// run of ordinary text and token for each matched added token, in order.
func (m *matcher) split(s string, text func(string), token func(uint32)) {
	if m == nil {
		if s != "" {
			text(s)
		}
		return
	}
	m.splitSpans(s, func(a, b int) { text(s[a:b]) }, func(_, _ int, at *addedToken) { token(at.id) })
}

// splitSpans is split reporting byte ranges: text(start, end) and token(start, end, token).
func (m *matcher) splitSpans(s string, text func(start, end int), token func(start, end int, at *addedToken)) {
	startOffset := 0
	for pos := 0; pos < len(s); {
		mStart, mEnd, ti := m.find(s, pos)
		if ti < 0 {
			break
		}
		pos = mEnd
		at := &m.toks[ti]
		start, stop := mStart, mEnd
		if at.singleWord {
			startSpace := start == 0 || !endsWithWord(s[:start])
			stopSpace := stop == len(s) || !startsWithWord(s[stop:])
			if !startSpace || !stopSpace {
				continue
			}
		}
		if at.lstrip {
			start = max(spaceLeftmostAtEnd(s[:start]), startOffset)
		}
		if at.rstrip {
			stop += spaceRightmostAtStart(s[stop:])
		}
		if start > startOffset {
			text(startOffset, start)
		}
		token(start, stop, at)
		startOffset = stop
	}
	if startOffset < len(s) {
		text(startOffset, len(s))
	}
}

// stableEnd reports whether the match of at ending at s[:b] would end at b whatever text follows b: the
// token neither extends over following whitespace (rstrip) nor looks at it (single_word), and no added
// token starting before b could still match past b (HF matches leftmost-longest).
func (m *matcher) stableEnd(s string, b int, at *addedToken) bool {
	if at.rstrip || at.singleWord {
		return false
	}
	for q := max(0, b-m.maxLen+1); q < b; q++ {
		if !m.first[s[q]] {
			continue
		}
		n, alive := int32(0), true
		for j := q; j < b; j++ {
			nx, ok := m.nodes[n].next[s[j]]
			if !ok {
				alive = false
				break
			}
			n = nx
		}
		if alive && len(m.nodes[n].next) > 0 {
			return false
		}
	}
	return true
}

func isWordChar(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) }

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return s != "" && isWordChar(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return s != "" && isWordChar(r)
}

// spaceLeftmostAtEnd returns the byte index where the trailing whitespace of s begins.
func spaceLeftmostAtEnd(s string) int {
	i := len(s)
	for i > 0 {
		r, size := utf8.DecodeLastRuneInString(s[:i])
		if !unicode.IsSpace(r) {
			break
		}
		i -= size
	}
	return i
}

// spaceRightmostAtStart returns the byte length of the leading whitespace of s.
func spaceRightmostAtStart(s string) int {
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsSpace(r) {
			break
		}
		i += size
	}
	return i
}
