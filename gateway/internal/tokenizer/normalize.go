package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites the text between added tokens (HF's Normalizer, without offset tracking: this package
// returns IDs, never offsets).
type normalizer interface {
	normalize(s string) string
}

type normJSON struct {
	Type        string            `json:"type"`
	Normalizers []json.RawMessage `json:"normalizers"`
	Prepend     string            `json:"prepend"`
	Pattern     struct {
		String *string `json:"String"`
		Regex  *string `json:"Regex"`
	} `json:"pattern"`
	Content string `json:"content"`
	Left    bool   `json:"left"`
	Right   bool   `json:"right"`
}

func buildNormalizer(raw json.RawMessage, path string) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	var n normJSON
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	switch n.Type {
	case "Sequence":
		var seq seqNorm
		for i, r := range n.Normalizers {
			c, err := buildNormalizer(r, fmt.Sprintf("%s.normalizers[%d]", path, i))
			if err != nil {
				return nil, err
			}
			if c != nil {
				seq = append(seq, c)
			}
		}
		switch len(seq) {
		case 0:
			return nil, nil
		case 1:
			return seq[0], nil
		}
		return seq, nil
	case "NFC":
		return unicodeNorm{norm.NFC}, nil
	case "NFD":
		return unicodeNorm{norm.NFD}, nil
	case "NFKC":
		return unicodeNorm{norm.NFKC}, nil
	case "NFKD":
		return unicodeNorm{norm.NFKD}, nil
	case "Lowercase":
		return lowercaseNorm{}, nil
	case "Prepend":
		return prependNorm(n.Prepend), nil
	case "Replace":
		if n.Pattern.String == nil {
			return nil, unsupported(path, "Replace", "only String patterns are implemented")
		}
		if *n.Pattern.String == "" {
			return nil, unsupported(path, "Replace", "empty pattern")
		}
		return replaceNorm{from: *n.Pattern.String, to: n.Content}, nil
	case "Strip":
		return stripNorm{left: n.Left, right: n.Right}, nil
	}
	return nil, unsupported(path, n.Type, "")
}

type seqNorm []normalizer

func (s seqNorm) normalize(x string) string {
	for _, n := range s {
		x = n.normalize(x)
	}
	return x
}

type unicodeNorm struct{ f norm.Form }

func (u unicodeNorm) normalize(s string) string {
	if isASCII(s) || u.f.IsNormalString(s) {
		return s
	}
	return u.f.String(s)
}

type lowercaseNorm struct{}

func (lowercaseNorm) normalize(s string) string { return strings.ToLower(s) }

// prependNorm prepends its string to any non-empty text (HF's Prepend).
type prependNorm string

func (p prependNorm) normalize(s string) string {
	if s == "" {
		return s
	}
	return string(p) + s
}

type replaceNorm struct{ from, to string }

func (r replaceNorm) normalize(s string) string { return strings.ReplaceAll(s, r.from, r.to) }

type stripNorm struct{ left, right bool }

func (st stripNorm) normalize(s string) string {
	if st.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if st.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s
}

// isASCII reports whether s holds only ASCII bytes, eight at a time.
func isASCII(s string) bool {
	i := 0
	for ; i+8 <= len(s); i += 8 {
		v := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
			uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
		if v&0x8080808080808080 != 0 {
			return false
		}
	}
	for ; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
