package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// maxBodyBytes bounds request bodies.
const maxBodyBytes = 64 << 20

func (e *Engine) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", e.handleChat)
	mux.HandleFunc("POST /v1/completions", e.handleCompletions)
	mux.HandleFunc("POST /v1/responses", e.handleResponses)   // responses.go
	mux.HandleFunc("POST /v1/embeddings", e.handleEmbeddings) // responses.go
	mux.HandleFunc("GET /v1/models", e.handleModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.Handle("GET /metrics", promhttp.HandlerFor(e.m.reg, promhttp.HandlerOpts{}))
	if e.cfg.API == APISGLang {
		mux.HandleFunc("POST /v1/tokenize", e.handleTokenizeSGLang)
	} else {
		mux.HandleFunc("POST /tokenize", e.handleTokenize)
	}
	mux.HandleFunc("POST /reset_prefix_cache", e.handleReset)
	mux.HandleFunc("GET /sim/faults", e.handleGetFaults)
	mux.HandleFunc("POST /sim/faults", e.handleSetFaults)
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": "enginesim"})
	})
	return mux
}

// errorBody is vLLM's error response ({"error": {message, type, param, code}}, vLLM ≥ 0.10.2).
type errorBody struct {
	Error errorInfo `json:"error"`
}

type errorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding failed","type":"InternalServerError","param":null,"code":500}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}

func writeError(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, errorBody{Error: errorInfo{Message: msg, Type: typ, Code: status}})
}

// writeErr maps an error to vLLM's error JSON: *RequestError as given, anything else 500.
func writeErr(w http.ResponseWriter, err error) {
	if re, ok := errors.AsType[*RequestError](err); ok {
		writeError(w, re.Status, re.Type, re.Message)
		return
	}
	if errors.Is(err, ErrClosed) {
		writeError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", err.Error())
		return
	}
	writeError(w, http.StatusInternalServerError, "InternalServerError", err.Error())
}

func readBody(r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBodyBytes))
	if err != nil {
		return nil, badRequest("reading the request body: %v", err)
	}
	return b, nil
}

// readJSON reads the request body (readBody) and decodes it into v; errors are a 400 RequestError.
func readJSON(r *http.Request, v any) error {
	_, err := readJSONBody(r, v)
	return err
}

// readJSONBody is readJSON for handlers that also keep the raw body (to render it, or to record it).
func readJSONBody(r *http.Request, v any) ([]byte, error) {
	body, err := readBody(r)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return nil, badRequest("invalid JSON body: %v", err)
	}
	return body, nil
}

// resolveModel maps a request's model (and optional "lora" field) to the served name it answers as and
// the LoRA adapter, accepting "<served>", "<lora>" and "<served>:<lora>". A LoRA name is accepted when it
// is listed in LoRAModules or when none are listed. Unknown models and adapters are a 404 RequestError.
func (e *Engine) resolveModel(model, loraField string) (served, lora string, err error) {
	names := e.cfg.servedNames()
	loraOK := func(l string) bool { return len(e.cfg.LoRAModules) == 0 || slices.Contains(e.cfg.LoRAModules, l) }
	notFound := func(what, name string) error {
		return &RequestError{Status: 404, Type: "NotFoundError", Message: fmt.Sprintf("The %s `%s` does not exist.", what, name)}
	}
	if loraField != "" && !loraOK(loraField) {
		return "", "", notFound("LoRA adapter", loraField)
	}
	switch {
	case model == "":
		return names[0], loraField, nil
	case slices.Contains(names, model):
		return model, loraField, nil
	case slices.Contains(e.cfg.LoRAModules, model):
		return model, model, nil
	}
	if base, l, ok := strings.Cut(model, ":"); ok && slices.Contains(names, base) && l != "" && loraOK(l) {
		return model, l, nil
	}
	return "", "", notFound("model", model)
}

// streamOptions is OpenAI's stream_options.
type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// commonRequest holds the fields both completion APIs share.
type commonRequest struct {
	Model         string         `json:"model"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options"`
	MaxTokens     *jsonInt       `json:"max_tokens"`
	N             *int           `json:"n"`
	CacheSalt     string         `json:"cache_salt"`
	LoRA          string         `json:"lora"`
}

