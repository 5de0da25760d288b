package chattemplate

import (
	"strings"
)

// ContentFormat is how message content reaches the template, as vLLM's --chat-template-content-format
// names it.
type ContentFormat int

const (
	// FormatAuto detects the format from the template (vLLM's default, "auto").
	FormatAuto ContentFormat = iota
	// FormatString hands every message's content to the template as one string: text parts joined
	// with "\n" (vLLM "string").
	FormatString
	// FormatOpenAI hands content as a list of parts: {"type": "text", "text": ...} dicts, a plain string
	// wrapped as one such part, media as {"type": "image"} and the like (vLLM "openai").
	FormatOpenAI
)

// String returns vLLM's name for the format.
func (f ContentFormat) String() string {
	switch f {
	case FormatString:
		return "string"
	case FormatOpenAI:
		return "openai"
	}
	return "auto"
}

// detectContentFormat mirrors _detect_content_format in vllm/renderers/hf.py (formerly
// vllm/entrypoints/chat_utils.py): the format is "openai" when the template has a for loop over
// <m>.content or <m>['content'] (through filters, tests and slices), where <m> is the target of a for loop
// over "messages" or over a variable assigned from it ({% set x = messages[1:] %}, transitively);
// otherwise "string". Where vLLM's AST walk would fail an assertion (a tuple loop target or a namespace
// assignment on such a path) it falls back to "string", and so does this.
func detectContentFormat(segs []segment) ContentFormat {
	type assign struct{ target, rhs string }
	type loop struct{ target, iter string }
	var assigns []assign
	var loops []loop
	for _, s := range segs {
		if s.kind != segStmt {
			continue
		}
		toks := exprTokens(s.text)
		if len(toks) == 0 || toks[0].kind != tokName {
			continue
		}
		switch toks[0].text {
		case "set":
			// set TARGET = EXPR ; TARGET may be a name, ns.attr or a tuple.
			eq := -1
			for i, t := range toks {
				if t.kind == tokOp && t.text == "=" {
					eq = i
					break
				}
			}
			if eq < 0 {
				continue // block set: AssignBlock, not Assign
			}
			target := tokensText(toks[1:eq])
			assigns = append(assigns, assign{target: target, rhs: tokensText(toks[eq+1:])})
		case "for":
			in := -1
			for i, t := range toks {
				if t.kind == tokName && t.text == "in" {
					in = i
					break
				}
			}
			if in < 0 {
				continue
			}
			// The iterable ends at a top-level "if" (loop filter) or "recursive".
			end := len(toks)
			depth := 0
			for i := in + 1; i < len(toks); i++ {
				t := toks[i]
				if t.kind == tokOp {
					switch t.text {
					case "(", "[", "{":
						depth++
					case ")", "]", "}":
						depth--
					}
				}
				if depth == 0 && t.kind == tokName && (t.text == "if" || t.text == "recursive") {
					end = i
					break
				}
			}
			loops = append(loops, loop{target: tokensText(toks[1:in]), iter: tokensText(toks[in+1 : end])})
		}
	}

	// Variables holding messages (or a slice/filter of it), found breadth first as vLLM does.
	msgVars := []string{"messages"}
	seen := map[string]bool{"messages": true}
	for q := 0; q < len(msgVars); q++ {
		v := msgVars[q]
		for _, a := range assigns {
			if !isVarOrElemsAccess(a.rhs, v, "") {
				continue
			}
			if !isName(a.target) {
				return FormatString // vLLM: assert isinstance(lhs, Name) fails → default
			}
			if !seen[a.target] {
				seen[a.target] = true
				msgVars = append(msgVars, a.target)
			}
		}
	}
	var msgItems []string
	for _, l := range loops {
		for _, v := range msgVars {
			if isVarOrElemsAccess(l.iter, v, "") {
				if !isName(l.target) {
					return FormatString
				}
				msgItems = append(msgItems, l.target)
				break
			}
		}
	}
	for _, l := range loops {
		for _, m := range msgItems {
			if isVarOrElemsAccess(l.iter, m, "content") {
				if !isName(l.target) {
					return FormatString
				}
				return FormatOpenAI
			}
		}
	}
	return FormatString
}

func isName(s string) bool {
	toks := exprTokens(s)
	return len(toks) == 1 && toks[0].kind == tokName
}

