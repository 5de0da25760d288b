package route

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kvgate/kvgate/gateway/internal/chattemplate"
	"github.com/kvgate/kvgate/gateway/internal/upstream"
)

// badRequest is a RequestError without a code.
func badRequest(param, format string, a ...any) *RequestError {
	return &RequestError{Param: param, Message: fmt.Sprintf(format, a...)}
}

// chatError turns an Encoder.EncodeChat error into the client's RequestError, worded for the client: without the
// gateway's package prefixes ("chattemplate: request: ..."), with the offending JSON path as param when the
// request was malformed, and a template's own raise_exception text as vLLM returns it.
// ChatError is the RequestError a chat render or tokenization error is answered with (the server's
// /tokenize uses it too; RouteError maps it to a 400).
func ChatError(err error) *RequestError { return chatError(err) }

func chatError(err error) *RequestError {
	if re, ok := errors.AsType[*chattemplate.RequestError](err); ok {
		if re.Path == "" {
			return badRequest("messages", "%s", re.Message)
		}
		return badRequest(re.Path, "%s: %s", re.Path, re.Message)
	}
	if re, ok := errors.AsType[*chattemplate.RenderError](err); ok {
		return badRequest("messages", "%s", re.Message)
	}
	if errors.Is(err, chattemplate.ErrNoTemplate) {
		return badRequest("messages", "This model has no chat template; use /v1/completions.")
	}
	return badRequest("messages", "%s", clientText(err))
}

// internalPrefixes are the "pkg: op: " prefixes the gateway's own packages put on errors.
var internalPrefixes = []string{"chattemplate: ", "request: ", "render: ", "model: ", "tokenizer: ", "route: ",
	"openai: ", "upstream: "}

// clientText is err's text without leading internal package prefixes.
func clientText(err error) string {
	s := err.Error()
	for trimmed := true; trimmed; {
		trimmed = false
		for _, p := range internalPrefixes {
			if rest, ok := strings.CutPrefix(s, p); ok {
				s, trimmed = rest, true
			}
		}
	}
	return s
}

// promptTooLong is the RequestError for a prompt of n tokens over the model's MaxPromptTokens, or nil.
func promptTooLong(m *Model, req Request, n int) *RequestError {
	if m.MaxPromptTokens <= 0 || n <= m.MaxPromptTokens {
		return nil
	}
	param := "messages"
	switch {
	case req.Responses:
		param = "input"
	case !req.Chat:
		param = "prompt"
	}
	return &RequestError{Param: param, Code: "prompt_too_long", Message: fmt.Sprintf(
		"This model's maximum prompt length is %d tokens; the prompt has %d tokens.", m.MaxPromptTokens, n)}
}

// unrenderable returns the upstream.Skip* reason when a chat render error means the gateway cannot
// tokenize the request exactly but the engine can (so it is forwarded with its original body rather than
// refused): media content parts, and continue_final_message on a final message the rendered prompt does
// not contain. Other errors return "".
func unrenderable(err error) string {
	if re, ok := errors.AsType[*chattemplate.RequestError](err); ok && errors.Is(re.Kind, chattemplate.ErrUnsupportedContent) {
		return upstream.SkipMultimodal
	}
	if re, ok := errors.AsType[*chattemplate.RenderError](err); ok && strings.Contains(re.Message, "continue_final_message") {
		return upstream.SkipContinueFinal
	}
	return ""
}
