package chattemplate

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"
)

// chatRequest is the part of an OpenAI chat completion body that decides the prompt, as vLLM's
// ChatCompletionRequest (vllm/entrypoints/openai/chat_completion/protocol.py) reads it.
type chatRequest struct {
	messages            []jinja.Value // each an ordered dict straight from the JSON
	tools               jinja.Value   // list or None
	toolChoice          jinja.Value   // "none", "auto", ... or a dict; Undefined when absent
	addGenerationPrompt bool
	continueFinal       bool
	documents           jinja.Value // list or None
	reasoningEffort     jinja.Value // string or None
	kwargs              *jinja.Dict // chat_template_kwargs, nil when absent or null
	// messagesList says "messages" was present and a JSON array.
	messagesList bool
	// plain is every message's role and content when all of them are plain (plainMsg), read while the
	// decoded dicts were hot; nil otherwise. The native render uses it instead of walking the dicts.
	plain []nativeMsg
	// err is the first field error found by a collecting parse (parseOptions.collect), nil otherwise;
	// errFirst says it was found before the message list (it then wins over the message-count limit, as
	// in a parse that stops at the first error).
	err      error
	errFirst bool
}

// parseOptions steer parseRequest.
type parseOptions struct {
	// maxMessages fails the parse as soon as the message list is longer (ErrLimit).
	maxMessages int
	// other, when not nil, is handed the raw bytes of every top-level member the template does not read
	// (valid JSON, a sub-slice of the body); it is how one scan also serves the gateway's routing fields.
	other func(key string, raw []byte)
	// collect keeps scanning after a field error (a wrong type, a refused field, a missing "messages"):
	// the first one is kept in chatRequest.err and only malformed JSON fails the parse.
	collect bool
}

// parseRequest decodes the body. Fields it does not need are skipped without building values (or handed
// raw to o.other); the message list is counted while it is decoded so an oversized list fails early.
func parseRequest(body []byte, o parseOptions) (*chatRequest, error) {
	req := &chatRequest{
		tools:               jinja.None(),
		toolChoice:          jinja.Undefined(),
		addGenerationPrompt: true,
		documents:           jinja.None(),
		reasoningEffort:     jinja.None(),
	}
	// field records an error about a field's value: fatal unless the parse collects.
	field := func(err error) error {
		if !o.collect {
			return err
		}
		if req.err == nil {
			req.err = err
		}
		return nil
	}
	s := &jsonScanner{data: body}
	if s.peek() != '{' {
		if s.pos >= len(body) {
			return nil, badRequest("", "empty body")
		}
		return nil, badRequest("", "the body must be a JSON object")
	}
	s.pos++
	haveMessages := false
	for first := true; ; first = false {
		c := s.peek()
		if c == '}' && first {
			s.pos++
			break
		}
		if c != '"' {
			return nil, badRequest("", "invalid JSON: %v", s.errorf("object key must be a string"))
		}
		key, err := s.str()
		if err != nil {
			return nil, badRequest("", "invalid JSON: %v", err)
		}
		if err := s.expect(':'); err != nil {
			return nil, badRequest("", "invalid JSON: %v", err)
		}
		switch key {
		case "messages":
			req.errFirst = req.err != nil
			msgs, plain, isList, err := s.messageList(o.maxMessages)
			if err != nil {
				return nil, err
			}
			req.messages, req.plain, req.messagesList, haveMessages = msgs, plain, isList, true
			if !isList {
				if err := field(badRequest("messages", "must be a list")); err != nil {
					return nil, err
				}
			}
		case "tools", "tool_choice", "add_generation_prompt", "continue_final_message", "documents",
			"reasoning_effort", "chat_template_kwargs", "chat_template":
			v, err := s.value(1)
			if err != nil {
				return nil, badRequest(key, "invalid JSON: %v", err)
			}
			if err := field(req.set(key, v)); err != nil {
				return nil, err
			}
		default:
			s.skipSpace()
			start := s.pos
			if err := s.skip(1); err != nil {
				return nil, badRequest(key, "invalid JSON: %v", err)
			}
			if o.other != nil {
				o.other(key, s.data[start:s.pos])
			}
		}
		c = s.peek()
		if c == ',' {
			s.pos++
			continue
		}
		if c == '}' {
			s.pos++
			break
		}
		return nil, badRequest("", "invalid JSON: %v", s.errorf("want ',' or '}' in object"))
	}
	if !s.atEnd() {
		return nil, badRequest("", "trailing data after the JSON body")
	}
	if !haveMessages {
		if err := field(badRequest("messages", "field required")); err != nil {
			return nil, err
		}
	} else if req.err == nil {
		if err := field(req.validate()); err != nil {
			return nil, err
		}
	}
	return req, nil
}

