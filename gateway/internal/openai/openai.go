// Package openai holds the small part of the OpenAI HTTP API the gateway must understand itself: the error
// shape {"error":{"message","type","param","code"}}, request validation (only the fields routing reads:
// model, stream, messages/prompt, max_tokens, cache_salt), and minimal byte-level edits that splice token IDs
// into a request body. Everything else in a body is passed to the engine untouched: the gateway never
// re-marshals a client's request.
package openai

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/kvgate/kvgate/gateway/internal/chattemplate"
)

// Error is an error answered to the client in OpenAI's shape, with its HTTP status.
type Error struct {
	Status  int    `json:"-"`       // HTTP status code
	Message string `json:"message"` // human-readable detail
	Type    string `json:"type"`    // OpenAI error type, e.g. "invalid_request_error"
	Param   any    `json:"param"`   // string or nil (JSON null), as OpenAI sends it
	Code    any    `json:"code"`    // string or nil
}

// Error formats the status, type and message (logs; clients get JSON).
func (e *Error) Error() string { return fmt.Sprintf("openai: %d %s: %s", e.Status, e.Type, e.Message) }

// JSON returns the response body {"error":{...}}.
func (e *Error) JSON() []byte {
	b, _ := json.Marshal(struct {
		Error *Error `json:"error"`
	}{e})
	return b
}

