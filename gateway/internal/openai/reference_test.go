package openai

import (
	"github.com/tidwall/gjson"
)

// referenceParse is ParseRequest written independently on gjson alone, validations included (main code
// validates once, in fields.apply): the reference FuzzParseRequest and TestParseChatMatchesGJSON compare
// parseChat against, and the baseline of BenchmarkParseRequest.
func referenceParse(api API, body []byte) (*Request, error) {
	if !gjson.ValidBytes(body) {
		return nil, BadRequest("", "Request body is not valid JSON.")
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return nil, BadRequest("", "Request body must be a JSON object.")
	}
	r := &Request{API: api, MaxTokens: -1, N: 1, Prompts: 1}
	// One pass over the top-level members (a large body is scanned once, not once per field).
	var model, stream, maxTokens, maxCompletion, n, salt, msgs, prompt, bestOf gjson.Result
	root.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "model":
			model = v
		case "stream":
			stream = v
		case "max_tokens":
			maxTokens = v
		case "max_completion_tokens":
			maxCompletion = v
		case "n":
			n = v
		case "best_of":
			bestOf = v
		case "cache_salt":
			salt = v
		case "messages":
			msgs = v
		case "prompt":
			prompt = v
		case "prompt_token_ids":
			r.HasPromptTokenIDs = true
		}
		return true
	})
	if model.Type != gjson.String || model.Str == "" {
		return nil, BadRequest("model", "`model` must be a non-empty string.")
	}
	r.Model = model.Str
	if stream.Exists() && stream.Type != gjson.Null {
		if stream.Type != gjson.True && stream.Type != gjson.False {
			return nil, BadRequest("stream", "`stream` must be a boolean.")
		}
		r.Stream = stream.Bool()
	}
	for _, f := range []struct {
		k string
		v gjson.Result
	}{{"max_tokens", maxTokens}, {"max_completion_tokens", maxCompletion}} {
		if !f.v.Exists() || f.v.Type == gjson.Null {
			continue
		}
		n, ok := tokenCount(f.v.Raw)
		if !ok {
			return nil, BadRequest(f.k, "`%s` must be a non-negative integer.", f.k)
		}
		r.MaxTokens = n
	}
	if n.Exists() && n.Type != gjson.Null {
		v, ok := tokenCount(n.Raw)
		if !ok || v < 1 {
			return nil, BadRequest("n", "`n` must be a positive integer.")
		}
		r.N = min(v, MaxNCap)
	}
	if bestOf.Exists() && bestOf.Type != gjson.Null {
		v, ok := tokenCount(bestOf.Raw)
		if !ok || v < 1 {
			return nil, BadRequest("best_of", "`best_of` must be a positive integer.")
		}
		r.BestOf = min(v, MaxNCap)
	}
	if salt.Exists() && salt.Type != gjson.Null {
		if salt.Type != gjson.String {
			return nil, BadRequest("cache_salt", "`cache_salt` must be a string.")
		}
		r.CacheSalt = salt.Str
	}
	switch api {
	case Chat:
		nonEmpty := false
		if msgs.IsArray() {
			msgs.ForEach(func(_, _ gjson.Result) bool { nonEmpty = true; return false })
		}
		if !nonEmpty {
			return nil, BadRequest("messages", "`messages` must be a non-empty array.")
		}
	case Completions:
		if err := r.readPrompt(prompt); err != nil {
			return nil, err
		}
	}
	return r, nil
}