// set stores one decoded top-level field.
func (req *chatRequest) set(key string, v jinja.Value) error {
	var err error
	switch key {
	case "tools":
		req.tools = v
	case "tool_choice":
		req.toolChoice = v
	case "add_generation_prompt":
		req.addGenerationPrompt, err = laxBool(v, key)
	case "continue_final_message":
		req.continueFinal, err = laxBool(v, key)
	case "documents":
		req.documents = v
	case "reasoning_effort":
		req.reasoningEffort = v
	case "chat_template_kwargs":
		switch {
		case v.IsNone():
			req.kwargs = nil
		case v.IsDict():
			req.kwargs = v.AsDict()
		default:
			return badRequest(key, "must be an object")
		}
	case "chat_template":
		if !v.IsNone() {
			// vLLM refuses a request-supplied template unless --trust-request-chat-template is set.
			return badRequest(key, "chat template passed with the request; the model's own template is used and request templates are refused")
		}
	}
	return err
}

// messageList decodes the "messages" array, failing as soon as it holds more than max entries. A value
// that is not an array is skipped (isList false; the caller reports it). plain is every message's
// plainMsg when all of them are plain, nil otherwise.
func (s *jsonScanner) messageList(max int) (msgs []jinja.Value, plain []nativeMsg, isList bool, err error) {
	if s.peek() != '[' {
		if err := s.skip(1); err != nil {
			return nil, nil, false, badRequest("messages", "invalid JSON: %v", err)
		}
		return nil, nil, false, nil
	}
	s.pos++
	msgs = []jinja.Value{}
	if s.peek() == ']' {
		s.pos++
		return msgs, nil, true, nil
	}
	allPlain := true
	for {
		if len(msgs) >= max {
			return nil, nil, true, &RequestError{Kind: ErrLimit, Path: "messages",
				Message: fmt.Sprintf("more than %d messages (limit)", max)}
		}
		v, err := s.value(2)
		if err != nil {
			return nil, nil, true, badRequest(fmt.Sprintf("messages[%d]", len(msgs)), "invalid JSON: %v", err)
		}
		msgs = append(msgs, v)
		if allPlain {
			if m, ok := plainMsg(v); ok {
				plain = append(plain, m)
			} else {
				allPlain, plain = false, nil
			}
		}
		switch s.peek() {
		case ',':
			s.pos++
		case ']':
			s.pos++
			return msgs, plain, true, nil
		default:
			return nil, nil, true, badRequest("messages", "invalid JSON: %v", s.errorf("want ',' or ']' in array"))
		}
	}
}

// laxBool accepts what pydantic's lax bool mode accepts.
func laxBool(v jinja.Value, path string) (bool, error) {
	switch {
	case v.IsBool():
		return v.AsBool(), nil
	case v.IsInt() && (v.AsInt() == 0 || v.AsInt() == 1):
		return v.AsInt() == 1, nil
	case v.IsString():
		switch strings.ToLower(v.AsString()) {
		case "true", "t", "yes", "y", "on", "1":
			return true, nil
		case "false", "f", "no", "n", "off", "0":
			return false, nil
		}
	}
	return false, badRequest(path, "must be a boolean")
}

func (r *chatRequest) validate() error {
	if r.continueFinal && r.addGenerationPrompt {
		return badRequest("continue_final_message", "cannot set both `continue_final_message` and `add_generation_prompt` to true")
	}
	if !r.tools.IsNone() && !r.tools.IsList() {
		return badRequest("tools", "must be a list")
	}
	if !r.documents.IsNone() && !r.documents.IsList() {
		return badRequest("documents", "must be a list of objects")
	}
	if !r.documents.IsNone() {
		for i, doc := range r.documents.AsList().Items {
			if !doc.IsDict() {
				return badRequest(fmt.Sprintf("documents[%d]", i), "must be an object")
			}
		}
	}
	if !r.reasoningEffort.IsNone() && !r.reasoningEffort.IsString() {
		return badRequest("reasoning_effort", "must be a string")
	}
	return nil
}