func str(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// Errorf builds an *Error; empty param or code become JSON null.
func Errorf(status int, typ, param, code, format string, a ...any) *Error {
	return &Error{Status: status, Type: typ, Param: str(param), Code: str(code), Message: fmt.Sprintf(format, a...)}
}

// BadRequest is 400 invalid_request_error; param names the offending field ("" for the whole body).
func BadRequest(param, format string, a ...any) *Error {
	return Errorf(http.StatusBadRequest, "invalid_request_error", param, "", format, a...)
}

// ModelNotFound is 404 for a model the gateway does not serve (OpenAI's code model_not_found).
func ModelNotFound(model string) *Error {
	return Errorf(http.StatusNotFound, "invalid_request_error", "model", "model_not_found",
		"The model `%s` does not exist or is not served by this gateway.", model)
}

// TooLarge is 413 for a body over the configured limit.
func TooLarge(limit int64) *Error {
	return Errorf(http.StatusRequestEntityTooLarge, "invalid_request_error", "", "request_too_large",
		"Request body is larger than the limit of %d bytes.", limit)
}

// NoCapacity is 429: every endpoint stayed at capacity for the model's queue timeout.
func NoCapacity(model string) *Error {
	return Errorf(http.StatusTooManyRequests, "rate_limit_error", "", "no_capacity",
		"Every endpoint serving `%s` is at capacity; retry later.", model)
}

// Unavailable is 503: no healthy endpoint serves the model.
func Unavailable(model string) *Error {
	return Errorf(http.StatusServiceUnavailable, "server_error", "", "no_healthy_endpoint",
		"No healthy endpoint serves `%s`.", model)
}

// Upstream is 502: every tried endpoint failed before sending a response.
func Upstream(msg string) *Error {
	return Errorf(http.StatusBadGateway, "server_error", "", "upstream_error", "%s", msg)
}

// Unauthorized is 401.
func Unauthorized() *Error {
	return Errorf(http.StatusUnauthorized, "invalid_request_error", "", "invalid_api_key",
		"Missing or invalid bearer token.")
}

// API names the APIs the gateway routes to an engine.
type API uint8

const (
	// Chat is POST /v1/chat/completions.
	Chat API = iota + 1
	// Completions is POST /v1/completions.
	Completions
	// Responses is POST /v1/responses (surface.go): routed on its prefix when it maps onto the chat template.
	Responses
	// Embeddings is POST /v1/embeddings (surface.go): routed on load alone.
	Embeddings
)

// Path returns the API's URL path.
func (a API) Path() string {
	switch a {
	case Chat:
		return "/v1/chat/completions"
	case Responses:
		return "/v1/responses"
	case Embeddings:
		return "/v1/embeddings"
	}
	return "/v1/completions"
}

// String returns "chat", "completions", "responses" or "embeddings".
func (a API) String() string {
	switch a {
	case Chat:
		return "chat"
	case Responses:
		return "responses"
	case Embeddings:
		return "embeddings"
	}
	return "completions"
}

// Request is what the gateway reads of a client body.
type Request struct {
	API    API    // Chat or Completions
	Model  string // the "model" member as sent (a model or LoRA adapter name)
	Stream bool   // "stream": true
	// MaxTokens is max_completion_tokens, else max_tokens, else -1 (unset); at most MaxTokensCap.
	MaxTokens int64
	// N is "n", the number of choices to generate for the prompt (1 when absent or null); at most MaxNCap.
	N int64
	// CacheSalt is vLLM's cache_salt ("" when absent); it is folded into block keys.
	CacheSalt string
	// PromptText is a completions prompt given as one string (or the first of a list of strings).
	PromptText string
	// PromptIDs is a completions prompt given as token IDs (or the first of a list of ID lists).
	PromptIDs []uint32
	// PromptIsIDs says the completions prompt was token IDs.
	PromptIsIDs bool
	// SinglePrompt says the completions prompt is one prompt (not a batch list); only then may the gateway
	// replace it with token IDs.
	SinglePrompt bool
	// PromptSpan is where the top-level "prompt" value (the last occurrence) lies in the body the request
	// was parsed from, [start, end) in bytes; {0, 0} for chat and the other APIs. SplicePromptJSON uses it.
	PromptSpan [2]int
	// Prompts is the number of completions prompts (1 for a single prompt or a chat); the engine runs each
	// as its own sequence group.
	Prompts int
	// BatchTexts are the string prompts of a batch after the first (PromptText); BatchIDTokens counts the
	// token IDs of a token-ID batch's lists after the first (PromptIDs). Routing reserves their tokens too.
	BatchTexts    []string
	BatchIDTokens int64
	// BestOf is "best_of" (0 when absent): vLLM generates max(n, best_of) sequences per prompt.
	BestOf int64
	// HasPromptTokenIDs says a chat body already carries prompt_token_ids (the gateway then leaves it).
	HasPromptTokenIDs bool
	// HasInputIDs and HasKVTransferParams say a chat body has a top-level "input_ids" or
	// "kv_transfer_params" member (any value): the other fields engines read token IDs from. When the one an
	// endpoint uses is absent the gateway inserts the IDs without scanning the body again.
	HasInputIDs, HasKVTransferParams bool
	// Chat is a chat body decoded for the chat template by the same scan that read the fields above (nil
	// for completions); render it with chattemplate.Template.RenderRequest (gateway/internal/model's
	// EncodeChatRequest) instead of parsing the body again. Field errors the template would report
	// (a malformed message, a bad add_generation_prompt) come from the render, as before. For Responses it
	// is the chat the request maps onto (nil when it maps onto none: see LoadOnlyReason).
	Chat *chattemplate.Request
	// LoadOnlyReason, when set, says why the request is routed on load alone without being tokenized: a
	// Responses request that does not map onto the chat template (e.g. "previous_response_id", "tools",
	// "item:function_call", "content:input_image"), or "embeddings".
	LoadOnlyReason string
}

// MaxTokensCap bounds Request.MaxTokens: a larger max_tokens / max_completion_tokens is read as this many
// (2^32 tokens, beyond any model's context), so the gateway's cost arithmetic (prompt + n × max_tokens) cannot
// overflow int64. The body is forwarded as sent; the engine answers a request over its context length with
// its own 400.
const MaxTokensCap = 1 << 32

// MaxNCap bounds Request.N the way MaxTokensCap bounds MaxTokens (OpenAI allows n up to 128); the body is
// forwarded as sent.
const MaxNCap = 1 << 16

// tokenCount reads a token-count member as OpenAI and vLLM accept it: a JSON number with no fractional part
// (7, 7.0, 7e2), not negative; values over MaxTokensCap (even beyond int64 or float64 range) read as
// MaxTokensCap. ok is false for other types, fractions and negative numbers. raw is the member's JSON text.
func tokenCount(raw string) (n int64, ok bool) {
	if rawType(raw) != gjson.Number {
		return 0, false
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	switch {
	case err == nil:
	case errors.Is(err, strconv.ErrRange):
		if raw[0] == '-' {
			return 0, false
		}
		n = MaxTokensCap
	default:
		f, err := strconv.ParseFloat(raw, 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) || f != math.Trunc(f) || f < 0 {
			return 0, false
		}
		if f >= MaxTokensCap { // also +Inf (a literal beyond float64 range)
			return MaxTokensCap, true
		}
		n = int64(f) // 0 for a literal too small for float64 (1e-400 rounds to 0, an integer)
	}
	if n < 0 {
		return 0, false
	}
	return min(n, MaxTokensCap), true
}

// rawType is the JSON type of a valid JSON value's text, in gjson's terms (objects and arrays are JSON).
func rawType(raw string) gjson.Type {
	if raw == "" {
		return gjson.Null
	}
	switch c := raw[0]; {
	case c == '"':
		return gjson.String
	case c == 't':
		return gjson.True
	case c == 'f':
		return gjson.False
	case c == 'n':
		return gjson.Null
	case c == '-' || c >= '0' && c <= '9':
		return gjson.Number
	}
	return gjson.JSON
}

// rawString decodes a valid JSON string's text as gjson does (an unescaped string is taken as is).
func rawString(raw string) string {
	if strings.IndexByte(raw, '\\') < 0 {
		return raw[1 : len(raw)-1]
	}
	return gjson.Parse(raw).Str
}

// fields holds the raw JSON text of the top-level members routing reads (last occurrence wins, as in
// Python's json.loads); "" when absent.
type fields struct {
	model, stream, maxTokens, maxCompletion, n, salt string
	bestOf                                           string // read for completions only (parseCompletions)
	promptTokenIDs, inputIDs, kvTransfer             bool
}

// member records one top-level member (the chattemplate.ParseRequest callback).
func (f *fields) member(key string, raw []byte) {
	switch key {
	case "model":
		f.model = string(raw)
	case "stream":
		f.stream = string(raw)
	case "max_tokens":
		f.maxTokens = string(raw)
	case "max_completion_tokens":
		f.maxCompletion = string(raw)
	case "n":
		f.n = string(raw)
	case "cache_salt":
		f.salt = string(raw)
	case "prompt_token_ids":
		f.promptTokenIDs = true
	case "input_ids":
		f.inputIDs = true
	case "kv_transfer_params":
		f.kvTransfer = true
	}
}

// apply validates the routing fields into r, in the order ParseRequest reports errors. It is the one
// validator of the members every API shares: parseChat, parseCompletions and the Responses and embeddings
// parsers call it.
func (f *fields) apply(r *Request) error {
	if rawType(f.model) != gjson.String || len(f.model) == 2 {
		return BadRequest("model", "`model` must be a non-empty string.")
	}
	r.Model = rawString(f.model)
	if f.stream != "" && rawType(f.stream) != gjson.Null {
		t := rawType(f.stream)
		if t != gjson.True && t != gjson.False {
			return BadRequest("stream", "`stream` must be a boolean.")
		}
		r.Stream = t == gjson.True
	}
	for _, m := range []struct{ k, raw string }{{"max_tokens", f.maxTokens}, {"max_completion_tokens", f.maxCompletion}} {
		if m.raw == "" || rawType(m.raw) == gjson.Null {
			continue
		}
		n, ok := tokenCount(m.raw)
		if !ok {
			return BadRequest(m.k, "`%s` must be a non-negative integer.", m.k)
		}
		r.MaxTokens = n
	}
	if f.n != "" && rawType(f.n) != gjson.Null {
		v, ok := tokenCount(f.n)
		if !ok || v < 1 {
			return BadRequest("n", "`n` must be a positive integer.")
		}
		r.N = min(v, MaxNCap)
	}
	if f.bestOf != "" && rawType(f.bestOf) != gjson.Null {
		v, ok := tokenCount(f.bestOf)
		if !ok || v < 1 {
			return BadRequest("best_of", "`best_of` must be a positive integer.")
		}
		r.BestOf = min(v, MaxNCap)
	}
	if f.salt != "" && rawType(f.salt) != gjson.Null {
		if rawType(f.salt) != gjson.String {
			return BadRequest("cache_salt", "`cache_salt` must be a string.")
		}
		r.CacheSalt = rawString(f.salt)
	}
	r.HasPromptTokenIDs, r.HasInputIDs, r.HasKVTransferParams = f.promptTokenIDs, f.inputIDs, f.kvTransfer
	return nil
}

// parseChat is ParseRequest for Chat: one scan of the body (chattemplate.ParseRequest) decodes what the
// chat template reads and hands the routing members over raw.
func parseChat(body []byte) (*Request, error) {
	var f fields
	chat, err := chattemplate.ParseRequest(body, f.member)
	if err != nil {
		return nil, syntaxError(body, err)
	}
	r := &Request{API: Chat, MaxTokens: -1, N: 1, Prompts: 1, Chat: chat}
	if err := f.apply(r); err != nil {
		return nil, err
	}
	if chat.Messages() <= 0 {
		return nil, BadRequest("messages", "`messages` must be a non-empty array.")
	}
	return r, nil
}

// syntaxError is the 400 for a body chattemplate.ParseRequest refused: not JSON, not an object, or (valid
// JSON) nested deeper than the template decoder allows.
func syntaxError(body []byte, err error) *Error {
	if !json.Valid(body) {
		return BadRequest("", "Request body is not valid JSON.")
	}
	if !gjson.ParseBytes(body).IsObject() {
		return BadRequest("", "Request body must be a JSON object.")
	}
	if re, ok := errors.AsType[*chattemplate.RequestError](err); ok && re.Path != "" {
		return BadRequest(re.Path, "%s: %s", re.Path, re.Message)
	}
	return BadRequest("messages", "%s", strings.TrimPrefix(err.Error(), "chattemplate: request: "))
}

// ParseRequest validates body for api and extracts the routing fields; errors are *Error with status 400.
// A chat body is scanned once: the same pass decodes what the chat template reads into Request.Chat.
func ParseRequest(api API, body []byte) (*Request, error) {
	switch api {
	case Chat:
		return parseChat(body)
	case Responses:
		return parseResponses(body)
	case Embeddings:
		return parseEmbeddings(body)
	}
	return parseCompletions(body)
}

// parseCompletions is ParseRequest for Completions on gjson: a validation pass, then one pass over the
// top-level members.
func parseCompletions(body []byte) (*Request, error) {
	if !gjson.ValidBytes(body) {
		return nil, BadRequest("", "Request body is not valid JSON.")
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return nil, BadRequest("", "Request body must be a JSON object.")
	}
	r := &Request{API: Completions, MaxTokens: -1, N: 1, Prompts: 1}
	// One pass over the top-level members (a large body is scanned once, not once per field); the shared
	// members are validated by fields.apply, as for chat.
	var f fields
	var prompt gjson.Result
	root.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "prompt":
			prompt = v
		case "best_of":
			f.bestOf = v.Raw
		default:
			f.member(k.Str, []byte(v.Raw))
		}
		return true
	})
	if err := f.apply(r); err != nil {
		return nil, err
	}
	if err := r.readPrompt(prompt); err != nil {
		return nil, err
	}
	r.PromptSpan = [2]int{prompt.Index, prompt.Index + len(prompt.Raw)}
	return r, nil
}

