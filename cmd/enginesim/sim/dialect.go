package sim

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Engine dialects (Config.API, --api): which chat field carries pre-tokenized prompts and how /tokenize is
// served. Each constant names the engine source file (and PR) its shapes come from.
const (
	// APIVLLM is vLLM: chat honours kv_transfer_params.prompt_token_ids (vLLM's
	// vllm/renderers/online_renderer.py _reused_prompt_token_ids, #48145) and a top-level prompt_token_ids
	// (kvgate's channel; the first-class field proposed in vLLM #55771) and ignores input_ids;
	// POST /tokenize takes {"prompt"} or {"messages", "tools", ...} and answers
	// {"count","max_model_len","tokens","token_strs"}.
	APIVLLM = "vllm"
	// APISGLang is SGLang: chat honours input_ids (sglang ChatCompletionRequest.input_ids) and ignores
	// prompt_token_ids and kv_transfer_params; POST /v1/tokenize takes exactly one of {"prompt"} (a string
	// or a list of strings) and {"messages", "tools", ...} and answers {"tokens","count","max_model_len"}.
	APISGLang = "sglang"
)

// HeaderPromptTokenized is the response header saying whether the engine rendered and tokenized the
// request's prompt itself ("true") or took the token IDs it was given ("false"). Set on every completion
// response, streaming or not; enginesim:prompts_tokenized_total counts the "true" ones.
const HeaderPromptTokenized = "X-Enginesim-Prompt-Tokenized"

// chatIDs is what a chat body may carry pre-tokenized, in every dialect's field.
type chatIDs struct {
	PromptTokenIDs   []uint32 `json:"prompt_token_ids"`
	InputIDs         []uint32 `json:"input_ids"`
	KVTransferParams *struct {
		PromptTokenIDs []uint32 `json:"prompt_token_ids"`
	} `json:"kv_transfer_params"`
}

// pick returns the token IDs the dialect honours (nil: tokenize messages), as the engine reads them: an
// absent, null or empty list means "not given".
func (c *chatIDs) pick(api string) []uint32 {
	if api == APISGLang {
		if len(c.InputIDs) > 0 {
			return c.InputIDs
		}
		return nil
	}
	if c.KVTransferParams != nil && len(c.KVTransferParams.PromptTokenIDs) > 0 {
		return c.KVTransferParams.PromptTokenIDs
	}
	if len(c.PromptTokenIDs) > 0 {
		return c.PromptTokenIDs
	}
	return nil
}

// dialectMetrics are the dialect's counters, registered on the engine's registry.
type dialectMetrics struct {
	tokenized prometheus.Counter
}

func newDialectMetrics(m *metrics, modelName string) dialectMetrics {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "enginesim:prompts_tokenized_total",
		Help:        "Prompts the engine rendered and tokenized itself (chat messages, completion text); /tokenize calls are not counted.",
		ConstLabels: prometheus.Labels{"model_name": modelName}})
	m.reg.MustRegister(c)
	return dialectMetrics{tokenized: c}
}

// PromptsTokenized returns enginesim:prompts_tokenized_total: prompts the engine rendered and tokenized
// itself (not counting /tokenize).
func (e *Engine) PromptsTokenized() int64 { return e.tokenizedN.Load() }

// LastChatBody returns the body of the last /v1/chat/completions request, as received (nil before one).
func (e *Engine) LastChatBody() []byte {
	if b := e.lastChat.Load(); b != nil {
		return *b
	}
	return nil
}

func (e *Engine) countTokenized() {
	e.tokenizedN.Add(1)
	e.dm.tokenized.Inc()
}