// jsonInt is an integer request field decoded as vLLM's pydantic int field accepts it: an integer literal,
// or a number with no fractional part (2.0, 1e3). Values beyond the int range saturate at its bounds, so a
// huge max_tokens fails the context-length check instead of overflowing. Fractions, strings and other
// types are decoding errors (400).
type jsonInt int

// UnmarshalJSON implements json.Unmarshaler. null leaves the value unchanged (a *jsonInt stays nil).
func (n *jsonInt) UnmarshalJSON(b []byte) error {
	s := string(bytes.TrimSpace(b))
	if s == "null" {
		return nil
	}
	if v, err := strconv.ParseInt(s, 10, 0); err == nil || errors.Is(err, strconv.ErrRange) {
		*n = jsonInt(v) // ParseInt returns the saturated bound with ErrRange
		return nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || s == "" || !(s[0] == '-' || (s[0] >= '0' && s[0] <= '9')) || f != math.Trunc(f) {
		return fmt.Errorf("expected an integer, got %s", s)
	}
	switch {
	case f >= math.MaxInt:
		*n = math.MaxInt
	case f <= math.MinInt:
		*n = math.MinInt
	default:
		*n = jsonInt(f)
	}
	return nil
}

// served is one accepted completion request, after faults, model and token resolution.
type served struct {
	model        string
	lora         string
	salt         string
	maxTokens    int
	stream       bool
	includeUsage bool
	faults       requestFaults
}

// preamble applies the request faults (stall, then failure) and validates the shared fields. It reports
// false when it has answered the request.
func (e *Engine) preamble(w http.ResponseWriter, r *http.Request, c *commonRequest, maxCompletion *jsonInt) (served, bool) {
	f := e.faults.draw()
	if f.stall > 0 {
		e.m.faults.WithLabelValues("stall").Inc()
		e.log.InfoContext(r.Context(), "fault: stalling before headers", slog.Float64("stall_seconds", f.stall.Seconds()))
		t := time.NewTimer(f.stall)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return served{}, false
		}
	}
	if f.failStatus != 0 {
		e.m.faults.WithLabelValues("fail_" + strconv.Itoa(f.failStatus)).Inc()
		e.m.requests.WithLabelValues("fault").Inc()
		e.log.InfoContext(r.Context(), "fault: failing request", slog.Int("status", f.failStatus))
		typ := "InternalServerError"
		if f.failStatus == http.StatusServiceUnavailable {
			typ = "ServiceUnavailableError"
		}
		writeError(w, f.failStatus, typ, "enginesim: injected fault")
		return served{}, false
	}
	name, lora, err := e.resolveModel(c.Model, c.LoRA)
	if err != nil {
		e.reject(w, err)
		return served{}, false
	}
	s := served{model: name, lora: lora, salt: c.CacheSalt, maxTokens: e.cfg.DefaultMaxTokens,
		stream: c.Stream, includeUsage: c.Stream && c.StreamOptions != nil && c.StreamOptions.IncludeUsage, faults: f}
	switch {
	case maxCompletion != nil:
		s.maxTokens = int(*maxCompletion)
	case c.MaxTokens != nil:
		s.maxTokens = int(*c.MaxTokens)
	}
	if s.maxTokens < 1 {
		e.reject(w, badRequest("max_tokens must be at least 1, got %d.", s.maxTokens))
		return served{}, false
	}
	if c.StreamOptions != nil && !c.Stream {
		e.reject(w, badRequest("Stream options can only be defined when `stream=True`."))
		return served{}, false
	}
	if c.N != nil && *c.N != 1 {
		e.reject(w, badRequest("n must be 1 (enginesim generates one choice per prompt), got %d.", *c.N))
		return served{}, false
	}
	return s, true
}

func (e *Engine) reject(w http.ResponseWriter, err error) {
	e.m.requests.WithLabelValues("rejected").Inc()
	writeErr(w, err)
}

type chatRequest struct {
	commonRequest
	chatIDs
	MaxCompletionTokens *jsonInt `json:"max_completion_tokens"`
}

