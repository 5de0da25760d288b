package chattemplate

import (
	"context"
	"fmt"
	"math"
)

// Request is an OpenAI chat completion body decoded once for rendering (ParseRequest), so a caller that
// also reads other members of the body (the gateway's routing fields) scans it only once. It does not
// depend on a template: any Template renders it with RenderRequest. A Request is meant to be rendered
// once; rendering may rewrite its decoded tool-call arguments in place (vLLM's shaping, idempotent).
type Request struct {
	req  *chatRequest
	body []byte
}

// ParseRequest decodes an OpenAI chat completion body as RenderContext does, with two differences: the
// raw bytes of every top-level member the template does not read (model, stream, max_tokens, unknown
// fields, ...) are handed to other (when not nil) in body order, as valid JSON sub-slices of body; and
// only malformed JSON (or a body that is not an object) fails the parse. An error about a field's value
// (messages not a list or absent, a bad add_generation_prompt, a refused chat_template, ...) is kept and
// returned by RenderRequest, so the caller can first answer its own errors (an unknown model) in the
// order it used to. The message-count limit is applied by RenderRequest (the template's Limits). Errors
// are *RequestError with ErrBadRequest.
func ParseRequest(body []byte, other func(key string, raw []byte)) (*Request, error) {
	req, err := parseRequest(body, parseOptions{maxMessages: math.MaxInt, other: other, collect: true})
	if err != nil {
		return nil, err
	}
	return &Request{req: req, body: body}, nil
}

// Messages returns the number of messages, or -1 when "messages" is absent or not a JSON array.
func (r *Request) Messages() int {
	if !r.req.messagesList {
		return -1
	}
	return len(r.req.messages)
}

// Body returns the body the Request was parsed from (not a copy).
func (r *Request) Body() []byte { return r.body }

// RenderRequest renders a parsed request exactly as RenderContext renders its body: the same prompt
// and the same errors, including the field errors ParseRequest kept and the message-count limit.
func (t *Template) RenderRequest(ctx context.Context, r *Request) (prompt string, err error) {
	return t.RenderRequestCached(ctx, r, nil)
}

// RenderRequestCached is RenderRequest through a PromptCache (nil: none): the same prompt and the same
// errors; a plain request on Qwen3's template reuses the cached render of its first messages (see
// PromptCache).
func (t *Template) RenderRequestCached(ctx context.Context, r *Request, pc *PromptCache) (prompt string, err error) {
	defer func() {
		if rec := recover(); rec != nil {
			prompt, err = "", &RenderError{Kind: ErrTemplateFailed, Message: fmt.Sprintf("template engine panic: %v", rec)}
		}
	}()
	if r.req.err != nil && r.req.errFirst {
		return "", r.req.err
	}
	if n := len(r.req.messages); n > t.cfg.limits.MaxMessages {
		return "", &RequestError{Kind: ErrLimit, Path: "messages",
			Message: fmt.Sprintf("more than %d messages (limit)", t.cfg.limits.MaxMessages)}
	}
	if r.req.err != nil {
		return "", r.req.err
	}
	return t.render(ctx, r.req, pc)
}
