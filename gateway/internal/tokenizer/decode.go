package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// decoder is HF's decoder chain, applied to the model-space strings of a run of non-added tokens.
type decoder struct {
	steps     []decodeStep
	byteLevel bool // the chain is a single ByteLevel decoder
}

type decodeStep interface {
	decodeChain(toks []string) []string
}

type decJSON struct {
	Type     string            `json:"type"`
	Decoders []json.RawMessage `json:"decoders"`
	Pattern  struct {
		String *string `json:"String"`
		Regex  *string `json:"Regex"`
	} `json:"pattern"`
	Content       string  `json:"content"`
	Start         int     `json:"start"`
	Stop          int     `json:"stop"`
	Replacement   string  `json:"replacement"`
	PrependScheme *string `json:"prepend_scheme"`
}

func buildDecoder(raw json.RawMessage, path string) (decoder, error) {
	var d decoder
	if isNull(raw) {
		return d, nil
	}
	if err := d.add(raw, path); err != nil {
		return d, err
	}
	if len(d.steps) == 1 {
		_, d.byteLevel = d.steps[0].(byteLevelDec)
	}
	return d, nil
}

func (d *decoder) add(raw json.RawMessage, path string) error {
	var j decJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	switch j.Type {
	case "Sequence":
		for i, r := range j.Decoders {
			if err := d.add(r, fmt.Sprintf("%s.decoders[%d]", path, i)); err != nil {
				return err
			}
		}
	case "ByteLevel":
		d.steps = append(d.steps, byteLevelDec{})
	case "Replace":
		if j.Pattern.String == nil {
			return unsupported(path, "Replace", "only String patterns are implemented")
		}
		d.steps = append(d.steps, replaceDec{from: *j.Pattern.String, to: j.Content})
	case "ByteFallback":
		d.steps = append(d.steps, byteFallbackDec{})
	case "Fuse":
		d.steps = append(d.steps, fuseDec{})
	case "Strip":
		if utf8.RuneCountInString(j.Content) != 1 {
			return unsupported(path, "Strip", "content must be one character")
		}
		r, _ := utf8.DecodeRuneInString(j.Content)
		d.steps = append(d.steps, stripDec{content: r, start: j.Start, stop: j.Stop})
	case "Metaspace":
		rep := j.Replacement
		if rep == "" {
			rep = "\u2581"
		}
		prepend := j.PrependScheme == nil || *j.PrependScheme != "never"
		d.steps = append(d.steps, metaspaceDec{rep: rep, prepend: prepend})
	default:
		return unsupported(path, j.Type, "")
	}
	return nil
}

// decode runs the chain over model-space tokens and joins the result.
func (d *decoder) decode(toks []string) string {
	if len(d.steps) == 0 {
		return strings.Join(toks, " ")
	}
	for _, s := range d.steps {
		toks = s.decodeChain(toks)
	}
	return strings.Join(toks, "")
}

// byteLevelDec joins tokens (already raw bytes in this package's model space) and repairs invalid UTF-8
// like Rust's from_utf8_lossy.
type byteLevelDec struct{}

func (byteLevelDec) decodeChain(toks []string) []string {
	n := 0
	for _, t := range toks {
		n += len(t)
	}
	raw := make([]byte, 0, n)
	for _, t := range toks {
		raw = append(raw, t...)
	}
	return []string{string(appendLossyUTF8(make([]byte, 0, n), raw))}
}

type replaceDec struct{ from, to string }

func (r replaceDec) decodeChain(toks []string) []string {
	for i, t := range toks {
		toks[i] = strings.ReplaceAll(t, r.from, r.to)
	}
	return toks
}

// byteFallbackDec turns runs of "<0xXX>" tokens back into bytes: valid UTF-8 gives the text, invalid
// gives one U+FFFD per byte token (HF's ByteFallback).
type byteFallbackDec struct{}

func byteToken(t string) (byte, bool) {
	if len(t) != 6 || t[0] != '<' || t[1] != '0' || t[2] != 'x' || t[5] != '>' {
		return 0, false
	}
	hi, ok1 := unhex(t[3])
	lo, ok2 := unhex(t[4])
	return hi<<4 | lo, ok1 && ok2
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

func (byteFallbackDec) decodeChain(toks []string) []string {
	out := make([]string, 0, len(toks))
	var pending []byte
	flush := func() {
		if len(pending) == 0 {
			return
		}
		if utf8.Valid(pending) {
			out = append(out, string(pending))
		} else {
			for range pending {
				out = append(out, "\uFFFD")
			}
		}
		pending = pending[:0]
	}
	for _, t := range toks {
		if b, ok := byteToken(t); ok {
			pending = append(pending, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

type fuseDec struct{}

func (fuseDec) decodeChain(toks []string) []string { return []string{strings.Join(toks, "")} }

// stripDec removes up to start leading and stop trailing occurrences of content from each token.
type stripDec struct {
	content     rune
	start, stop int
}

func (s stripDec) decodeChain(toks []string) []string {
	for i, t := range toks {
		for k := 0; k < s.start; k++ {
			r, w := utf8.DecodeRuneInString(t)
			if t == "" || r != s.content {
				break
			}
			t = t[w:]
		}
		for k := 0; k < s.stop; k++ {
			r, w := utf8.DecodeLastRuneInString(t)
			if t == "" || r != s.content {
				break
			}
			t = t[:len(t)-w]
		}
		toks[i] = t
	}
	return toks
}

type metaspaceDec struct {
	rep     string
	prepend bool
}

func (m metaspaceDec) decodeChain(toks []string) []string {
	for i, t := range toks {
		t = strings.ReplaceAll(t, m.rep, " ")
		if i == 0 && m.prepend {
			t = strings.TrimPrefix(t, " ")
		}
		toks[i] = t
	}
	return toks
}