// isVarOrElemsAccess mirrors vLLM's _is_var_or_elems_access on an expression's source: after peeling
// filters ("| f(...)"), tests ("is [not] t(...)") and slice subscripts ("[a:b]") from the outside in, what
// remains must be the bare name (key == "") or name.key / name['key'].
func isVarOrElemsAccess(expr, name, key string) bool {
	toks := exprTokens(expr)
	// Strip redundant outer parentheses.
	for len(toks) >= 2 && toks[0].text == "(" && toks[len(toks)-1].text == ")" && matchingClose(toks, 0) == len(toks)-1 {
		toks = toks[1 : len(toks)-1]
	}
	if len(toks) == 0 || toks[0].kind != tokName || toks[0].text != name {
		return false
	}
	i := 1
	if key != "" {
		switch {
		case i+1 < len(toks) && toks[i].text == "." && toks[i+1].kind == tokName && toks[i+1].text == key:
			i += 2
		case i+2 < len(toks) && toks[i].text == "[" && toks[i+1].kind == tokString && toks[i+1].value == key && toks[i+2].text == "]":
			i += 3
		default:
			return false
		}
	}
	// Everything after must be slices, filters or tests.
	for i < len(toks) {
		t := toks[i]
		switch {
		case t.kind == tokOp && t.text == "[":
			end := matchingClose(toks, i)
			if end < 0 || !hasTopLevelColon(toks[i+1:end]) {
				return false
			}
			i = end + 1
		case t.kind == tokOp && t.text == "|":
			if i+1 >= len(toks) || toks[i+1].kind != tokName {
				return false
			}
			i += 2
			for i < len(toks) && toks[i].text == "." && i+1 < len(toks) && toks[i+1].kind == tokName {
				i += 2 // dotted filter names
			}
			if i < len(toks) && toks[i].text == "(" {
				end := matchingClose(toks, i)
				if end < 0 {
					return false
				}
				i = end + 1
			}
		case t.kind == tokName && t.text == "is":
			i++
			if i < len(toks) && toks[i].kind == tokName && toks[i].text == "not" {
				i++
			}
			if i >= len(toks) || toks[i].kind != tokName {
				return false
			}
			i++
			if i < len(toks) && toks[i].text == "(" {
				end := matchingClose(toks, i)
				if end < 0 {
					return false
				}
				i = end + 1
			} else if i < len(toks) && (toks[i].kind == tokString || toks[i].kind == tokNumber || toks[i].kind == tokName) {
				i++ // a test with one bare argument: "is divisibleby 3"
			}
		default:
			return false
		}
	}
	return true
}

func hasTopLevelColon(toks []exprToken) bool {
	depth := 0
	for _, t := range toks {
		switch t.text {
		case "(", "[", "{":
			depth++
		case ")", "]", "}":
			depth--
		case ":":
			if depth == 0 && t.kind == tokOp {
				return true
			}
		}
	}
	return false
}

// matchingClose returns the index of the bracket closing toks[open], or -1.
func matchingClose(toks []exprToken, open int) int {
	depth := 0
	for i := open; i < len(toks); i++ {
		if toks[i].kind != tokOp {
			continue
		}
		switch toks[i].text {
		case "(", "[", "{":
			depth++
		case ")", "]", "}":
			depth--
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}

type tokKind int

const (
	tokName tokKind = iota
	tokString
	tokNumber
	tokOp
)

type exprToken struct {
	kind  tokKind
	text  string // source text
	value string // decoded value for strings (simple escapes only)
}

// exprTokens splits Jinja expression source into names, strings, numbers and operator characters.
// It is only precise enough for the shape checks above; anything unusual simply fails to match.
func exprTokens(s string) []exprToken {
	var toks []exprToken
	i := 0
	for i < len(s) {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			j := i + 1
			for j < len(s) && (s[j] == '_' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= 'A' && s[j] <= 'Z' || s[j] >= '0' && s[j] <= '9') {
				j++
			}
			toks = append(toks, exprToken{kind: tokName, text: s[i:j]})
			i = j
		case c >= '0' && c <= '9':
			j := i + 1
			for j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] == '.' || s[j] == '_' || s[j] == 'e' || s[j] == 'E') {
				j++
			}
			toks = append(toks, exprToken{kind: tokNumber, text: s[i:j]})
			i = j
		case c == '\'' || c == '"':
			j := i + 1
			var val strings.Builder
			for j < len(s) && s[j] != c {
				if s[j] == '\\' && j+1 < len(s) {
					j++
				}
				val.WriteByte(s[j])
				j++
			}
			if j < len(s) {
				j++
			}
			toks = append(toks, exprToken{kind: tokString, text: s[i:j], value: val.String()})
			i = j
		default:
			toks = append(toks, exprToken{kind: tokOp, text: s[i : i+1]})
			i++
		}
	}
	return toks
}

func tokensText(toks []exprToken) string {
	parts := make([]string, len(toks))
	for i, t := range toks {
		parts[i] = t.text
	}
	return strings.Join(parts, " ")
}
