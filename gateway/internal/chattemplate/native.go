package chattemplate

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/ardanlabs/jinja"
)

// nativeKind names a template this package can also render without the engine, for the requests it
// recognizes as plain (see nativeQwen3). The output is the engine's byte for byte (TestNativeMatchesEngine);
// any request outside that subset goes through the engine.
type nativeKind int

const (
	nativeNone nativeKind = iota
	// nativeQwen3 is the chat template of Qwen3 (examples/models/qwen3, testdata/templates/qwen3.jinja).
	nativeQwen3
)

// nativeSources maps the SHA-256 of a template source (after normalizeNewlines) to its native renderer.
var nativeSources = map[string]nativeKind{
	"87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5": nativeQwen3,
}

// nativeFor returns the native renderer of a normalized template source, nativeNone for any other source.
func nativeFor(src string) nativeKind {
	sum := sha256.Sum256([]byte(src))
	return nativeSources[hex.EncodeToString(sum[:])]
}

// nativeKwargs are the template variables a plain request may carry for a native render: the ones the
// request fields set and Qwen3's enable_thinking. Any other kwarg (one that could shadow a name the
// template uses, or that another template reads) sends the request to the engine.
var nativeKwargs = map[string]bool{"add_generation_prompt": true, "continue_final_message": true,
	"documents": true, "reasoning_effort": true, "enable_thinking": true}

// renderNativeQwen3 renders msgs (the request's messages as decoded from the JSON, before conversation
// rebuilds them) with Qwen3's template when the request is plain: no tools, every message a dict of a
// string role (system, user, assistant) and a string content (plus an optional string name, which the
// template does not read), no assistant content holding "</think>", the last message not from the
// assistant, enable_thinking absent or a bool, continue_final_message off. ok is false for any other
// request, which the engine then renders.
//
// For such a request every branch of the template that depends on other messages is fixed:
// ns.last_query_index only matters for assistant messages with reasoning (none here) or for the last
// message when it is the assistant's (excluded), the tool branches are not taken, and the first system
// message is written by the preamble and skipped by the loop. What remains is one fixed string per
// message, so the prompt is the concatenation this function writes.
func renderNativeQwen3(msgs []jinja.Value, kw *jinja.Dict, addGen, contFinal jinja.Value) (string, bool) {
	if len(msgs) == 0 || contFinal.IsTruthy() {
		return "", false
	}
	for _, k := range kw.Keys {
		if !nativeKwargs[k] {
			return "", false
		}
	}
	think := false
	if v, ok := kw.Get("enable_thinking"); ok {
		if !v.IsBool() {
			return "", false
		}
		think = !v.AsBool()
	}
	size := 64
	for i, m := range msgs {
		if !m.IsDict() {
			return "", false
		}
		md := m.AsDict()
		var role, content string
		for _, k := range md.Keys {
			v := md.Data[k]
			switch {
			case k == "role" && v.IsString():
				role = v.AsString()
			case k == "content" && v.IsString():
				content = v.AsString()
			case k == "name" && v.IsString():
			default:
				return "", false
			}
		}
		if _, ok := md.Get("content"); !ok {
			return "", false
		}
		switch role {
		case "system", "user":
		case "assistant":
			if i == len(msgs)-1 || strings.Contains(content, "</think>") {
				return "", false
			}
		default:
			return "", false
		}
		size += len(content) + len(role) + 24
	}
	var sb strings.Builder
	sb.Grow(size)
	for i, m := range msgs {
		md := m.AsDict()
		role, _ := md.Get("role")
		content, _ := md.Get("content")
		if i == 0 && role.AsString() == "system" {
			// The preamble writes it; the loop skips the first system message.
			sb.WriteString("<|im_start|>system\n")
			sb.WriteString(content.AsString())
			sb.WriteString("<|im_end|>\n")
			continue
		}
		sb.WriteString("<|im_start|>")
		sb.WriteString(role.AsString())
		sb.WriteString("\n")
		sb.WriteString(content.AsString())
		sb.WriteString("<|im_end|>\n")
	}
	if addGen.IsTruthy() {
		sb.WriteString("<|im_start|>assistant\n")
		if think {
			sb.WriteString("<think>\n\n</think>\n\n")
		}
	}
	return sb.String(), true
}
