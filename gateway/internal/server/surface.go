package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/gofiber/fiber/v2"

	"github.com/kvgate/kvgate/gateway/internal/openai"
	"github.com/kvgate/kvgate/gateway/internal/route"
	"github.com/kvgate/kvgate/gateway/internal/tokenizer"
)

// The rest of the OpenAI surface a client expects beside chat and completions: GET /v1/models/{id},
// POST /v1/responses and /v1/embeddings (proxied through the same pipeline as chat: generate), and vLLM's
// POST /tokenize and /detokenize, answered by the gateway itself with the model's tokenizer. Every route is
// behind the one auth middleware (auth, refusal); bodies are bounded by max_body_bytes (headerReceived).

// HeaderRouting says how a proxied request was routed: RoutingKVAware (its prompt blocks were matched
// against the KV index) or RoutingLoadBased (on load alone). HeaderRoutingReason says why a request went
// load-based: a request field ("previous_response_id", "tools", "item:function_call",
// "content:input_image", "chat_template", "embeddings"), "store_down", or "no_full_block" (a prompt shorter
// than one block).
const (
	HeaderRouting       = "x-kvgate-routing"
	HeaderRoutingReason = "x-kvgate-routing-reason"
	RoutingKVAware      = "kv-aware"
	RoutingLoadBased    = "load-based"
)

// Paths of the routes registered here.
const (
	pathModelsPrefix = "/v1/models/"
	pathTokenize     = "/tokenize"
	pathDetokenize   = "/detokenize"
)

// registerSurface registers the routes of this file (called by New after the chat routes).
func (s *Server) registerSurface() {
	s.app.Get(pathModelsPrefix+"*", s.getModel)
	s.app.Post(openai.Responses.Path(), s.generate(openai.Responses))
	s.app.Post(openai.Embeddings.Path(), s.generate(openai.Embeddings))
	s.app.Post(pathTokenize, s.tokenize)
	s.app.Post(pathDetokenize, s.detokenize)
}

// isTokenizePath says whether a normalized path is /tokenize or /detokenize (bodies up to max_body_bytes;
// behind client keys like /v1/).
func isTokenizePath(norm string) bool { return norm == pathTokenize || norm == pathDetokenize }

// setRouting sets HeaderRouting (and HeaderRoutingReason) for plan.
func setRouting(c *fiber.Ctx, p *route.Plan) {
	reason := p.Request.LoadOnlyReason
	switch {
	case reason != "":
	case p.LoadOnly && p.Info.Fallback != "":
		reason = p.Info.Fallback
	case p.TokenIDsSkip != "":
		reason = p.TokenIDsSkip
	case len(p.Keys) == 0:
		reason = "no_full_block"
	}
	if reason == "" {
		c.Set(HeaderRouting, RoutingKVAware)
		return
	}
	c.Set(HeaderRouting, RoutingLoadBased)
	c.Set(HeaderRoutingReason, reason)
}

// modelObjects indexes the entries of GET /v1/models by ID (the same objects, created time included).
func (s *Server) modelObjects() map[string]json.RawMessage {
	s.modelsOnce.Do(func() {
		var list struct {
			Data []json.RawMessage `json:"data"`
		}
		_ = json.Unmarshal(s.modelsJ, &list)
		s.modelsByID = make(map[string]json.RawMessage, len(list.Data))
		for _, m := range list.Data {
			var e struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(m, &e) == nil {
				s.modelsByID[e.ID] = m
			}
		}
	})
	return s.modelsByID
}

// surfaceState is the lazily built state of this file's routes, embedded in Server.
type surfaceState struct {
	modelsOnce sync.Once
	modelsByID map[string]json.RawMessage
}

// getModel serves GET /v1/models/{id}: the model object of GET /v1/models ({"id","object":"model",
// "created","owned_by","root","parent"}), or 404 model_not_found in OpenAI's error shape. The ID is the
// rest of the path, percent-decoded (the Node SDK escapes a "/" in an ID; openai-go does not).
func (s *Server) getModel(c *fiber.Ctx) error {
	raw := strings.TrimPrefix(string(c.Request().URI().PathOriginal()), pathModelsPrefix)
	id, err := url.PathUnescape(raw)
	if err != nil {
		id = raw
	}
	m, ok := s.modelObjects()[id]
	if !ok {
		return openai.ModelNotFound(id)
	}
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Send(m)
}

// textModel is what /tokenize and /detokenize need of a model's encoder (gateway/internal/model.Model).
type textModel interface {
	route.Encoder
	Tokenizer() *tokenizer.Tokenizer
}

// tokenizeModel resolves the optional `model` of a /tokenize or /detokenize body: a served model or LoRA
// adapter (its base model's tokenizer), or, when absent, the only model served.
func (s *Server) tokenizeModel(raw json.RawMessage) (*route.Model, textModel, error) {
	var name string
	if t := bytes.TrimSpace(raw); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		if json.Unmarshal(raw, &name) != nil || name == "" {
			return nil, nil, openai.BadRequest("model", "`model` must be a non-empty string.")
		}
	}
	if name == "" {
		if len(s.o.Config.Models) != 1 {
			return nil, nil, openai.BadRequest("model", "`model` is required: this gateway serves %d models.", len(s.o.Config.Models))
		}
		name = s.o.Config.Models[0].Name
	}
	sm, ok := s.o.Models[name]
	if !ok {
		return nil, nil, openai.ModelNotFound(name)
	}
	tm, ok := sm.Model.Encoder.(textModel)
	if !ok {
		return nil, nil, openai.Errorf(http.StatusNotImplemented, "server_error", "", "", "The model `%s` has no tokenizer in the gateway.", name)
	}
	return sm.Model, tm, nil
}