func (r *Request) readPrompt(p gjson.Result) error {
	bad := BadRequest("prompt", "`prompt` must be a string, a list of strings, a list of token IDs or a list of token-ID lists.")
	switch {
	case p.Type == gjson.String:
		r.PromptText, r.SinglePrompt = p.Str, true
		return nil
	case p.IsArray():
		items := p.Array()
		if len(items) == 0 {
			return BadRequest("prompt", "`prompt` must not be empty.")
		}
		switch {
		case items[0].Type == gjson.String:
			for _, it := range items {
				if it.Type != gjson.String {
					return bad
				}
			}
			r.PromptText, r.SinglePrompt, r.Prompts = items[0].Str, len(items) == 1, len(items)
			for _, it := range items[1:] {
				r.BatchTexts = append(r.BatchTexts, it.Str)
			}
			return nil
		case items[0].Type == gjson.Number:
			ids, ok := tokenIDs(items)
			if !ok {
				return bad
			}
			r.PromptIDs, r.PromptIsIDs, r.SinglePrompt = ids, true, true
			return nil
		case items[0].IsArray():
			for i, it := range items {
				if !it.IsArray() {
					return bad
				}
				ids, ok := tokenIDs(it.Array())
				if !ok {
					return bad
				}
				if i > 0 {
					r.BatchIDTokens += int64(len(ids))
				}
			}
			r.PromptIDs, _ = tokenIDs(items[0].Array())
			r.PromptIsIDs, r.Prompts = true, len(items)
			return nil
		}
	}
	return bad
}

