package chattemplate

import (
	"errors"
	"fmt"
)

// Sentinel errors. A *RenderError or *RequestError wraps one of them where it applies, so callers can
// use errors.Is for the category and errors.As for the details.
var (
	// ErrTemplateRaised: the template called raise_exception (Jinja2 TemplateError in Python).
	ErrTemplateRaised = errors.New("chattemplate: template raised an exception")
	// ErrTemplateFailed: the template failed while rendering (undefined operation, type error, ...).
	ErrTemplateFailed = errors.New("chattemplate: template failed")
	// ErrLimit: a limit was hit (message count, output size, loop iterations, recursion depth, time).
	ErrLimit = errors.New("chattemplate: limit exceeded")
	// ErrUnsupportedContent: a content part the gateway cannot render exactly (media on a template that
	// takes string content, embeddings, unknown part types).
	ErrUnsupportedContent = errors.New("chattemplate: unsupported content part")
	// ErrBadRequest: the request body or its messages are malformed.
	ErrBadRequest = errors.New("chattemplate: malformed chat request")
	// ErrNoTemplate: the model directory defines no chat template.
	ErrNoTemplate = errors.New("chattemplate: no chat template")
)

// RenderError reports that rendering failed after the request was accepted: the template raised
// (ErrTemplateRaised), failed (ErrTemplateFailed) or a limit was hit (ErrLimit). Message is the
// template's own text for raise_exception, which is what vLLM returns to the client.
type RenderError struct {
	Kind    error  // ErrTemplateRaised, ErrTemplateFailed or ErrLimit
	Message string // human-readable detail
	Err     error  // underlying engine error, if any
}

// Error implements error.
func (e *RenderError) Error() string {
	return fmt.Sprintf("chattemplate: render: %s", e.Message)
}

// Unwrap returns the kind sentinel and the engine error.
func (e *RenderError) Unwrap() []error {
	if e.Err != nil {
		return []error{e.Kind, e.Err}
	}
	return []error{e.Kind}
}

// RequestError reports a request the gateway rejects before rendering: malformed JSON, a message that
// is not an object, a missing role, a bad content part (ErrBadRequest), content the template cannot take
// exactly (ErrUnsupportedContent), or more messages than Limits.MaxMessages (ErrLimit; vLLM itself has no
// such limit, so a caller may choose to forward such a request without routing information). Path locates
// the problem, e.g. "messages[2].content[1]".
type RequestError struct {
	Kind    error  // ErrBadRequest, ErrUnsupportedContent or ErrLimit
	Path    string // JSON path of the offending value ("" for the whole body)
	Message string // human-readable detail
}

// Error implements error.
func (e *RequestError) Error() string {
	if e.Path == "" {
		return "chattemplate: request: " + e.Message
	}
	return "chattemplate: request: " + e.Path + ": " + e.Message
}

// Unwrap returns the kind sentinel.
func (e *RequestError) Unwrap() error { return e.Kind }

func badRequest(path, format string, args ...any) *RequestError {
	return &RequestError{Kind: ErrBadRequest, Path: path, Message: fmt.Sprintf(format, args...)}
}
