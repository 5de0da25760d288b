package chattemplate

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// This file holds the template pre-pass. Jinja2 applies whitespace control (the "-" and "+" markers,
// trim_blocks, lstrip_blocks) and newline normalization in its lexer, token by token; ardanlabs/jinja
// applies them after scanning and lets a marker reach across an adjacent tag to the next text (measured:
// "{% if x %}{% endif %}\n\nA" renders "A" there, "\nA" in Jinja2). So the pre-pass lexes the source the
// way jinja2/lexer.py does, computes every text run exactly as Jinja2 would emit it, and writes a new
// source in which no tag asks ardanlabs/jinja to trim anything ("{%+ ... +%}" on every block tag,
// comments dropped). The same pass inserts the budget calls that bound loops, recursion and output size.

// segKind is the kind of one lexed piece of a template.
type segKind int

const (
	segText    segKind = iota // literal text between tags
	segExpr                   // {{ ... }}
	segStmt                   // {% ... %}
	segComment                // {# ... #}
	segRaw                    // {% raw %}...{% endraw %}: text holds the body
)

// segment is one lexed piece. For tags, text is the content between the markers and left/right are the
// whitespace-control signs ('-', '+' or 0). For segRaw, left/right belong to the raw tag and endLeft/
// endRight to the endraw tag.
type segment struct {
	kind              segKind
	text              string
	left, right       byte
	endLeft, endRight byte
	offset            int // byte offset of the segment in the normalized source
}

// normalizeNewlines mirrors Lexer.tokeniter: "\r\n", "\r" and "\n" all become "\n", and one trailing
// newline is dropped (keep_trailing_newline=False, transformers' setting).
func normalizeNewlines(src string) string {
	if strings.ContainsRune(src, '\r') {
		src = strings.ReplaceAll(src, "\r\n", "\n")
		src = strings.ReplaceAll(src, "\r", "\n")
	}
	return strings.TrimSuffix(src, "\n")
}

// lexTemplate splits a normalized template source into segments. Tag ends are found the way both
// Jinja2 and ardanlabs/jinja find them: outside quoted strings and outside (), [] and {} nesting.
func lexTemplate(src string) ([]segment, error) {
	var segs []segment
	textStart := 0
	i := 0
	for i < len(src) {
		if src[i] != '{' || i+1 >= len(src) {
			i++
			continue
		}
		var kind segKind
		var closer byte
		switch src[i+1] {
		case '{':
			kind, closer = segExpr, '}'
		case '%':
			kind, closer = segStmt, '%'
		case '#':
			kind, closer = segComment, '#'
		default:
			i++
			continue
		}
		if i > textStart {
			segs = append(segs, segment{kind: segText, text: src[textStart:i], offset: textStart})
		}
		start := i
		i += 2
		var left byte
		if i < len(src) && (src[i] == '-' || src[i] == '+') {
			left = src[i]
			i++
		}
		content, right, end, err := scanTagEnd(src, i, kind, closer)
		if err != nil {
			return nil, fmt.Errorf("%w at byte %d", err, start)
		}
		seg := segment{kind: kind, text: content, left: left, right: right, offset: start}
		i = end
		if kind == segStmt && strings.TrimSpace(content) == "raw" {
			body, endLeft, endRight, next, ok := scanRawBody(src, i)
			if !ok {
				return nil, fmt.Errorf("missing end of raw directive at byte %d", start)
			}
			seg = segment{kind: segRaw, text: body, left: left, right: right, endLeft: endLeft, endRight: endRight, offset: start}
			i = next
		}
		segs = append(segs, seg)
		textStart = i
	}
	if textStart < len(src) {
		segs = append(segs, segment{kind: segText, text: src[textStart:], offset: textStart})
	}
	return segs, nil
}

// scanTagEnd finds the end of a tag whose content starts at i. It returns the content (without the
// right-hand sign), the sign, and the index just past the closer.
func scanTagEnd(src string, i int, kind segKind, closer byte) (string, byte, int, error) {
	start := i
	depth := 0
	for i < len(src) {
		c := src[i]
		if kind != segComment && (c == '\'' || c == '"') {
			i++
			for i < len(src) && src[i] != c {
				if src[i] == '\\' && i+1 < len(src) {
					i++
				}
				i++
			}
			i++
			continue
		}
		if depth <= 0 {
			if (c == '-' || c == '+') && i+2 < len(src) && src[i+1] == closer && src[i+2] == '}' {
				return src[start:i], c, i + 3, nil
			}
			if c == closer && i+1 < len(src) && src[i+1] == '}' {
				return src[start:i], 0, i + 2, nil
			}
		}
		if kind != segComment {
			switch c {
			case '(', '[', '{':
				depth++
			case ')', ']', '}':
				depth--
			}
		}
		i++
	}
	switch kind {
	case segComment:
		return "", 0, 0, fmt.Errorf("missing end of comment tag")
	case segExpr:
		return "", 0, 0, fmt.Errorf("unclosed expression tag")
	}
	return "", 0, 0, fmt.Errorf("unclosed statement tag")
}

