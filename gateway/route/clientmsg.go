package route

import (
	"errors"
	"strings"

	"github.com/kvgate/kvgate/gateway/chattemplate"
	"github.com/kvgate/kvgate/gateway/openai"
	"github.com/kvgate/kvgate/gateway/upstream"
)

// chatError turns an Encoder.EncodeChat error into the client's 400, worded for the client: without the
// gateway's package prefixes ("chattemplate: request: ..."), with the offending JSON path as param when the
// request was malformed, and a template's own raise_exception text as vLLM returns it.
// ChatError is the 400 a chat render or tokenization error is answered with (the server's /tokenize uses
// it too).
func ChatError(err error) *openai.Error { return chatError(err) }

func chatError(err error) *openai.Error {
	if re, ok := errors.AsType[*chattemplate.RequestError](err); ok {
		if re.Path == "" {
			return openai.BadRequest("messages", "%s", re.Message)
		}
		return openai.BadRequest(re.Path, "%s: %s", re.Path, re.Message)
	}
	if re, ok := errors.AsType[*chattemplate.RenderError](err); ok {
		return openai.BadRequest("messages", "%s", re.Message)
	}
	if errors.Is(err, chattemplate.ErrNoTemplate) {
		return openai.BadRequest("messages", "This model has no chat template; use /v1/completions.")
	}
	return openai.BadRequest("messages", "%s", clientText(err))
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

// promptTooLong is the 400 for a prompt of n tokens over the model's MaxPromptTokens, or nil.
func promptTooLong(m *Model, req *openai.Request, n int) *openai.Error {
	if m.MaxPromptTokens <= 0 || n <= m.MaxPromptTokens {
		return nil
	}
	param := "messages"
	switch req.API {
	case openai.Completions:
		param = "prompt"
	case openai.Responses:
		param = "input"
	}
	return openai.Errorf(400, "invalid_request_error", param, "prompt_too_long",
		"This model's maximum prompt length is %d tokens; the prompt has %d tokens.", m.MaxPromptTokens, n)
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