func (e *Engine) handleChat(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(r)
	if err != nil {
		e.reject(w, err)
		return
	}
	e.lastChat.Store(&body)
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		e.reject(w, badRequest("invalid JSON body: %v", err))
		return
	}
	s, ok := e.preamble(w, r, &req.commonRequest, req.MaxCompletionTokens)
	if !ok {
		return
	}
	// The dialect's token-ID field, if given; the others are ignored as that engine ignores them.
	ids := req.chatIDs.pick(e.cfg.API)
	tokenized := ids == nil
	if tokenized {
		ids, err = e.encodeChat(r.Context(), body)
		if err != nil {
			e.reject(w, asRequestError(err))
			return
		}
		e.countTokenized()
	}
	w.Header().Set(HeaderPromptTokenized, strconv.FormatBool(tokenized))
	e.serve(w, r, s, [][]uint32{ids}, true)
}

// asRequestError turns a text-pipeline error into a 400 RequestError.
func asRequestError(err error) error {
	if _, ok := errors.AsType[*RequestError](err); ok {
		return err
	}
	return badRequest("%v", err)
}

type completionRequest struct {
	commonRequest
	Prompt json.RawMessage `json:"prompt"`
}

// parsePrompts decodes a completions prompt: a string, a token-ID list, or a non-empty list of either.
func (e *Engine) parsePrompts(raw json.RawMessage) ([][]uint32, error) {
	p, _, err := e.parsePromptsCounted(raw)
	return p, err
}

// parsePromptsCounted is parsePrompts that also returns how many of the prompts were text it tokenized.
func (e *Engine) parsePromptsCounted(raw json.RawMessage) (_ [][]uint32, texts int, _ error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, 0, badRequest("prompt is required")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return [][]uint32{e.model.EncodeCompletion(s)}, 1, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, 0, badRequest("prompt must be a string, a list of token IDs, or a list of those")
	}
	if len(items) == 0 {
		return nil, 0, badRequest("prompt must not be empty")
	}
	first := bytes.TrimSpace(items[0])
	if len(first) > 0 && (first[0] == '-' || (first[0] >= '0' && first[0] <= '9')) {
		var ids []uint32
		if err := json.Unmarshal(raw, &ids); err != nil {
			return nil, 0, badRequest("prompt token IDs must be integers in [0, 2^32): %v", err)
		}
		return [][]uint32{ids}, 0, nil
	}
	out := make([][]uint32, 0, len(items))
	for i, it := range items {
		if err := json.Unmarshal(it, &s); err == nil {
			out = append(out, e.model.EncodeCompletion(s))
			texts++
			continue
		}
		var ids []uint32
		if err := json.Unmarshal(it, &ids); err != nil {
			return nil, 0, badRequest("prompt[%d] must be a string or a list of token IDs in [0, 2^32)", i)
		}
		if len(ids) == 0 {
			return nil, 0, badRequest("prompt[%d] must not be empty", i)
		}
		out = append(out, ids)
	}
	return out, texts, nil
}

func (e *Engine) handleCompletions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if err := readJSON(r, &req); err != nil {
		e.reject(w, err)
		return
	}
	s, ok := e.preamble(w, r, &req.commonRequest, nil)
	if !ok {
		return
	}
	prompts, texts, err := e.parsePromptsCounted(req.Prompt)
	if err != nil {
		e.reject(w, err)
		return
	}
	for range texts {
		e.countTokenized()
	}
	w.Header().Set(HeaderPromptTokenized, strconv.FormatBool(texts > 0))
	e.serve(w, r, s, prompts, false)
}

