package openai

import (
	"bytes"
	"encoding/json"
)

// Responses and embeddings bodies: what the gateway reads of them. The body itself is forwarded untouched,
// as for chat and completions.

// responsesBody is the part of an OpenAI Responses request (POST /v1/responses) the gateway reads.
type responsesBody struct {
	Model              json.RawMessage `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       json.RawMessage `json:"instructions"`
	Stream             json.RawMessage `json:"stream"`
	MaxOutputTokens    json.RawMessage `json:"max_output_tokens"`
	CacheSalt          json.RawMessage `json:"cache_salt"`
	PreviousResponseID json.RawMessage `json:"previous_response_id"`
	Conversation       json.RawMessage `json:"conversation"`
	Prompt             json.RawMessage `json:"prompt"`
	Tools              json.RawMessage `json:"tools"`
}

// responsesItem is one item of a Responses input list: a message (type "message" or no type, with a role)
// or another item type (function_call, function_call_output, reasoning, item_reference, ...).
type responsesItem struct {
	Type    string          `json:"type"`
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// responsesPart is one content part of a Responses message: input_text / output_text carry text; the
// others (input_image, input_file, input_audio, refusal) do not map onto a text chat.
type responsesPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// chatMessage is one message of the chat a Responses request maps onto: content is the item's string, or
// its text parts as chat "text" parts (vLLM reads input_text/output_text parts as text parts).
type chatMessage struct {
	Role    string `json:"role"`
	Content any    `json:"content"`
}

type textPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

func present(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && !bytes.Equal(t, []byte("null"))
}

// parseResponses is ParseRequest for Responses: model, stream, max_output_tokens (Request.MaxTokens) and
// cache_salt are validated as for chat; `instructions` (a system message) and `input` (a string: one user
// message; or a list of message items with string or input_text/output_text content) become the chat
// Request.Chat holds, rendered by the model's chat template as the engine renders it. A request that maps
// onto no chat (previous_response_id, conversation, a stored prompt, tools, other item types, non-text
// parts) has Request.Chat nil and LoadOnlyReason set: it is routed on load. Errors are 400 *Error.
func parseResponses(body []byte) (*Request, error) {
	if !json.Valid(body) {
		return nil, BadRequest("", "Request body is not valid JSON.")
	}
	var b responsesBody
	if err := json.Unmarshal(body, &b); err != nil {
		return nil, BadRequest("", "Request body must be a JSON object.")
	}
	f := fields{model: string(bytes.TrimSpace(b.Model)), stream: string(bytes.TrimSpace(b.Stream)),
		salt: string(bytes.TrimSpace(b.CacheSalt))}
	r := &Request{API: Responses, MaxTokens: -1, N: 1, Prompts: 1}
	if err := f.apply(r); err != nil {
		return nil, err
	}
	if present(b.MaxOutputTokens) {
		n, ok := tokenCount(string(bytes.TrimSpace(b.MaxOutputTokens)))
		if !ok {
			return nil, BadRequest("max_output_tokens", "`max_output_tokens` must be a non-negative integer.")
		}
		r.MaxTokens = n
	}
	if !present(b.Input) && !present(b.PreviousResponseID) && !present(b.Conversation) && !present(b.Prompt) {
		return nil, BadRequest("input", "`input` is required.")
	}
	msgs, reason, err := responsesChat(&b)
	if err != nil {
		return nil, err
	}
	if reason != "" {
		r.LoadOnlyReason = reason
		return r, nil
	}
	chatBody, _ := json.Marshal(map[string]any{"model": r.Model, "messages": msgs})
	cr, err := parseChat(chatBody)
	if err != nil {
		r.LoadOnlyReason = "input"
		return r, nil
	}
	r.Chat = cr.Chat
	return r, nil
}

// responsesChat maps a Responses request onto chat messages, or says why it does not map (reason).
func responsesChat(b *responsesBody) (msgs []chatMessage, reason string, err error) {
	switch {
	case present(b.PreviousResponseID):
		return nil, "previous_response_id", nil
	case present(b.Conversation):
		return nil, "conversation", nil
	case present(b.Prompt):
		return nil, "prompt", nil
	case present(b.Tools) && !bytes.Equal(bytes.TrimSpace(b.Tools), []byte("[]")):
		return nil, "tools", nil
	}
	if present(b.Instructions) {
		var s string
		if json.Unmarshal(b.Instructions, &s) != nil {
			return nil, "", BadRequest("instructions", "`instructions` must be a string.")
		}
		msgs = append(msgs, chatMessage{Role: "system", Content: s})
	}
	var text string
	if json.Unmarshal(b.Input, &text) == nil {
		return append(msgs, chatMessage{Role: "user", Content: text}), "", nil
	}
	var items []responsesItem
	if json.Unmarshal(b.Input, &items) != nil {
		return nil, "", BadRequest("input", "`input` must be a string or a list of input items.")
	}
	if len(items) == 0 {
		return nil, "", BadRequest("input", "`input` must not be an empty list.")
	}
	for _, it := range items {
		if it.Type != "" && it.Type != "message" {
			return nil, "item:" + it.Type, nil
		}
		switch it.Role {
		case "user", "assistant", "system", "developer":
		default:
			return nil, "", BadRequest("input", "A message item's `role` must be user, assistant, system or developer.")
		}
		var s string
		if json.Unmarshal(it.Content, &s) == nil {
			msgs = append(msgs, chatMessage{Role: it.Role, Content: s})
			continue
		}
		var parts []responsesPart
		if json.Unmarshal(it.Content, &parts) != nil {
			return nil, "", BadRequest("input", "A message item's `content` must be a string or a list of content parts.")
		}
		tp := make([]textPart, 0, len(parts))
		for _, p := range parts {
			if p.Type != "input_text" && p.Type != "output_text" {
				return nil, "content:" + p.Type, nil
			}
			tp = append(tp, textPart{Type: "text", Text: p.Text})
		}
		msgs = append(msgs, chatMessage{Role: it.Role, Content: tp})
	}
	return msgs, "", nil
}

// embeddingsBody is the part of an OpenAI embeddings request (POST /v1/embeddings) the gateway reads.
type embeddingsBody struct {
	Model json.RawMessage `json:"model"`
	Input json.RawMessage `json:"input"`
}

// parseEmbeddings is ParseRequest for Embeddings: `model` and `input` (a string, a list of strings, a list
// of token IDs or a list of token-ID lists, not empty) are validated; Request.Prompts counts the inputs
// (each is a sequence the engine runs), MaxTokens is 0 (nothing is generated) and the request is routed
// on load (LoadOnlyReason "embeddings"). Errors are 400 *Error.
func parseEmbeddings(body []byte) (*Request, error) {
	if !json.Valid(body) {
		return nil, BadRequest("", "Request body is not valid JSON.")
	}
	var b embeddingsBody
	if err := json.Unmarshal(body, &b); err != nil {
		return nil, BadRequest("", "Request body must be a JSON object.")
	}
	r := &Request{API: Embeddings, MaxTokens: 0, N: 1, Prompts: 1, LoadOnlyReason: "embeddings"}
	f := fields{model: string(bytes.TrimSpace(b.Model))}
	if err := f.apply(r); err != nil {
		return nil, err
	}
	bad := BadRequest("input", "`input` must be a string, a list of strings, a list of token IDs or a list of token-ID lists.")
	var s string
	if json.Unmarshal(b.Input, &s) == nil {
		return r, nil
	}
	var strs []string
	var ids []uint32
	var lists [][]uint32
	switch {
	case json.Unmarshal(b.Input, &strs) == nil:
		r.Prompts = len(strs)
	case json.Unmarshal(b.Input, &ids) == nil:
		r.BatchIDTokens = int64(len(ids))
	case json.Unmarshal(b.Input, &lists) == nil:
		r.Prompts = len(lists)
		for _, l := range lists {
			if len(l) == 0 {
				return nil, bad
			}
			r.BatchIDTokens += int64(len(l))
		}
	default:
		return nil, bad
	}
	if r.Prompts == 0 || len(bytes.TrimSpace(b.Input)) == 2 {
		return nil, BadRequest("input", "`input` must not be empty.")
	}
	return r, nil
}
