package tokenizer

import (
	"encoding/json"
	"fmt"
)

type postJSON struct {
	Type       string            `json:"type"`
	Processors []json.RawMessage `json:"processors"`
	Single     []struct {
		SpecialToken *struct {
			ID string `json:"id"`
		} `json:"SpecialToken"`
		Sequence *struct {
			ID string `json:"id"`
		} `json:"Sequence"`
	} `json:"single"`
	SpecialTokens map[string]struct {
		IDs []uint32 `json:"ids"`
	} `json:"special_tokens"`
	Sep []json.RawMessage `json:"sep"`
	Cls []json.RawMessage `json:"cls"`
}

// buildPostProcessor returns the IDs a single-sequence encoding gets before and after the text when special
// tokens are added (HF's PostProcessor for one sequence; pairs are not part of this API).
func buildPostProcessor(raw json.RawMessage, path string, t *Tokenizer) (prefix, suffix []uint32, err error) {
	if isNull(raw) {
		return nil, nil, nil
	}
	var p postJSON
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, nil, fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	switch p.Type {
	case "Sequence":
		for i, r := range p.Processors {
			pre, suf, err := buildPostProcessor(r, fmt.Sprintf("%s.processors[%d]", path, i), t)
			if err != nil {
				return nil, nil, err
			}
			prefix = append(pre, prefix...)
			suffix = append(suffix, suf...)
		}
		return prefix, suffix, nil
	case "ByteLevel":
		return nil, nil, nil // only trims offsets
	case "TemplateProcessing":
		seen := false
		for _, item := range p.Single {
			switch {
			case item.Sequence != nil:
				if seen {
					return nil, nil, unsupported(path, p.Type, "single template holds two sequences")
				}
				seen = true
			case item.SpecialToken != nil:
				st, ok := p.SpecialTokens[item.SpecialToken.ID]
				if !ok {
					return nil, nil, fmt.Errorf("tokenizer: %s: special token %q not in special_tokens", path, item.SpecialToken.ID)
				}
				if seen {
					suffix = append(suffix, st.IDs...)
				} else {
					prefix = append(prefix, st.IDs...)
				}
			}
		}
		return prefix, suffix, nil
	case "BertProcessing", "RobertaProcessing":
		cls, err1 := namedID(p.Cls)
		sep, err2 := namedID(p.Sep)
		if err1 != nil || err2 != nil {
			return nil, nil, fmt.Errorf("tokenizer: %s: malformed cls/sep", path)
		}
		return []uint32{cls}, []uint32{sep}, nil
	}
	return nil, nil, unsupported(path, p.Type, "")
}

// namedID reads a ["token", id] pair.
func namedID(pair []json.RawMessage) (uint32, error) {
	if len(pair) != 2 {
		return 0, fmt.Errorf("want [token, id]")
	}
	var id uint32
	err := json.Unmarshal(pair[1], &id)
	return id, err
}