// usage is OpenAI's usage object as vLLM fills it.
type usage struct {
	PromptTokens        int            `json:"prompt_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// serve submits the prompts and answers, streaming or not.
func (e *Engine) serve(w http.ResponseWriter, r *http.Request, s served, prompts [][]uint32, chat bool) {
	notify := make(chan struct{}, 1)
	reqs := make([]*request, 0, len(prompts))
	core, err := e.pickRank(r.Header.Get(DataParallelRankHeader))
	if err != nil {
		e.reject(w, err)
		return
	}
	for _, p := range prompts {
		q, err := core.submit(p, s.lora, s.salt, s.maxTokens, notify)
		if err != nil {
			for _, q := range reqs {
				e.cancel(q)
			}
			e.reject(w, err)
			return
		}
		reqs = append(reqs, q)
	}
	id := "cmpl-" + reqs[0].id
	if chat {
		id = "chatcmpl-" + reqs[0].id
	}
	o := &output{e: e, w: w, s: s, reqs: reqs, chat: chat, id: id, created: time.Now().Unix(),
		ids: make([][]uint32, len(reqs)), texts: make([]strings.Builder, len(reqs))}
	if s.stream {
		o.stream(r, notify)
	} else {
		o.whole(r, notify)
	}
}

// output writes one HTTP request's answer.
type output struct {
	e       *Engine
	w       http.ResponseWriter
	s       served
	reqs    []*request
	chat    bool
	id      string
	created int64
	ids     [][]uint32
	texts   []strings.Builder
	chunks  int
}

// abort cancels the requests in the engine and closes the connection without finishing the response
// (net/http closes the connection on http.ErrAbortHandler).
func (o *output) abort(kind string) {
	for _, q := range o.reqs {
		o.e.cancel(q)
	}
	if kind != "" {
		o.e.m.faults.WithLabelValues(kind).Inc()
		o.e.log.Info("fault: closing the connection", slog.String("kind", kind), slog.Int("chunks", o.chunks))
		panic(http.ErrAbortHandler)
	}
}

// wait blocks until something changed or the client went away; it reports false on disconnect.
func (o *output) wait(r *http.Request, notify chan struct{}) bool {
	select {
	case <-notify:
		return true
	case <-r.Context().Done():
		o.abort("")
		return false
	}
}

// collect takes the new tokens of every request; it reports whether all are done, and the first error.
func (o *output) collect(onToken func(i, k int, last bool, reason string)) (allDone bool, err error) {
	allDone = true
	for i, q := range o.reqs {
		ids, done, reason, qerr, _ := q.snapshot(len(o.ids[i]))
		if qerr != nil && err == nil {
			err = qerr
		}
		for j, id := range ids {
			o.ids[i] = append(o.ids[i], id)
			k := len(o.ids[i]) - 1
			onToken(i, k, done && j == len(ids)-1, reason)
		}
		if !done {
			allDone = false
		}
	}
	return allDone, err
}

func (o *output) usage() usage {
	var u usage
	cached := 0
	for i, q := range o.reqs {
		_, _, _, _, st := q.snapshot(len(o.ids[i]))
		u.PromptTokens += len(q.prompt)
		u.CompletionTokens += len(o.ids[i])
		cached += st.CachedTokens
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	u.PromptTokensDetails = &promptDetails{CachedTokens: cached}
	return u
}

type chatChunkChoice struct {
	Index        int              `json:"index"`
	Delta        json.RawMessage  `json:"delta"`
	Logprobs     *struct{}        `json:"logprobs"`
	FinishReason *string          `json:"finish_reason"`
	StopReason   *json.RawMessage `json:"stop_reason,omitempty"`
}

type chatChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []chatChunkChoice `json:"choices"`
	Usage   *usage            `json:"usage,omitempty"`
}

type completionChunkChoice struct {
	Index        int       `json:"index"`
	Text         string    `json:"text"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
	StopReason   *int      `json:"stop_reason"`
}

type completionChunk struct {
	ID      string                  `json:"id"`
	Object  string                  `json:"object"`
	Created int64                   `json:"created"`
	Model   string                  `json:"model"`
	Choices []completionChunkChoice `json:"choices"`
	Usage   *usage                  `json:"usage"`
}

var jsonNull = json.RawMessage("null")