// scanRawBody finds the first "{%[-+]? endraw [-+]?%}" at or after i.
func scanRawBody(src string, i int) (body string, endLeft, endRight byte, next int, ok bool) {
	for j := i; j+1 < len(src); j++ {
		if src[j] != '{' || src[j+1] != '%' {
			continue
		}
		k := j + 2
		var l byte
		if k < len(src) && (src[k] == '-' || src[k] == '+') {
			l = src[k]
			k++
		}
		content, r, end, err := scanTagEnd(src, k, segStmt, '%')
		if err != nil {
			return "", 0, 0, 0, false
		}
		if strings.TrimSpace(content) == "endraw" {
			return src[i:j], l, r, end, true
		}
	}
	return "", 0, 0, 0, false
}

// isPySpace reports whether r is whitespace for Python's str.isspace (and so for str.rstrip() and the
// re module's \s on str patterns): ASCII \t-\r, \x1c-\x1f, space, and Unicode White_Space.
func isPySpace(r rune) bool {
	switch {
	case r == ' ' || (r >= '\t' && r <= '\r') || (r >= 0x1c && r <= 0x1f):
		return true
	case r < 0x80:
		return false
	}
	switch r {
	case 0x85, 0xa0, 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000:
		return true
	}
	return r >= 0x2000 && r <= 0x200a
}

func pyRstrip(s string) string {
	for len(s) > 0 {
		r, n := utf8.DecodeLastRuneInString(s)
		if !isPySpace(r) {
			break
		}
		s = s[:len(s)-n]
	}
	return s
}

func pyLstrip(s string) string {
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		if !isPySpace(r) {
			break
		}
		s = s[n:]
	}
	return s
}

// allPySpace reports whether s is non-empty and all whitespace (re.fullmatch(r"\s+", s)).
func allPySpace(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !isPySpace(r) {
			return false
		}
	}
	return true
}

// isBlockLike reports whether a segment's opener takes part in lstrip_blocks and its closer in
// trim_blocks: block tags, comments and raw blocks do; {{ }} expressions do not.
func isBlockLike(k segKind) bool { return k == segStmt || k == segComment || k == segRaw }

// trimSuffixAfter applies the right-hand side of a tag to the text that follows it, the way Jinja2's
// end-of-tag regexes consume it ("-%}\s*", "%}\n?" with trim_blocks, "+%}"). It returns the remaining
// text and whether the consumed part ended with a newline (Jinja2's line_starting for the next tag).
func trimSuffixAfter(text string, sign byte, blockLike, trimBlocks bool) (string, bool) {
	switch {
	case sign == '-':
		rest := pyLstrip(text)
		consumed := text[:len(text)-len(rest)]
		return rest, strings.HasSuffix(consumed, "\n")
	case sign == 0 && blockLike && trimBlocks && strings.HasPrefix(text, "\n"):
		return text[1:], true
	}
	return text, false
}

// trimBeforeTag applies the left-hand side of the next tag to the text before it (Jinja2's
// OptionalLStrip rule): "-" strips all trailing whitespace; otherwise, for block-like tags without "+",
// lstrip_blocks removes the whitespace between the last newline (or the start of a line) and the tag.
func trimBeforeTag(text string, sign byte, blockLike, lineStarting bool) string {
	if sign == '-' {
		return pyRstrip(text)
	}
	if sign == '+' || !blockLike {
		return text
	}
	lpos := strings.LastIndexByte(text, '\n') + 1
	if (lpos > 0 || lineStarting) && allPySpace(text[lpos:]) {
		return text[:lpos]
	}
	return text
}

// budget hook names inserted by rewrite; the Template binds them per render.
const (
	hookTick  = "kvgate_budget_tick__"
	hookEnter = "kvgate_budget_enter__"
	hookLeave = "kvgate_budget_leave__"
	hookOut   = "kvgate_budget_out__"
)

// stmtKeyword returns the first word of a statement tag's content.
func stmtKeyword(content string) string {
	s := strings.TrimLeft(content, " \t\n")
	end := 0
	for end < len(s) && (s[end] == '_' || s[end] >= 'a' && s[end] <= 'z' || s[end] >= 'A' && s[end] <= 'Z' || s[end] >= '0' && s[end] <= '9') {
		end++
	}
	return s[:end]
}

