package sim

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// POST /v1/responses and POST /v1/embeddings, as vLLM serves them (OpenAI's shapes).
//
// Responses: `instructions` becomes a system message, `input` (a string, or message items with string or
// input_text/output_text content) the conversation, rendered with the chat template and generated like a
// chat. `tools` are accepted and ignored (the simulator never calls one); previous_response_id,
// conversation and other item types are refused (the simulator stores no responses). A stream is OpenAI's
// Responses event stream: "event: TYPE" and "data: JSON" lines per event (response.created,
// response.in_progress, response.output_item.added, response.content_part.added, one
// response.output_text.delta per token, response.output_text.done, response.content_part.done,
// response.output_item.done, then response.completed), each with its sequence_number. A response that
// stopped at the client's max_output_tokens is "incomplete" (incomplete_details.reason
// "max_output_tokens", last event response.incomplete); without max_output_tokens the simulator's
// default length counts as a natural end ("completed").
//
// Embeddings: each input (string, strings, token IDs, token-ID lists) is tokenized and mapped to a
// deterministic unit vector (the normalized sum of per-token pseudo-random vectors, so inputs sharing tokens
// are similar) of `dimensions` (default EmbeddingDimensions) floats, as JSON numbers or, with
// encoding_format "base64", little-endian float32 bytes in base64 (the Node SDK's default).

// EmbeddingDimensions is the length of an embedding when the request sets no dimensions.
const EmbeddingDimensions = 64

