package tokenizer

import (
	"errors"
	"fmt"
)

// ErrNoTokenizerFile is returned by Load when the directory holds neither tokenizer.json nor
// tokenizer.json.gz.
var ErrNoTokenizerFile = errors.New("tokenizer: no tokenizer.json or tokenizer.json.gz")

// UnsupportedError reports a tokenizer.json component (normalizer, pre-tokenizer, model, post-processor,
// decoder or one of their options) that this package does not implement. Load returns it instead of
// producing a tokenizer that would silently disagree with the engine.
type UnsupportedError struct {
	// Component is the JSON path of the component, e.g. "pre_tokenizer.pretokenizers[1]".
	Component string
	// Type is the component's "type" value (or the option name), e.g. "WordPiece".
	Type string
	// Detail says what about it is unsupported, when Type alone does not.
	Detail string
}

// Error implements error.
func (e *UnsupportedError) Error() string {
	s := fmt.Sprintf("tokenizer: unsupported %s %q", e.Component, e.Type)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

func unsupported(component, typ, detail string) error {
	return &UnsupportedError{Component: component, Type: typ, Detail: detail}
}