// rewrite turns lexed segments into a source for ardanlabs/jinja with Jinja2's whitespace semantics
// already applied and the budget hooks inserted:
//   - after every "{% for %}" tag: a tick carrying loop.depth and the bytes of literal text in the body;
//   - after every "{% macro %}" tag an enter hook, before its "{% endmacro %}" a leave hook (recursion
//     depth; ardanlabs/jinja itself recurses without bound and a runaway macro overflows the Go stack,
//     which kills the process);
//   - every "{{ expr }}" becomes "{{ out((expr)) }}", which passes the value through unchanged and counts
//     its size.
func rewrite(segs []segment) string {
	var b strings.Builder
	// First compute every text run as Jinja2 emits it.
	texts := make([]string, len(segs))
	lineStarting := true
	var prevSign byte
	prevBlockLike, havePrev := false, false
	for i, s := range segs {
		switch s.kind {
		case segText:
			t := s.text
			if havePrev {
				t, lineStarting = trimSuffixAfter(t, prevSign, prevBlockLike, true)
			}
			if i+1 < len(segs) {
				n := segs[i+1]
				t = trimBeforeTag(t, n.left, isBlockLike(n.kind), lineStarting)
			}
			texts[i] = t
			havePrev = false
			continue
		case segRaw:
			// The raw tag has no trim_blocks suffix in Jinja2 ("-%}\s*" or "%}" only).
			body := s.text
			ls := false
			if s.right == '-' {
				body, ls = trimSuffixAfter(body, '-', true, true)
			}
			texts[i] = trimBeforeTag(body, s.endLeft, true, ls)
			prevSign, prevBlockLike, havePrev = s.endRight, true, true
		default:
			prevSign, prevBlockLike, havePrev = s.right, isBlockLike(s.kind), true
		}
	}

	type openBlock struct {
		kind     string // "for" or "macro"
		hookAt   int    // index in pieces of the hook call, written at the block's end tag
		textSize int
	}
	var stack []openBlock
	var pieces []string // output pieces; hook calls are patched in once their body's size is known
	addText := func(t string) {
		if t == "" {
			return
		}
		pieces = append(pieces, t)
		if len(stack) > 0 {
			stack[len(stack)-1].textSize += len(t)
		}
	}
	for i, s := range segs {
		switch s.kind {
		case segText:
			t := texts[i]
			// A text ending in "{" right before a tag would merge with the tag's opener.
			if strings.HasSuffix(t, "{") && i+1 < len(segs) {
				addText(t[:len(t)-1])
				pieces = append(pieces, "{{ '{' }}")
				if len(stack) > 0 {
					stack[len(stack)-1].textSize++
				}
			} else {
				addText(t)
			}
		case segComment:
			// Dropped: its whitespace effects are already applied.
		case segRaw:
			pieces = append(pieces, "{%+ raw +%}", texts[i], "{%+ endraw +%}")
			if len(stack) > 0 {
				stack[len(stack)-1].textSize += len(texts[i])
			}
		case segExpr:
			if strings.TrimSpace(s.text) == "" {
				pieces = append(pieces, "{{"+s.text+"}}")
				continue
			}
			pieces = append(pieces, "{{ "+hookOut+"(("+s.text+")) }}")
		case segStmt:
			kw := stmtKeyword(s.text)
			if kw == "endmacro" && len(stack) > 0 && stack[len(stack)-1].kind == "macro" {
				pieces = append(pieces, "{%+ if "+hookLeave+"() +%}{%+ endif +%}")
			}
			pieces = append(pieces, "{%+"+s.text+"+%}")
			switch kw {
			case "for":
				stack = append(stack, openBlock{kind: "for", hookAt: len(pieces)})
				pieces = append(pieces, "") // patched at endfor
			case "macro":
				stack = append(stack, openBlock{kind: "macro", hookAt: len(pieces)})
				pieces = append(pieces, "")
			case "endfor", "endmacro":
				want := kw[3:]
				if len(stack) > 0 && stack[len(stack)-1].kind == want {
					top := stack[len(stack)-1]
					stack = stack[:len(stack)-1]
					if want == "for" {
						pieces[top.hookAt] = "{%+ if " + hookTick + "(loop.depth, " + strconv.Itoa(top.textSize) + ") +%}{%+ endif +%}"
					} else {
						pieces[top.hookAt] = "{%+ if " + hookEnter + "(" + strconv.Itoa(top.textSize) + ") +%}{%+ endif +%}"
					}
				}
			}
		}
	}
	for _, p := range pieces {
		b.WriteString(p)
	}
	return b.String()
}
