package upstream

import (
	"bytes"

	"github.com/tidwall/gjson"

	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/gateway/internal/openai"
)

// Reasons a chat request went to an engine with its original body although its endpoint takes token IDs:
// the reason label of kvgate_token_ids_skipped_total{endpoint,reason}.
const (
	// SkipClientSet: the client already sent the token-ID field (it wins; the gateway adds nothing).
	SkipClientSet = "client_set"
	// SkipMultimodal: a content part the gateway does not render into the engine's tokens (image, audio,
	// video, embeddings): the engine's multimodal processor inserts its own placeholder tokens.
	SkipMultimodal = "multimodal"
	// SkipContinueFinal: continue_final_message that the chat template cannot express (the final message
	// is not found in the rendered prompt); the engine answers it itself.
	SkipContinueFinal = "continue_final_message"
	// SkipUnverified: the drift guard has not (or no longer) proved the endpoint's engine tokenizes as the
	// gateway does (gateway/internal/driftguard).
	SkipUnverified = "unverified"
	// SkipInvalidField: the client's kv_transfer_params is neither an object nor null (the engine rejects it).
	SkipInvalidField = "invalid_kv_transfer_params"
)

// ChatBody returns body with ids spliced into the field mode names (config.ChatTokenIDs*), every other
// byte of body kept as the client sent it, or body itself and the reason when it must go unchanged:
//   - prompt_token_ids, input_ids: a top-level member, inserted right after the opening brace (a member
//     the client sent as null has its null replaced in place; any other value is the client's: SkipClientSet);
//   - kv_transfer_params: a top-level {"prompt_token_ids":[...]} object, or, when the client sent a
//     kv_transfer_params object, "prompt_token_ids" added as its first member (the client's own
//     prompt_token_ids there, unless null or [], wins: SkipClientSet; a non-object value: SkipInvalidField);
//   - off, or any other mode: body unchanged with skip "" (nothing to count).
//
// When a key occurs more than once the last occurrence is the one edited, as the engines' JSON decoders
// (Python's json) keep the last. body must be a JSON object (openai.ParseRequest checked it).
func ChatBody(mode string, body []byte, ids []uint32) (out []byte, skip string) {
	switch mode {
	case config.ChatTokenIDsPromptTokenIDs, config.ChatTokenIDsInputIDs, config.ChatTokenIDsKVTransfer:
	default:
		return body, ""
	}
	return ChatBodyJSON(mode, body, openai.AppendIDs(nil, ids))
}

// ChatBodyJSON is ChatBody with the IDs already written as a JSON array (openai.AppendIDs's text, e.g.
// from gateway/internal/model's AppendIDsJSON, which formats only the IDs a conversation's cached text lacks).
// idsJSON is copied into out; the caller may reuse it afterwards.
func ChatBodyJSON(mode string, body []byte, idsJSON []byte) (out []byte, skip string) {
	return ChatBodyJSONFor(nil, mode, body, idsJSON)
}

// ChatBodyJSONFor is ChatBodyJSON for the body req was parsed from (nil: unknown): when req says the
// body has no member named by mode (HasPromptTokenIDs, HasInputIDs, HasKVTransferParams; the common
// case) the IDs are inserted without scanning the body for it again (a 128k-token chat is ~0.5 MB).
func ChatBodyJSONFor(req *openai.Request, mode string, body []byte, idsJSON []byte) (out []byte, skip string) {
	var key string
	var present bool
	switch mode {
	case config.ChatTokenIDsPromptTokenIDs:
		key, present = mode, req == nil || req.HasPromptTokenIDs
	case config.ChatTokenIDsInputIDs:
		key, present = mode, req == nil || req.HasInputIDs
	case config.ChatTokenIDsKVTransfer:
		key, present = mode, req == nil || req.HasKVTransferParams
	default:
		return body, ""
	}
	brace := openBrace(body)
	if brace < 0 {
		return body, "" // not an object: openai.ParseRequest refuses it before this
	}
	var val gjson.Result
	found := false
	if present {
		val, found = openai.LastMember(body, key)
	}
	if mode != config.ChatTokenIDsKVTransfer {
		switch {
		case !found:
			return insertMember(body, brace, key, idsJSON), ""
		case val.Type == gjson.Null:
			return replaceValue(body, val, idsJSON), ""
		}
		return body, SkipClientSet
	}
	// kv_transfer_params: a new object is written from its parts (the IDs are copied once)
	head, tail := []byte(`{"prompt_token_ids":`), []byte(`}`)
	switch {
	case !found:
		return insertMember(body, brace, key, head, idsJSON, tail), ""
	case val.Type == gjson.Null:
		return replaceValue(body, val, head, idsJSON, tail), ""
	case !val.IsObject():
		return body, SkipInvalidField
	}
	var inner gjson.Result
	innerFound := false
	gjson.Parse(val.Raw).ForEach(func(k, v gjson.Result) bool { // indexes into val.Raw
		if k.Str == "prompt_token_ids" {
			inner, innerFound = v, true
		}
		return true
	})
	if innerFound {
		if inner.Type != gjson.Null && !(inner.IsArray() && len(inner.Array()) == 0) {
			return body, SkipClientSet
		}
		// vLLM reads a null or empty list as "not given" (kv.pop(...) or None): fill it in place.
		inner.Index += val.Index
		return replaceValue(body, inner, idsJSON), ""
	}
	return insertMember(body, val.Index, "prompt_token_ids", idsJSON), ""
}