type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	Stream             bool            `json:"stream"`
	MaxOutputTokens    *jsonInt        `json:"max_output_tokens"`
	CacheSalt          string          `json:"cache_salt"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Conversation       json.RawMessage `json:"conversation"`
}

type respMessage struct {
	Role    string `json:"role"`
	Content any    `json:"content"`
}

type respTextPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// responsesMessages maps a Responses request onto chat messages as vLLM does.
func responsesMessages(req *responsesRequest) ([]respMessage, error) {
	if req.PreviousResponseID != nil {
		return nil, badRequest("enginesim stores no responses: previous_response_id is not supported")
	}
	if t := bytes.TrimSpace(req.Conversation); len(t) > 0 && string(t) != "null" {
		return nil, badRequest("enginesim stores no conversations: conversation is not supported")
	}
	var msgs []respMessage
	if req.Instructions != nil {
		msgs = append(msgs, respMessage{Role: "system", Content: *req.Instructions})
	}
	var s string
	if json.Unmarshal(req.Input, &s) == nil {
		return append(msgs, respMessage{Role: "user", Content: s}), nil
	}
	var items []struct {
		Type    string          `json:"type"`
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(req.Input, &items); err != nil || len(items) == 0 {
		return nil, badRequest("input must be a string or a non-empty list of input items")
	}
	for i, it := range items {
		if it.Type != "" && it.Type != "message" {
			return nil, badRequest("input[%d]: item type %q is not supported by enginesim", i, it.Type)
		}
		if json.Unmarshal(it.Content, &s) == nil {
			msgs = append(msgs, respMessage{Role: it.Role, Content: s})
			continue
		}
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(it.Content, &parts); err != nil {
			return nil, badRequest("input[%d].content must be a string or a list of content parts", i)
		}
		tp := make([]respTextPart, 0, len(parts))
		for j, p := range parts {
			if p.Type != "input_text" && p.Type != "output_text" {
				return nil, badRequest("input[%d].content[%d]: part type %q is not supported by enginesim", i, j, p.Type)
			}
			tp = append(tp, respTextPart{Type: "text", Text: p.Text})
		}
		msgs = append(msgs, respMessage{Role: it.Role, Content: tp})
	}
	return msgs, nil
}

func (e *Engine) handleResponses(w http.ResponseWriter, r *http.Request) {
	var req responsesRequest
	if err := readJSON(r, &req); err != nil {
		e.reject(w, err)
		return
	}
	msgs, err := responsesMessages(&req)
	if err != nil {
		e.reject(w, err)
		return
	}
	s, ok := e.preamble(w, r, &commonRequest{Model: req.Model, Stream: req.Stream, MaxTokens: req.MaxOutputTokens,
		CacheSalt: req.CacheSalt}, nil)
	if !ok {
		return
	}
	chatBody, _ := json.Marshal(map[string]any{"model": req.Model, "messages": msgs})
	ids, err := e.encodeChat(r.Context(), chatBody)
	if err != nil {
		e.reject(w, asRequestError(err))
		return
	}
	e.countTokenized()
	core, err := e.pickRank(r.Header.Get(DataParallelRankHeader))
	if err != nil {
		e.reject(w, err)
		return
	}
	notify := make(chan struct{}, 1)
	q, err := core.submit(ids, s.lora, s.salt, s.maxTokens, notify)
	if err != nil {
		e.reject(w, err)
		return
	}
	o := &output{e: e, w: w, s: s, reqs: []*request{q}, chat: true, id: "resp_" + q.id, created: time.Now().Unix(),
		ids: make([][]uint32, 1), texts: make([]strings.Builder, 1)}
	rs := &respState{o: o, msgID: "msg_" + q.id, instructions: req.Instructions, limited: req.MaxOutputTokens != nil}
	if s.stream {
		rs.stream(r, notify)
	} else {
		rs.whole(r, notify)
	}
}

// respState writes one Responses answer.
type respState struct {
	o            *output
	msgID        string
	instructions *string
	limited      bool // the client set max_output_tokens: reaching it makes the response incomplete
	seq          int
}

type respUsage struct {
	InputTokens         int            `json:"input_tokens"`
	InputTokensDetails  map[string]int `json:"input_tokens_details"`
	OutputTokens        int            `json:"output_tokens"`
	OutputTokensDetails map[string]int `json:"output_tokens_details"`
	TotalTokens         int            `json:"total_tokens"`
}

type respPart struct {
	Type        string     `json:"type"`
	Text        string     `json:"text"`
	Annotations []struct{} `json:"annotations"`
}

type respItem struct {
	ID      string     `json:"id"`
	Type    string     `json:"type"`
	Status  string     `json:"status"`
	Role    string     `json:"role"`
	Content []respPart `json:"content"`
}

// object is the response object in the given status (output and usage once it ended).
func (rs *respState) object(status string, text *string) map[string]any {
	o := rs.o
	obj := map[string]any{"id": o.id, "object": "response", "created_at": o.created, "status": status,
		"model": o.s.model, "output": []respItem{}, "instructions": rs.instructions, "error": nil,
		"incomplete_details": nil, "max_output_tokens": nil, "metadata": map[string]string{},
		"parallel_tool_calls": true, "tool_choice": "auto", "tools": []struct{}{}, "temperature": 1.0, "top_p": 1.0,
		"text": map[string]any{"format": map[string]string{"type": "text"}}, "truncation": "disabled", "usage": nil}
	if rs.limited {
		obj["max_output_tokens"] = o.s.maxTokens
	}
	if status == "incomplete" {
		obj["incomplete_details"] = map[string]string{"reason": "max_output_tokens"}
	}
	if text != nil {
		obj["output"] = []respItem{{ID: rs.msgID, Type: "message", Status: "completed", Role: "assistant",
			Content: []respPart{{Type: "output_text", Text: *text, Annotations: []struct{}{}}}}}
		u := o.usage()
		obj["usage"] = respUsage{InputTokens: u.PromptTokens, InputTokensDetails: map[string]int{"cached_tokens": u.PromptTokensDetails.CachedTokens},
			OutputTokens: u.CompletionTokens, OutputTokensDetails: map[string]int{"reasoning_tokens": 0}, TotalTokens: u.TotalTokens}
	}
	return obj
}

func (rs *respState) endStatus() string {
	if rs.limited {
		return "incomplete"
	}
	return "completed"
}

func (rs *respState) whole(r *http.Request, notify chan struct{}) {
	o := rs.o
	for {
		if !o.wait(r, notify) {
			return
		}
		done, err := o.collect(func(int, int, bool, string) {})
		if err != nil {
			o.abort("")
			return
		}
		if done {
			break
		}
	}
	text := o.e.model.Decode(o.ids[0])
	writeJSON(o.w, http.StatusOK, rs.object(rs.endStatus(), &text))
}

func (rs *respState) stream(r *http.Request, notify chan struct{}) {
	o := rs.o
	h := o.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	o.w.WriteHeader(http.StatusOK)
	flusher, _ := o.w.(http.Flusher)
	var writeErr error
	send := func(typ string, fields map[string]any) {
		if writeErr != nil {
			return
		}
		fields["type"] = typ
		fields["sequence_number"] = rs.seq
		rs.seq++
		b, _ := json.Marshal(fields)
		if _, err := fmt.Fprintf(o.w, "event: %s\ndata: %s\n\n", typ, b); err != nil {
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
	send("response.created", map[string]any{"response": rs.object("in_progress", nil)})
	send("response.in_progress", map[string]any{"response": rs.object("in_progress", nil)})
	send("response.output_item.added", map[string]any{"output_index": 0,
		"item": respItem{ID: rs.msgID, Type: "message", Status: "in_progress", Role: "assistant", Content: []respPart{}}})
	empty := respPart{Type: "output_text", Annotations: []struct{}{}}
	send("response.content_part.added", map[string]any{"item_id": rs.msgID, "output_index": 0, "content_index": 0, "part": empty})
	for {
		if !o.wait(r, notify) {
			return
		}
		done, err := o.collect(func(i, k int, _ bool, _ string) {
			send("response.output_text.delta", map[string]any{"item_id": rs.msgID, "output_index": 0, "content_index": 0,
				"delta": deltaText(o.e.model, o.ids[i], k), "logprobs": []struct{}{}})
		})
		if writeErr != nil || err != nil {
			o.abort("")
			return
		}
		if done {
			break
		}
	}
	text := o.e.model.Decode(o.ids[0])
	part := respPart{Type: "output_text", Text: text, Annotations: []struct{}{}}
	send("response.output_text.done", map[string]any{"item_id": rs.msgID, "output_index": 0, "content_index": 0,
		"text": text, "logprobs": []struct{}{}})
	send("response.content_part.done", map[string]any{"item_id": rs.msgID, "output_index": 0, "content_index": 0, "part": part})
	send("response.output_item.done", map[string]any{"output_index": 0,
		"item": respItem{ID: rs.msgID, Type: "message", Status: "completed", Role: "assistant", Content: []respPart{part}}})
	st := rs.endStatus()
	send("response."+st, map[string]any{"response": rs.object(st, &text)})
}

func (e *Engine) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model          string          `json:"model"`
		Input          json.RawMessage `json:"input"`
		EncodingFormat string          `json:"encoding_format"`
		Dimensions     *int            `json:"dimensions"`
	}
	if err := readJSON(r, &req); err != nil {
		e.reject(w, err)
		return
	}
	name, _, err := e.resolveModel(req.Model, "")
	if err != nil {
		e.reject(w, err)
		return
	}
	dims := EmbeddingDimensions
	if req.Dimensions != nil {
		if *req.Dimensions < 1 || *req.Dimensions > 4096 {
			e.reject(w, badRequest("dimensions must be in [1, 4096], got %d", *req.Dimensions))
			return
		}
		dims = *req.Dimensions
	}
	if req.EncodingFormat != "" && req.EncodingFormat != "float" && req.EncodingFormat != "base64" {
		e.reject(w, badRequest("encoding_format must be float or base64, got %q", req.EncodingFormat))
		return
	}
	prompts, err := e.parsePrompts(req.Input)
	if err != nil {
		e.reject(w, err)
		return
	}
	e.m.requests.WithLabelValues("embeddings").Inc()
	type item struct {
		Object    string `json:"object"`
		Index     int    `json:"index"`
		Embedding any    `json:"embedding"`
	}
	data := make([]item, len(prompts))
	tokens := 0
	for i, p := range prompts {
		tokens += len(p)
		v := embed(p, dims)
		var emb any = v
		if req.EncodingFormat == "base64" {
			buf := make([]byte, 4*len(v))
			for j, f := range v {
				binary.LittleEndian.PutUint32(buf[4*j:], math.Float32bits(f))
			}
			emb = base64.StdEncoding.EncodeToString(buf)
		}
		data[i] = item{Object: "embedding", Index: i, Embedding: emb}
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": "embd-" + strconv.FormatInt(time.Now().UnixNano(), 36),
		"object": "list", "created": time.Now().Unix(), "model": name, "data": data,
		"usage": map[string]int{"prompt_tokens": tokens, "total_tokens": tokens}})
}

// embed maps token IDs to a unit vector of dims floats: the normalized sum of one pseudo-random vector per
// token (FNV-1a of the ID and the coordinate).
func embed(ids []uint32, dims int) []float32 {
	v := make([]float64, dims)
	var b [8]byte
	for _, id := range ids {
		for d := range dims {
			binary.LittleEndian.PutUint32(b[:4], id)
			binary.LittleEndian.PutUint32(b[4:], uint32(d))
			h := fnv.New64a()
			h.Write(b[:])
			v[d] += float64(h.Sum64()>>11)/float64(1<<53)*2 - 1
		}
	}
	var n float64
	for _, x := range v {
		n += x * x
	}
	n = math.Sqrt(n)
	out := make([]float32, dims)
	for d, x := range v {
		if n > 0 {
			out[d] = float32(x / n)
		}
	}
	return out
}