// tokenizeBody is vLLM's TokenizeRequest: TokenizeCompletionRequest {model?, prompt, add_special_tokens
// (default true), return_token_strs} or TokenizeChatRequest {model?, messages, add_generation_prompt
// (default true), continue_final_message, add_special_tokens (default false), chat_template_kwargs, tools,
// return_token_strs}.
type tokenizeBody struct {
	Model            json.RawMessage `json:"model"`
	Prompt           *string         `json:"prompt"`
	Messages         json.RawMessage `json:"messages"`
	AddSpecialTokens *bool           `json:"add_special_tokens"`
	ReturnTokenStrs  *bool           `json:"return_token_strs"`
	ChatTemplate     json.RawMessage `json:"chat_template"`
}

// tokenizeResponse is vLLM's TokenizeResponse. MaxModelLen is the model's max_prompt_tokens (0 when it
// has none: the gateway does not know the engines' context length).
type tokenizeResponse struct {
	Count       int       `json:"count"`
	MaxModelLen int       `json:"max_model_len"`
	Tokens      []uint32  `json:"tokens"`
	TokenStrs   *[]string `json:"token_strs"`
}

// tokenize serves vLLM's POST /tokenize with the model's own tokenizer and chat template (the IDs the
// gateway routes on, which the drift guard checks against the engines' own /tokenize). Errors are 400 in
// OpenAI's shape (404 for an unknown model).
func (s *Server) tokenize(c *fiber.Ctx) error {
	body := c.Body()
	var b tokenizeBody
	if err := json.Unmarshal(body, &b); err != nil {
		if !json.Valid(body) {
			return openai.BadRequest("", "Request body is not valid JSON.")
		}
		return openai.BadRequest("", "Request body must be a JSON object with `prompt` (a string) or `messages`.")
	}
	rm, tm, err := s.tokenizeModel(b.Model)
	if err != nil {
		return err
	}
	var ids []uint32
	switch {
	case b.Prompt != nil && len(b.Messages) > 0:
		return openai.BadRequest("", "Give either `prompt` or `messages`, not both.")
	case b.Prompt != nil:
		add := b.AddSpecialTokens == nil || *b.AddSpecialTokens
		ids = tm.Tokenizer().Encode(*b.Prompt, add)
	case len(b.Messages) > 0:
		if t := bytes.TrimSpace(b.ChatTemplate); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
			return openai.BadRequest("chat_template", "A request's own `chat_template` is not supported: the gateway renders the model's template.")
		}
		prompt, chatIDs, err := tm.EncodeChat(body)
		if err != nil {
			return RouteError("", route.ChatError(err)) // a RequestError: a 400
		}
		ids = chatIDs
		if b.AddSpecialTokens != nil && *b.AddSpecialTokens {
			ids = tm.Tokenizer().Encode(prompt, true)
		}
	default:
		return openai.BadRequest("prompt", "Either `prompt` or `messages` is required.")
	}
	out := tokenizeResponse{Count: len(ids), MaxModelLen: rm.MaxPromptTokens, Tokens: append([]uint32{}, ids...)}
	if b.ReturnTokenStrs != nil && *b.ReturnTokenStrs {
		strs := make([]string, len(ids))
		for i, id := range ids {
			strs[i], _ = tm.Tokenizer().TokenString(id)
		}
		out.TokenStrs = &strs
	}
	return c.JSON(out)
}

// detokenize serves vLLM's POST /detokenize: {model?, tokens: [int]} → {"prompt": text}, decoded as
// HF's decode(tokens) (special tokens kept). An ID the tokenizer does not define is 400.
func (s *Server) detokenize(c *fiber.Ctx) error {
	var b struct {
		Model  json.RawMessage `json:"model"`
		Tokens *[]int64        `json:"tokens"`
	}
	if err := json.Unmarshal(c.Body(), &b); err != nil {
		if !json.Valid(c.Body()) {
			return openai.BadRequest("", "Request body is not valid JSON.")
		}
		return openai.BadRequest("tokens", "`tokens` must be a list of token IDs.")
	}
	_, tm, err := s.tokenizeModel(b.Model)
	if err != nil {
		return err
	}
	if b.Tokens == nil {
		return openai.BadRequest("tokens", "`tokens` is required.")
	}
	tok := tm.Tokenizer()
	ids := make([]uint32, len(*b.Tokens))
	for i, v := range *b.Tokens {
		if v < 0 || v > 1<<32-1 || !tok.Defines(uint32(v)) {
			return openai.BadRequest("tokens", "Token ID %d at index %d is not in the vocabulary.", v, i)
		}
		ids[i] = uint32(v)
	}
	return c.JSON(fiber.Map{"prompt": tok.Decode(ids)})
}