func tokenIDs(items []gjson.Result) ([]uint32, bool) {
	ids := make([]uint32, len(items))
	for i, it := range items {
		if it.Type != gjson.Number {
			return nil, false
		}
		n, err := strconv.ParseUint(it.Raw, 10, 32)
		if err != nil {
			return nil, false
		}
		ids[i] = uint32(n)
	}
	return ids, true
}

// AppendIDs appends ids as a JSON array of integers.
//
// Each ID below 10^8 is written as at most two 4-digit groups from quad, with one 4-byte store per group
// (BenchmarkAppendIDs: ~5 µs for 2,000 IDs of a 152k vocabulary, against ~15 µs dividing by 100 per digit
// pair); larger IDs take appendUint32.
func AppendIDs(dst []byte, ids []uint32) []byte {
	n := len(dst)
	dst = slices.Grow(dst, idsRoom(ids))
	buf := dst[:cap(dst)]
	buf[n] = '['
	n++
	for _, v := range ids {
		switch {
		case v < 10000:
			d := digits4(v)
			binary.LittleEndian.PutUint32(buf[n:], quad[v]>>((4-d)*8))
			n += d
		case v < 100000000:
			hi, lo := v/10000, v%10000
			d := digits4(hi)
			binary.LittleEndian.PutUint32(buf[n:], quad[hi]>>((4-d)*8))
			binary.LittleEndian.PutUint32(buf[n+d:], quad[lo])
			n += d + 4
		default:
			n += len(appendUint32(buf[n:n], v))
		}
		buf[n] = ','
		n++
	}
	if len(ids) == 0 {
		buf[n] = ']'
		return buf[:n+1]
	}
	buf[n-1] = ']' // the last comma
	return buf[:n]
}