// toolDicts mirrors `[tool.model_dump() for tool in request.tools]` on vLLM's ChatCompletionToolsParam:
// {"type": "function", "function": {"name", "description", "parameters", <extra fields>}, <extra fields>},
// with description and parameters None when absent. It returns None when tools are absent or excluded.
func (r *chatRequest) toolDicts(excludeOnNone bool) (jinja.Value, error) {
	if r.tools.IsNone() {
		return jinja.None(), nil
	}
	if excludeOnNone && r.toolChoice.IsString() && r.toolChoice.AsString() == "none" {
		return jinja.None(), nil
	}
	items := r.tools.AsList().Items
	out := make([]jinja.Value, 0, len(items))
	for i, t := range items {
		path := fmt.Sprintf("tools[%d]", i)
		if !t.IsDict() {
			return jinja.None(), badRequest(path, "must be an object")
		}
		td := t.AsDict()
		if typ, ok := td.Get("type"); ok && !(typ.IsString() && typ.AsString() == "function") {
			return jinja.None(), badRequest(path+".type", "must be \"function\"")
		}
		fn, ok := td.Get("function")
		if !ok || !fn.IsDict() {
			return jinja.None(), badRequest(path+".function", "field required (an object)")
		}
		fd := fn.AsDict()
		name, ok := fd.Get("name")
		if !ok || !name.IsString() {
			return jinja.None(), badRequest(path+".function.name", "field required (a string)")
		}
		desc, ok := fd.Get("description")
		if !ok {
			desc = jinja.None()
		} else if !desc.IsNone() && !desc.IsString() {
			return jinja.None(), badRequest(path+".function.description", "must be a string")
		}
		params, ok := fd.Get("parameters")
		if !ok {
			params = jinja.None()
		} else if !params.IsNone() && !params.IsDict() {
			return jinja.None(), badRequest(path+".function.parameters", "must be an object")
		}
		f := jinja.NewDict()
		f.AsDict().Set("name", name)
		f.AsDict().Set("description", desc)
		f.AsDict().Set("parameters", params)
		for _, k := range fd.Keys {
			if k != "name" && k != "description" && k != "parameters" {
				f.AsDict().Set(k, fd.Data[k])
			}
		}
		dump := jinja.NewDict()
		dump.AsDict().Set("type", jinja.NewString("function"))
		dump.AsDict().Set("function", f)
		for _, k := range td.Keys {
			if k != "type" && k != "function" {
				dump.AsDict().Set(k, td.Data[k])
			}
		}
		out = append(out, dump)
	}
	return jinja.NewList(out), nil
}

// textPartTypes are the part types whose content is text (vLLM MM_PARSER_MAP), with the key holding it.
var textPartTypes = map[string]string{
	"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking",
}

// mediaPartTypes maps vLLM's media part types to the modality a content-list template sees.
var mediaPartTypes = map[string]string{
	"image_url": "image", "input_image": "image", "image_pil": "image",
	"audio_url": "audio", "input_audio": "audio", "video_url": "video",
}

