// Package chattemplate renders OpenAI chat completion requests into prompt text exactly as vLLM does
// before tokenizing, so the gateway sees the tokens the engine will see.
//
// A Template is built from a Hugging Face model directory (Load) or a template source (New) and is
// compiled once; Render takes the request body as the client sent it. A caller that reads other members of
// the body too decodes it once with ParseRequest (the members the template does not read are handed to a
// callback raw) and renders the result with RenderRequest. What it mirrors, and from where:
//
//   - request fields as vLLM's ChatCompletionRequest reads them (add_generation_prompt defaults to true,
//     continue_final_message, documents, reasoning_effort, chat_template_kwargs merged as
//     build_chat_params/merge_kwargs do; vllm/entrypoints/openai/chat_completion/protocol.py,
//     vllm/renderers/params.py);
//   - messages rebuilt as parse_chat_messages does ({"role", "content", ...}; text parts joined with "\n"
//     for templates that take string content, part lists for templates that loop over message content;
//     tool call arguments parsed from their JSON string; empty tool_calls dropped;
//     vllm/entrypoints/chat_utils.py);
//   - the content format detected from the template as _detect_content_format does
//     (vllm/renderers/hf.py);
//   - tools as ChatCompletionToolsParam.model_dump() shapes them ({"type", "function": {"name",
//     "description", "parameters", ...}});
//   - the Jinja environment transformers builds (trim_blocks, lstrip_blocks, keep_trailing_newline=False,
//     tojson as json.dumps(ensure_ascii=False), raise_exception, strftime_now, the sandbox's range limit;
//     transformers/utils/chat_template_utils.py, jinja2/lexer.py, jinja2/sandbox.py), with the model's
//     special tokens as variables and continue_final_message handled after rendering.
//
// The engine is github.com/ardanlabs/jinja. A pre-pass applies Jinja2's whitespace control itself and
// inserts metering calls (see RATIONALE.md), so a template that loops or recurses without end, or grows
// its output without bound, stops with a *RenderError instead of hanging or crashing the process.
//
// Errors: *RequestError (ErrBadRequest, ErrUnsupportedContent, ErrLimit for too many messages) before
// rendering; *RenderError (ErrTemplateRaised, ErrTemplateFailed, ErrLimit) during it. A Template is safe
// for concurrent use.
package chattemplate