// idsRoom bounds the bytes AppendIDs writes for ids, plus the 3 bytes of slack its last 4-byte store
// may touch: the digits of the largest ID and a comma per ID, and the brackets.
func idsRoom(ids []uint32) int {
	var top uint32
	for _, v := range ids {
		top = max(top, v)
	}
	d := 10
	for p, i := uint32(10), 1; i < 10; p, i = p*10, i+1 {
		if top < p {
			d = i
			break
		}
	}
	return len(ids)*(d+1) + 5
}

// quad[i] holds the 4 ASCII digits of i (zero-padded, first digit in the low byte) for i < 10^4.
var quad = func() (t [10000]uint32) {
	for i := range t {
		t[i] = uint32('0'+i/1000) | uint32('0'+i/100%10)<<8 | uint32('0'+i/10%10)<<16 | uint32('0'+i%10)<<24
	}
	return t
}()

// digits4 is the number of decimal digits of v < 10^4.
func digits4(v uint32) int {
	switch {
	case v < 10:
		return 1
	case v < 100:
		return 2
	case v < 1000:
		return 3
	}
	return 4
}

// digitPairs holds "00" to "99": appendUint32 writes two digits per division.
const digitPairs = "00010203040506070809101112131415161718192021222324252627282930313233343536373839" +
	"40414243444546474849505152535455565758596061626364656667686970717273747576777879" +
	"8081828384858687888990919293949596979899"

// appendUint32 appends v in decimal, as strconv.AppendUint does, with 32-bit divisions and two digits per
// step (AppendIDs formats every prompt token ID of every routed request).
func appendUint32(dst []byte, v uint32) []byte {
	if v < 10 {
		return append(dst, byte('0'+v))
	}
	var buf [10]byte
	i := len(buf)
	for v >= 100 {
		q := v / 100
		r := (v - q*100) * 2
		i -= 2
		buf[i], buf[i+1] = digitPairs[r], digitPairs[r+1]
		v = q
	}
	if v >= 10 {
		i -= 2
		buf[i], buf[i+1] = digitPairs[v*2], digitPairs[v*2+1]
	} else {
		i--
		buf[i] = byte('0' + v)
	}
	return append(dst, buf[i:]...)
}