// conversation mirrors vLLM's parse_chat_messages + _postprocess_messages
// (vllm/entrypoints/chat_utils.py): every message is rebuilt as {"role", "content", ...} with content a
// string ("string" format: text parts joined with "\n") or a list of parts ("openai" format), then
// assistant tool_calls, reasoning, tool_call_id, name, task and developer tools are copied over; tool
// call arguments given as JSON strings are parsed into values ({} when empty or invalid) and an empty
// tool_calls list is dropped.
func conversation(msgs []jinja.Value, format ContentFormat) ([]jinja.Value, error) {
	out := make([]jinja.Value, 0, len(msgs))
	for i, m := range msgs {
		path := "messages[" + strconv.Itoa(i) + "]"
		if !m.IsDict() {
			return nil, badRequest(path, "must be an object")
		}
		md := m.AsDict()
		role, ok := md.Get("role")
		if !ok || !role.IsString() {
			return nil, badRequest(path+".role", "field required (a string)")
		}
		content, err := messageContent(md, path, role.AsString(), format)
		if err != nil {
			return nil, err
		}
		res := jinja.NewDict()
		rd := res.AsDict()
		rd.Set("role", role)
		rd.Set("content", content)
		switch role.AsString() {
		case "assistant":
			if tc, ok := md.Get("tool_calls"); ok && !tc.IsNone() {
				if !tc.IsList() {
					return nil, badRequest(path+".tool_calls", "must be a list")
				}
				items := append([]jinja.Value(nil), tc.AsList().Items...)
				rd.Set("tool_calls", jinja.NewList(items))
			}
			if r, ok := md.Get("reasoning"); ok && !r.IsNone() {
				rd.Set("reasoning", r)
				rd.Set("reasoning_content", r)
			}
		case "tool":
			if id, ok := md.Get("tool_call_id"); ok {
				rd.Set("tool_call_id", id)
			}
			if content.IsList() {
				rd.Set("content", joinToolContent(content.AsList().Items))
			}
		}
		if name, ok := md.Get("name"); ok && name.IsString() {
			rd.Set("name", name)
		}
		if task, ok := md.Get("task"); ok && task.IsString() {
			rd.Set("task", task)
		}
		if role.AsString() == "developer" {
			tools, ok := md.Get("tools")
			if !ok {
				tools = jinja.None()
			}
			rd.Set("tools", tools)
		}
		if err := postprocessToolCalls(rd, path); err != nil {
			return nil, err
		}
		out = append(out, res)
	}
	return out, nil
}

// joinToolContent mirrors vLLM's tool-message normalization: a part list of only text parts becomes
// their texts joined with "\n"; a list with any other dict part stays a list.
func joinToolContent(items []jinja.Value) jinja.Value {
	var texts []string
	for _, it := range items {
		if !it.IsDict() {
			continue
		}
		typ, _ := it.AsDict().Get("type")
		if !(typ.IsString() && typ.AsString() == "text") {
			return jinja.NewList(items)
		}
		t, _ := it.AsDict().Get("text")
		if t.IsString() {
			texts = append(texts, t.AsString())
		} else {
			texts = append(texts, "")
		}
	}
	return jinja.NewString(strings.Join(texts, "\n"))
}

// postprocessToolCalls mirrors _postprocess_messages for one message.
func postprocessToolCalls(rd *jinja.Dict, path string) error {
	role, _ := rd.Get("role")
	if role.AsString() != "assistant" {
		return nil
	}
	tc, ok := rd.Get("tool_calls")
	if !ok || !tc.IsList() {
		return nil
	}
	items := tc.AsList().Items
	if len(items) == 0 {
		// Drop empty tool_calls so templates take the normal assistant path.
		keys := rd.Keys[:0:0]
		for _, k := range rd.Keys {
			if k != "tool_calls" {
				keys = append(keys, k)
			}
		}
		rd.Keys = keys
		delete(rd.Data, "tool_calls")
		return nil
	}
	for j, it := range items {
		p := fmt.Sprintf("%s.tool_calls[%d]", path, j)
		if !it.IsDict() {
			return badRequest(p, "must be an object")
		}
		fn, ok := it.AsDict().Get("function")
		if !ok || !fn.IsDict() {
			return badRequest(p+".function", "field required (an object)")
		}
		fd := fn.AsDict()
		args, _ := fd.Get("arguments")
		switch {
		case args.IsString():
			parsed, err := parseJSONValue([]byte(args.AsString()))
			if err != nil {
				parsed = jinja.NewDict()
			}
			fd.Set("arguments", parsed)
		case args.IsDict() || args.IsList():
		default:
			fd.Set("arguments", jinja.NewDict())
		}
	}
	return nil
}

// messageContent mirrors _parse_chat_message_content_parts for one message.
func messageContent(md *jinja.Dict, path, role string, format ContentFormat) (jinja.Value, error) {
	c, ok := md.Get("content")
	var parts []jinja.Value
	switch {
	case !ok || c.IsNone():
	case c.IsString():
		p := jinja.NewDict()
		p.AsDict().Set("type", jinja.NewString("text"))
		p.AsDict().Set("text", c)
		parts = []jinja.Value{p}
	case c.IsList():
		parts = c.AsList().Items
	default:
		return jinja.None(), badRequest(path+".content", "must be a string, a list of content parts or null")
	}
	acc := &partAccumulator{wrap: format == FormatOpenAI}
	for k, part := range parts {
		if err := acc.add(part, fmt.Sprintf("%s.content[%d]", path, k)); err != nil {
			return jinja.None(), err
		}
	}
	if acc.wrap {
		if acc.list == nil {
			acc.list = []jinja.Value{}
		}
		return jinja.NewList(acc.list), nil
	}
	return jinja.NewString(strings.Join(acc.texts, "\n")), nil
}