// encodeChat renders and tokenizes a chat body as the engine does for generation and /tokenize: with the
// template_drift fault armed, the rendered prompt differs from the model's template (see driftPrompt).
// It then waits, when Config.RenderTokenizePerToken is set, until the call has taken that long per prompt
// token (× TimeScale): the calibrated cost of a real engine's Jinja render + HF tokenizer.
func (e *Engine) encodeChat(ctx context.Context, body []byte) ([]uint32, error) {
	start := time.Now()
	prompt, ids, err := e.model.EncodeChat(body)
	if err != nil {
		return nil, err
	}
	if e.faults.get().TemplateDrift {
		e.m.faults.WithLabelValues("template_drift").Inc()
		ids = e.model.EncodeText(driftPrompt(prompt)) // chat adds no special tokens
	}
	e.payTokenizeCost(ctx, start, len(ids))
	return ids, nil
}

func (e *Engine) payTokenizeCost(ctx context.Context, start time.Time, tokens int) {
	if e.cfg.RenderTokenizePerToken <= 0 || e.cfg.TimeScale <= 0 {
		return
	}
	want := time.Duration(float64(e.cfg.RenderTokenizePerToken) * float64(tokens) * e.cfg.TimeScale)
	if d := want - time.Since(start); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
}

// driftPrompt is the prompt a changed chat template renders: the same text with one more newline after the
// first line (an operator edited the template on the engine's side only).
func driftPrompt(p string) string {
	if i := strings.IndexByte(p, '\n'); i >= 0 {
		return p[:i+1] + "\n" + p[i+1:]
	}
	return p + "\n"
}

// handleTokenizeSGLang answers SGLang's POST /v1/tokenize: exactly one of "prompt" (a string, or a list of
// strings: one token list each; add_special_tokens default true) and "messages" (a chat body rendered with
// the chat template, tools included). Answer: {"tokens","count","max_model_len"}.
func (e *Engine) handleTokenizeSGLang(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model            string          `json:"model"`
		Prompt           json.RawMessage `json:"prompt"`
		Messages         json.RawMessage `json:"messages"`
		AddSpecialTokens *bool           `json:"add_special_tokens"`
	}
	body, err := readJSONBody(r, &req)
	if err != nil {
		writeErr(w, err)
		return
	}
	if req.Model != "" && req.Model != "default" {
		if _, _, err := e.resolveModel(req.Model, ""); err != nil {
			writeErr(w, err)
			return
		}
	}
	hasPrompt := len(req.Prompt) > 0 && string(req.Prompt) != "null"
	hasMsgs := len(req.Messages) > 0 && string(req.Messages) != "null"
	if hasPrompt == hasMsgs {
		writeErr(w, badRequest("Exactly one of 'prompt' or 'messages' must be provided."))
		return
	}
	type resp struct {
		Tokens      any `json:"tokens"`
		Count       any `json:"count"`
		MaxModelLen int `json:"max_model_len"`
	}
	special := req.AddSpecialTokens == nil || *req.AddSpecialTokens
	encode := func(s string) []uint32 {
		ids := e.model.EncodeText(s)
		if special {
			ids = e.model.EncodeCompletion(s)
		}
		if ids == nil {
			ids = []uint32{}
		}
		return ids
	}
	if hasMsgs {
		ids, err := e.encodeChat(r.Context(), body)
		if err != nil {
			writeErr(w, asRequestError(err))
			return
		}
		if ids == nil {
			ids = []uint32{}
		}
		writeJSON(w, http.StatusOK, resp{ids, len(ids), e.cfg.MaxModelLen})
		return
	}
	var one string
	if json.Unmarshal(req.Prompt, &one) == nil {
		ids := encode(one)
		writeJSON(w, http.StatusOK, resp{ids, len(ids), e.cfg.MaxModelLen})
		return
	}
	var many []string
	if err := json.Unmarshal(req.Prompt, &many); err != nil {
		writeErr(w, badRequest("Invalid prompt type. Expected str or List[str]."))
		return
	}
	lists, counts := make([][]uint32, len(many)), make([]int, len(many))
	for i, s := range many {
		lists[i] = encode(s)
		counts[i] = len(lists[i])
	}
	writeJSON(w, http.StatusOK, resp{lists, counts, e.cfg.MaxModelLen})
}