// SpliceChatTokenIDs returns body with a top-level "prompt_token_ids" field holding ids, inserted right after
// the opening brace; every other byte of body is kept as sent.
func SpliceChatTokenIDs(body []byte, ids []uint32) []byte {
	i := 0
	for i < len(body) && body[i] != '{' {
		i++
	}
	out := make([]byte, 0, len(body)+idsRoom(ids)+24) // what AppendIDs reserves: it never reallocates
	out = append(out, body[:i+1]...)
	out = append(out, `"prompt_token_ids":`...)
	out = AppendIDs(out, ids)
	rest := body[i+1:]
	j := 0
	for j < len(rest) && (rest[j] == ' ' || rest[j] == '\t' || rest[j] == '\n' || rest[j] == '\r') {
		j++
	}
	if j < len(rest) && rest[j] != '}' { // the object has members: separate them
		out = append(out, ',')
	}
	return append(out, rest...)
}

// SpliceCompletionPrompt returns body with the value of its top-level "prompt" replaced by ids in place;
// every other byte of body is kept as sent.
func SpliceCompletionPrompt(body []byte, ids []uint32) ([]byte, error) {
	return SpliceCompletionPromptJSON(body, AppendIDs(nil, ids))
}

// SplicePromptJSON returns body, the bytes r was parsed from, with its top-level "prompt" value (at
// r.PromptSpan) replaced by idsJSON (a JSON array, AppendIDs's text); idsJSON is copied. Without a scan:
// a 128k-token prompt is skipped by its span, not read again. A body whose span does not hold a JSON
// string or array (not the parsed bytes) is spliced by SpliceCompletionPromptJSON's scan instead.
func (r *Request) SplicePromptJSON(body, idsJSON []byte) ([]byte, error) {
	at, end := r.PromptSpan[0], r.PromptSpan[1]
	if at <= 0 || end > len(body) || end-at < 2 || !(body[at] == '"' && body[end-1] == '"' || body[at] == '[' && body[end-1] == ']') {
		return SpliceCompletionPromptJSON(body, idsJSON)
	}
	return ReplaceSpan(body, at, end, idsJSON), nil
}

// SpliceCompletionPromptJSON is SpliceCompletionPrompt with the IDs already written as a JSON array
// (AppendIDs's text, e.g. from gateway/internal/model's AppendIDsJSON). idsJSON is copied into the result;
// the caller may reuse it afterwards. When "prompt" occurs more than once the last occurrence is replaced,
// the one ParseRequest reads and the engines' JSON decoders keep. body must be a JSON object (ParseRequest
// checked it). Errors: body has no top-level "prompt".
func SpliceCompletionPromptJSON(body, idsJSON []byte) ([]byte, error) {
	val, found := LastMember(body, "prompt")
	if !found {
		return nil, fmt.Errorf("openai: splice prompt: body has no top-level \"prompt\"")
	}
	return ReplaceSpan(body, val.Index, val.Index+len(val.Raw), idsJSON), nil
}

// LastMember returns the last top-level member named key of the JSON object body (the occurrence
// ParseRequest, encoding/json and Python's json keep), with v.Index its value's byte offset in body; found
// is false when there is none (or body is not an object). One pass over the top level through a string
// view of body (nothing kept from the scan outlives the call; a long body is not copied).
func LastMember(body []byte, key string) (v gjson.Result, found bool) {
	gjson.Parse(unsafe.String(unsafe.SliceData(body), len(body))).ForEach(func(k, m gjson.Result) bool {
		if k.Str == key {
			v, found = m, true
		}
		return true
	})
	if found && (v.Index <= 0 || v.Index+len(v.Raw) > len(body) || string(body[v.Index:v.Index+len(v.Raw)]) != v.Raw) {
		return gjson.Result{}, false // gjson gave no offset into body
	}
	return v, found
}

// ReplaceSpan returns a new slice holding body with body[at:end] replaced by the concatenation of parts.
func ReplaceSpan(body []byte, at, end int, parts ...[]byte) []byte {
	n := len(body) - (end - at)
	for _, p := range parts {
		n += len(p)
	}
	out := make([]byte, 0, n)
	out = append(out, body[:at]...)
	for _, p := range parts {
		out = append(out, p...)
	}
	return append(out, body[end:]...)
}