// partAccumulator collects one message's parts: texts for the "string" format, part dicts for "openai".
type partAccumulator struct {
	wrap  bool
	texts []string
	list  []jinja.Value
}

func (a *partAccumulator) text(s string) {
	if a.wrap {
		a.list = append(a.list, textPart(s))
	} else {
		a.texts = append(a.texts, s)
	}
}

// add mirrors _parse_chat_message_content_part (and _parse_chat_message_content_mm_part) for one part.
func (a *partAccumulator) add(part jinja.Value, pp string) error {
	if part.IsString() {
		a.text(part.AsString())
		return nil
	}
	if !part.IsDict() {
		return badRequest(pp, "must be a string or an object")
	}
	pd := part.AsDict()
	typ, hasType := pd.Get("type")
	uuid, hasUUID := pd.Get("uuid")
	if hasUUID && uuid.IsNone() {
		hasUUID = false
	}
	if hasType && !typ.IsNone() && !typ.IsString() {
		return badRequest(pp+".type", "invalid 'type' field in content part")
	}
	if !hasType || typ.IsNone() || hasUUID {
		// vLLM's type-less forms: {"image_url": ...}, {"audio_url": ...}, ... (also any part with a uuid).
		for _, key := range []string{"image_url", "image_pil", "image_embeds", "audio_embeds", "prompt_embeds", "audio_url", "input_audio", "video_url", "tool_reference"} {
			v, ok := pd.Get(key)
			if !ok {
				continue
			}
			if key == "tool_reference" {
				if v.IsDict() {
					v, _ = v.AsDict().Get("name")
				}
				return a.toolReference(v, pp)
			}
			return a.media(key, pp)
		}
		return badRequest(pp, "missing 'type' field in content part")
	}
	t := typ.AsString()
	if key, ok := textPartTypes[t]; ok {
		v, ok := pd.Get(key)
		if !ok || v.IsNone() {
			if t == "text" || t == "refusal" {
				return nil // vLLM skips text/refusal parts without content
			}
			return badRequest(pp+"."+key, "field required")
		}
		if !v.IsString() {
			return badRequest(pp+"."+key, "must be a string")
		}
		a.text(v.AsString())
		return nil
	}
	if t == "tool_reference" {
		name, _ := pd.Get("name")
		return a.toolReference(name, pp)
	}
	return a.media(t, pp)
}

func (a *partAccumulator) toolReference(name jinja.Value, path string) error {
	if !name.IsString() {
		return badRequest(path+".name", "tool_reference needs a string name")
	}
	if a.wrap {
		p := jinja.NewDict()
		p.AsDict().Set("type", jinja.NewString("tool_reference"))
		p.AsDict().Set("name", name)
		a.list = append(a.list, p)
	} else {
		a.texts = append(a.texts, name.AsString())
	}
	return nil
}

// media handles a non-text part. A template that takes content lists sees {"type": <modality>}, as
// vLLM hands it; a template that takes strings would see a model-specific placeholder vLLM takes from the
// model's multimodal processor, which the gateway does not have, so that is ErrUnsupportedContent, as are
// embeddings and unknown part types.
func (a *partAccumulator) media(partType, path string) error {
	modality, ok := mediaPartTypes[partType]
	if !ok {
		return &RequestError{Kind: ErrUnsupportedContent, Path: path,
			Message: fmt.Sprintf("unsupported chat content part type %q", partType)}
	}
	if !a.wrap {
		return &RequestError{Kind: ErrUnsupportedContent, Path: path,
			Message: fmt.Sprintf("%q part on a template that takes string content: its placeholder text is model-specific", partType)}
	}
	p := jinja.NewDict()
	p.AsDict().Set("type", jinja.NewString(modality))
	a.list = append(a.list, p)
	return nil
}

func textPart(s string) jinja.Value {
	p := jinja.NewDict()
	p.AsDict().Set("type", jinja.NewString("text"))
	p.AsDict().Set("text", jinja.NewString(s))
	return p
}
