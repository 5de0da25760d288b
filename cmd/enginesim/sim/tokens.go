package sim

import (
	"encoding/json"
	"hash/fnv"
	"strings"
)

// textModel is what the simulator needs from a model's text pipeline: render + tokenize chat requests and
// completion prompts exactly as vLLM would, and decode generated tokens. The gateway/textmodel adapter
// (model.go) is the real one; byteModel is the fallback when the model has no tokenizer files.
type textModel interface {
	// EncodeChat renders the OpenAI chat body with the model's chat template and tokenizes it (no special
	// tokens added); errors are the client's fault (400).
	EncodeChat(body []byte) (prompt string, ids []uint32, err error)
	// EncodeCompletion tokenizes a completion prompt, adding special tokens (BOS) as vLLM does.
	EncodeCompletion(prompt string) []uint32
	// EncodeText tokenizes text without adding special tokens.
	EncodeText(text string) []uint32
	// Decode turns token IDs back into text.
	Decode(ids []uint32) string
	// Kind names the pipeline for /v1/models and logs ("tokenizer" or "bytes").
	Kind() string
}

// byteModel is the fallback pipeline used when --model names no directory with tokenizer files: one token
// per UTF-8 byte (token ID = byte value), chat rendered as "<|role|>\ncontent\n" per message followed by
// "<|assistant|>\n". It keeps the simulator usable for token-ID traffic and quick curl tests; a text request
// and its byte-token twin hit the same cache blocks.
type byteModel struct{}

func (byteModel) Kind() string { return "bytes" }

func (byteModel) EncodeCompletion(prompt string) []uint32 { return bytesToIDs(prompt) }

func (byteModel) EncodeText(text string) []uint32 { return bytesToIDs(text) }

func (byteModel) Decode(ids []uint32) string {
	b := make([]byte, 0, len(ids))
	for _, id := range ids {
		if id < 256 {
			b = append(b, byte(id))
		}
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

func (byteModel) EncodeChat(body []byte) (string, []uint32, error) {
	var req struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return "", nil, badRequest("invalid chat request: %v", err)
	}
	if len(req.Messages) == 0 {
		return "", nil, badRequest("messages must not be empty")
	}
	var sb strings.Builder
	for i, m := range req.Messages {
		if m.Role == "" {
			return "", nil, badRequest("messages[%d].role is required", i)
		}
		text, err := contentText(m.Content)
		if err != nil {
			return "", nil, badRequest("messages[%d].content: %v", i, err)
		}
		sb.WriteString("<|" + m.Role + "|>\n" + text + "\n")
	}
	sb.WriteString("<|assistant|>\n")
	return sb.String(), bytesToIDs(sb.String()), nil
}

// contentText flattens an OpenAI message content (string, null, or list of {type:"text", text} parts).
func contentText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", err
	}
	var sb strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			sb.WriteString(p.Text)
		}
	}
	return sb.String(), nil
}

func bytesToIDs(s string) []uint32 {
	ids := make([]uint32, len(s))
	for i := 0; i < len(s); i++ {
		ids[i] = uint32(s[i])
	}
	return ids
}

// outputText is the text the simulator "generates": its tokens, cycled, are every request's output.
const outputText = "The quick brown fox jumps over the lazy dog while the simulated engine keeps its " +
	"prefix cache warm, streams one token per step, and reports what a real server would report. "

// outputVocab holds the output token cycle of one model.
type outputVocab struct {
	ids []uint32
}

func newOutputVocab(m textModel) outputVocab {
	ids := m.EncodeCompletion(outputText)
	// Drop special tokens a tokenizer may have prepended (BOS): keep the ones that decode to text.
	for len(ids) > 0 && m.Decode(ids[:1]) == "" {
		ids = ids[1:]
	}
	if len(ids) == 0 {
		ids = bytesToIDs(outputText)
	}
	return outputVocab{ids: ids}
}

// start picks the deterministic starting point of a prompt's output in the cycle.
func (v outputVocab) start(prompt []uint32) int {
	h := fnv.New32a()
	var b [4]byte
	for _, id := range prompt {
		b[0], b[1], b[2], b[3] = byte(id), byte(id>>8), byte(id>>16), byte(id>>24)
		h.Write(b[:])
	}
	return int(h.Sum32() % uint32(len(v.ids)))
}

// token returns output token i of a request whose cycle starts at start.
func (v outputVocab) token(start, i int) uint32 { return v.ids[(start+i)%len(v.ids)] }

// deltaText returns the text token ids[i] adds to the decoded ids[:i], decoding a short window so that a
// token whose text depends on its neighbours (leading-space markers) comes out as in the full decode. The
// output cycle is ASCII text, so no character is split across tokens.
func deltaText(m textModel, ids []uint32, i int) string {
	lo := max(0, i-4)
	prev := m.Decode(ids[lo:i])
	cur := m.Decode(ids[lo : i+1])
	if strings.HasPrefix(cur, prev) {
		return cur[len(prev):]
	}
	return m.Decode(ids[i : i+1])
}
