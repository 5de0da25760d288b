package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// The three Split patterns of DeepSeek-V3's pre-tokenizer, applied in sequence (each to the pieces of the
// previous one), then ByteLevel. They are written as Go interpreted strings, which decode exactly like the
// JSON strings of tokenizer.json (the third pattern holds real CR and LF characters).
const (
	deepseekDigits = "\\p{N}{1,3}"
	deepseekCJK    = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
	deepseekWords  = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
)

// deepseekScanner implements DeepSeek-V3's three splits by hand: the text is cut into runs of up to three
// numbers, runs of CJK ideographs and kana, and runs of everything else (splits 1 and 2, Isolated); the word
// pattern (split 3) then cuts each run that is not a number on its own, so its matches end where the run
// ends, and characters it does not match form pieces of their own (Isolated keeps the gaps).
// TestScannersMatchRegexp2 compares it with regexp2 running the three patterns; the goldens pin it to HF.
type deepseekScanner struct{}

// Character classes of the DeepSeek word pattern.
const (
	dOther = iota // none of the below (controls, format characters, ...)
	dLM           // \p{L} or \p{M}
	dPS           // \p{P} or \p{S}
	dSpace        // \s except \r and \n
	dNL           // \r or \n
)

// Run kinds of the first two splits.
const (
	runOther = iota
	runNumber
	runCJK
)

var deepseekASCII, deepseekASCIIRun [utf8.RuneSelf]uint8

func init() {
	for c := 0; c < utf8.RuneSelf; c++ {
		deepseekASCII[c] = deepseekClassOf(rune(c))
		deepseekASCIIRun[c] = runKindOf(rune(c))
	}
}

func runKindOf(r rune) uint8 {
	switch {
	case unicode.IsNumber(r):
		return runNumber
	case r >= 0x4e00 && r <= 0x9fa5, r >= 0x3040 && r <= 0x309f, r >= 0x30a0 && r <= 0x30ff:
		return runCJK
	}
	return runOther
}

func deepseekClassOf(r rune) uint8 {
	switch {
	case unicode.IsLetter(r) || unicode.IsMark(r):
		return dLM
	case unicode.IsPunct(r) || unicode.IsSymbol(r):
		return dPS
	case r == '\r' || r == '\n':
		return dNL
	case unicode.IsSpace(r):
		return dSpace
	}
	return dOther
}

// runAt returns the run kind and width of the character at s[i].
func runAt(s string, i int) (uint8, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return deepseekASCIIRun[c], 1
	}
	r, w := utf8.DecodeRuneInString(s[i:])
	return runKindOf(r), w
}

// dat returns the word-pattern class and width of the character at s[i].
func dat(s string, i int) (uint8, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return deepseekASCII[c], 1
	}
	r, w := utf8.DecodeRuneInString(s[i:])
	return deepseekClassOf(r), w
}

func isASCIILetter(c byte) bool { return (c|0x20) >= 'a' && (c|0x20) <= 'z' }

func (d deepseekScanner) each(s string, first bool, fn func(string, bool)) {
	for i := 0; i < len(s); {
		k, w := runAt(s, i)
		j := i + w
		n := 1
		for j < len(s) {
			k2, w2 := runAt(s, j)
			if k2 != k || (k == runNumber && n == 3) {
				break
			}
			j += w2
			n++
		}
		if k == runNumber {
			fn(s[i:j], first && i == 0)
		} else {
			d.words(s[i:j], first && i == 0, fn)
		}
		i = j
	}
}

// words applies the word pattern to one run.
func (d deepseekScanner) words(s string, first bool, fn func(string, bool)) {
	for i := 0; i < len(s); {
		c, w := dat(s, i)
		j := d.word(s, i, c, w)
		if j < 0 {
			// A gap: characters where no alternative matches, up to the next match.
			j = i + w
			for j < len(s) {
				c2, w2 := dat(s, j)
				if d.word(s, j, c2, w2) > 0 {
					break
				}
				j += w2
			}
		}
		fn(s[i:j], first && i == 0)
		i = j
	}
}

// word returns the end of the word-pattern match at s[i] (class c, width w), or -1.
func (deepseekScanner) word(s string, i int, c uint8, w int) int {
	// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+
	if s[i] < utf8.RuneSelf && c == dPS && i+1 < len(s) && isASCIILetter(s[i+1]) {
		j := i + 2
		for j < len(s) && isASCIILetter(s[j]) {
			j++
		}
		return j
	}
	// [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ (a mark may be the optional character or start the run: the
	// match is the same run either way)
	if c == dLM {
		return lmRun(s, i+w)
	}
	if (c == dSpace || c == dOther) && i+w < len(s) {
		if c2, w2 := dat(s, i+w); c2 == dLM {
			return lmRun(s, i+w+w2)
		}
	}
	//  ?[\p{P}\p{S}]+[\r\n]*
	j := -1
	if c == dPS {
		j = i
	} else if s[i] == ' ' && i+1 < len(s) {
		if c2, _ := dat(s, i+1); c2 == dPS {
			j = i + 1
		}
	}
	if j >= 0 {
		for j < len(s) {
			c2, w2 := dat(s, j)
			if c2 != dPS {
				break
			}
			j += w2
		}
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	if c != dSpace && c != dNL {
		return -1
	}
	// \s*[\r\n]+ | \s+(?!\S) | \s+
	return spaceRun(s, i, dat, dSpace, dNL)
}

// lmRun returns the end of the run of letters and marks starting at s[j].
func lmRun(s string, j int) int {
	for j < len(s) {
		c, w := dat(s, j)
		if c != dLM {
			break
		}
		j += w
	}
	return j
}
