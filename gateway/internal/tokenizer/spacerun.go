package tokenizer

// spaceRun returns the end of the whitespace alternatives that close both split patterns (the GPT-style
// pattern of gptScanner and DeepSeek-V3's word pattern),
//
//	\s*[\r\n]+ | \s+(?!\S) | \s+
//
// matched leftmost-first at s[i], where s[i] is whitespace. class classifies the character at s[j] and
// returns its width; space is its class for whitespace other than CR and LF, nl its class for CR and LF.
// The first alternative ends after the last CR or LF of the run; the second leaves the run's last
// character to the next piece when a non-space follows (unless the run is one character); the third takes
// the whole run.
func spaceRun(s string, i int, class func(s string, j int) (uint8, int), space, nl uint8) int {
	j := i
	lastNL, n, lastW := -1, 0, 0
	for j < len(s) {
		c, w := class(s, j)
		if c != space && c != nl {
			break
		}
		if c == nl {
			lastNL = j
		}
		n++
		lastW = w
		j += w
	}
	switch {
	case lastNL >= 0:
		return lastNL + 1
	case j == len(s) || n == 1:
		return j
	}
	return j - lastW
}