// openBrace is the index of body's opening '{'.
func openBrace(body []byte) int {
	return bytes.IndexByte(body, '{')
}

// insertMember inserts "key":value as the first member of the object whose '{' is at body[brace]; value
// is the concatenation of parts.
func insertMember(body []byte, brace int, key string, value ...[]byte) []byte {
	out := make([]byte, 0, len(body)+len(key)+partsLen(value)+4)
	out = append(out, body[:brace+1]...)
	out = append(out, '"')
	out = append(out, key...)
	out = append(out, '"', ':')
	for _, p := range value {
		out = append(out, p...)
	}
	rest := body[brace+1:]
	j := 0
	for j < len(rest) && (rest[j] == ' ' || rest[j] == '\t' || rest[j] == '\n' || rest[j] == '\r') {
		j++
	}
	if j < len(rest) && rest[j] != '}' {
		out = append(out, ',')
	}
	return append(out, rest...)
}

// replaceValue replaces the value v (v.Index is its offset in body) by the concatenation of value.
func replaceValue(body []byte, v gjson.Result, value ...[]byte) []byte {
	return openai.ReplaceSpan(body, v.Index, v.Index+len(v.Raw), value...)
}

func partsLen(parts [][]byte) int {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	return n
}

// mediaHints are substrings without which a chat body has no media content part (cheap test before a
// parse). hasMediaHint finds them in two scans; the list is the reference its test checks it against.
var mediaHints = [][]byte{[]byte(`_url"`), []byte(`input_audio`), []byte(`image_pil`), []byte(`_embeds"`),
	[]byte(`"input_image"`), []byte(`"image"`), []byte(`"audio"`), []byte(`"video"`)}

// hasMediaHint reports whether body contains any of mediaHints, exactly as a bytes.Contains per hint
// would, in one vectorized IndexByte pass per anchor byte instead of eight passes over the body (a 10 KB
// body: ~20 µs before). Every hint holds a '"' (at its start or its end) or, for input_audio and
// image_pil, a '_' at index 5; each '"' and each '_' is checked against the hints anchored there.
func hasMediaHint(body []byte) bool {
	for i := 0; ; {
		j := bytes.IndexByte(body[i:], '"')
		if j < 0 {
			break
		}
		q := i + j
		after, before := body[q:], body[:q+1]
		if bytes.HasSuffix(before, []byte(`_url"`)) || bytes.HasSuffix(before, []byte(`_embeds"`)) ||
			bytes.HasPrefix(after, []byte(`"input_image"`)) || bytes.HasPrefix(after, []byte(`"image"`)) ||
			bytes.HasPrefix(after, []byte(`"audio"`)) || bytes.HasPrefix(after, []byte(`"video"`)) {
			return true
		}
		i = q + 1
	}
	for i := 0; ; {
		j := bytes.IndexByte(body[i:], '_')
		if j < 0 {
			return false
		}
		u := i + j
		if u >= 5 && (bytes.HasPrefix(body[u-5:], []byte(`input_audio`)) || bytes.HasPrefix(body[u-5:], []byte(`image_pil`))) {
			return true
		}
		i = u + 1
	}
}

// HasMediaParts reports whether a chat body has a message content part that is not text (image, audio,
// video, embeddings: anything whose tokens the engine's multimodal processor decides). Text, thinking and
// refusal parts, and tool references, are rendered by the gateway's chat template.
func HasMediaParts(body []byte) bool {
	if !hasMediaHint(body) {
		return false
	}
	media := false
	gjson.GetBytes(body, "messages").ForEach(func(_, m gjson.Result) bool {
		c := m.Get("content")
		if !c.IsArray() {
			return true
		}
		c.ForEach(func(_, part gjson.Result) bool {
			switch t := part.Get("type"); {
			case t.Type != gjson.String:
				for _, k := range []string{"image_url", "image_pil", "image_embeds", "audio_embeds", "prompt_embeds", "audio_url", "input_audio", "video_url"} {
					if part.Get(k).Exists() {
						media = true
					}
				}
			case t.Str == "text", t.Str == "thinking", t.Str == "reasoning", t.Str == "refusal", t.Str == "tool_reference", t.Str == "input_text", t.Str == "output_text":
			default:
				media = true
			}
			return !media
		})
		return !media
	})
	return media
}