// stream writes SSE as vLLM does: for chat a role delta first, then one chunk per token (the last one
// carrying finish_reason), for completions one chunk per token; a usage chunk when
// stream_options.include_usage; then "data: [DONE]".
func (o *output) stream(r *http.Request, notify chan struct{}) {
	h := o.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	o.w.WriteHeader(http.StatusOK)
	flusher, _ := o.w.(http.Flusher)
	if flusher != nil {
		flusher.Flush()
	}
	roleSent := make([]bool, len(o.reqs))
	var writeErr error
	send := func(v any) {
		if writeErr != nil {
			return
		}
		b, _ := json.Marshal(v)
		if _, err := fmt.Fprintf(o.w, "data: %s\n\n", b); err != nil {
			writeErr = err
			return
		}
		if flusher != nil {
			flusher.Flush()
		}
		o.chunks++
		if c := o.s.faults.closeAfterChunks; c > 0 && o.chunks >= c {
			o.abort("close_mid_stream")
		}
	}
	for {
		if !o.wait(r, notify) {
			return
		}
		done, err := o.collect(func(i, k int, last bool, reason string) {
			text := deltaText(o.e.model, o.ids[i], k)
			var fr *string
			if last {
				fr = &reason
			}
			if o.chat {
				if !roleSent[i] {
					roleSent[i] = true
					send(chatChunk{ID: o.id, Object: "chat.completion.chunk", Created: o.created, Model: o.s.model,
						Choices: []chatChunkChoice{{Index: i, Delta: json.RawMessage(`{"role":"assistant","content":""}`)}}})
				}
				delta, _ := json.Marshal(map[string]string{"content": text})
				c := chatChunkChoice{Index: i, Delta: delta, FinishReason: fr}
				if last {
					c.StopReason = &jsonNull
				}
				send(chatChunk{ID: o.id, Object: "chat.completion.chunk", Created: o.created, Model: o.s.model, Choices: []chatChunkChoice{c}})
				return
			}
			send(completionChunk{ID: o.id, Object: "text_completion", Created: o.created, Model: o.s.model,
				Choices: []completionChunkChoice{{Index: i, Text: text, FinishReason: fr}}})
		})
		if writeErr != nil {
			o.abort("")
			return
		}
		if err != nil {
			o.abort("")
			return
		}
		if done {
			break
		}
	}
	if o.s.includeUsage {
		u := o.usage()
		if o.chat {
			send(chatChunk{ID: o.id, Object: "chat.completion.chunk", Created: o.created, Model: o.s.model, Choices: []chatChunkChoice{}, Usage: &u})
		} else {
			send(completionChunk{ID: o.id, Object: "text_completion", Created: o.created, Model: o.s.model, Choices: []completionChunkChoice{}, Usage: &u})
		}
	}
	if writeErr == nil {
		fmt.Fprint(o.w, "data: [DONE]\n\n")
		if flusher != nil {
			flusher.Flush()
		}
	}
}

type chatMessage struct {
	Role      string   `json:"role"`
	Content   string   `json:"content"`
	ToolCalls []string `json:"tool_calls"`
}

type chatChoice struct {
	Index        int         `json:"index"`
	Message      chatMessage `json:"message"`
	Logprobs     *struct{}   `json:"logprobs"`
	FinishReason string      `json:"finish_reason"`
	StopReason   *int        `json:"stop_reason"`
}

type chatResponse struct {
	ID             string       `json:"id"`
	Object         string       `json:"object"`
	Created        int64        `json:"created"`
	Model          string       `json:"model"`
	Choices        []chatChoice `json:"choices"`
	Usage          usage        `json:"usage"`
	PromptLogprobs *struct{}    `json:"prompt_logprobs"`
}

type completionChoice struct {
	Index          int       `json:"index"`
	Text           string    `json:"text"`
	Logprobs       *struct{} `json:"logprobs"`
	FinishReason   string    `json:"finish_reason"`
	StopReason     *int      `json:"stop_reason"`
	PromptLogprobs *struct{} `json:"prompt_logprobs"`
}

type completionResponse struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   usage              `json:"usage"`
}

// whole waits for every token and writes one JSON response. The simulator's own view of the first prompt
// goes in headers: X-Enginesim-TTFT-Seconds, X-Enginesim-Queue-Seconds (simulated model time) and
// X-Enginesim-CPU-Cached-Tokens (the part of cached_tokens reloaded from the CPU tier).
func (o *output) whole(r *http.Request, notify chan struct{}) {
	reasons := make([]string, len(o.reqs))
	for {
		if !o.wait(r, notify) {
			return
		}
		done, err := o.collect(func(i, k int, last bool, reason string) {
			if last {
				reasons[i] = reason
			}
		})
		if err != nil {
			o.abort("")
			return
		}
		if done {
			break
		}
	}
	if o.s.faults.closeAfterChunks > 0 {
		o.abort("close_mid_stream")
	}
	_, _, _, _, st := o.reqs[0].snapshot(0)
	o.w.Header().Set("X-Enginesim-TTFT-Seconds", strconv.FormatFloat(st.TTFT.Seconds(), 'f', -1, 64))
	o.w.Header().Set("X-Enginesim-Queue-Seconds", strconv.FormatFloat(st.QueueTime.Seconds(), 'f', -1, 64))
	o.w.Header().Set("X-Enginesim-CPU-Cached-Tokens", strconv.Itoa(st.CPUCachedTokens))
	u := o.usage()
	if o.chat {
		resp := chatResponse{ID: o.id, Object: "chat.completion", Created: o.created, Model: o.s.model, Usage: u}
		for i := range o.reqs {
			resp.Choices = append(resp.Choices, chatChoice{Index: i, FinishReason: reasons[i],
				Message: chatMessage{Role: "assistant", Content: o.e.model.Decode(o.ids[i]), ToolCalls: []string{}}})
		}
		writeJSON(o.w, http.StatusOK, resp)
		return
	}
	resp := completionResponse{ID: o.id, Object: "text_completion", Created: o.created, Model: o.s.model, Usage: u}
	for i := range o.reqs {
		resp.Choices = append(resp.Choices, completionChoice{Index: i, Text: o.e.model.Decode(o.ids[i]), FinishReason: reasons[i]})
	}
	writeJSON(o.w, http.StatusOK, resp)
}

func (e *Engine) handleModels(w http.ResponseWriter, _ *http.Request) {
	type modelCard struct {
		ID          string     `json:"id"`
		Object      string     `json:"object"`
		Created     int64      `json:"created"`
		OwnedBy     string     `json:"owned_by"`
		Root        string     `json:"root"`
		Parent      *string    `json:"parent"`
		MaxModelLen int        `json:"max_model_len"`
		Permission  []struct{} `json:"permission"`
	}
	now := time.Now().Unix()
	names := e.cfg.servedNames()
	var data []modelCard
	for _, n := range names {
		data = append(data, modelCard{ID: n, Object: "model", Created: now, OwnedBy: "vllm", Root: e.cfg.Model,
			MaxModelLen: e.cfg.MaxModelLen, Permission: []struct{}{}})
	}
	for _, l := range e.cfg.LoRAModules {
		parent := names[0]
		data = append(data, modelCard{ID: l, Object: "model", Created: now, OwnedBy: "vllm", Root: l, Parent: &parent,
			MaxModelLen: e.cfg.MaxModelLen, Permission: []struct{}{}})
	}
	writeJSON(w, http.StatusOK, struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{"list", data})
}

// handleTokenize answers vLLM's POST /tokenize: {"prompt": text} (special tokens added) or a chat body
// {"messages": [...]} (rendered with the chat template).
func (e *Engine) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model    string          `json:"model"`
		Prompt   *string         `json:"prompt"`
		Messages json.RawMessage `json:"messages"`
	}
	body, err := readJSONBody(r, &req)
	if err != nil {
		writeErr(w, err)
		return
	}
	if _, _, err := e.resolveModel(req.Model, ""); err != nil {
		writeErr(w, err)
		return
	}
	var ids []uint32
	switch {
	case req.Prompt != nil:
		ids = e.model.EncodeCompletion(*req.Prompt)
	case len(req.Messages) > 0:
		if ids, err = e.encodeChat(r.Context(), body); err != nil {
			writeErr(w, asRequestError(err))
			return
		}
	default:
		writeErr(w, badRequest("either prompt or messages is required"))
		return
	}
	if ids == nil {
		ids = []uint32{}
	}
	writeJSON(w, http.StatusOK, struct {
		Count       int       `json:"count"`
		MaxModelLen int       `json:"max_model_len"`
		Tokens      []uint32  `json:"tokens"`
		TokenStrs   *[]string `json:"token_strs"`
	}{len(ids), e.cfg.MaxModelLen, ids, nil})
}

func (e *Engine) handleReset(w http.ResponseWriter, _ *http.Request) {
	if err := e.ResetPrefixCache(); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (e *Engine) handleGetFaults(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, e.Faults())
}

// handleSetFaults replaces the armed faults with the JSON body (a Faults object; unknown fields are
// rejected) and answers the faults now armed.
func (e *Engine) handleSetFaults(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	var f Faults
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		writeErr(w, badRequest("invalid faults: %v", err))
		return
	}
	if err := e.SetFaults(f); err != nil {
		writeErr(w, badRequest("%v", err))
		return
	}
	writeJSON(w, http.StatusOK, e.Faults())
}
