package chattemplate

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"sync"

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
// message, so the prompt is the concatenation this function writes (the preamble's system message is the
// same bytes as the loop's would be).
//
// With a PromptCache (pc not nil), the longest cached render of the request's first messages is reused:
// only the messages after it (and the generation prompt) are written, and assistant messages are checked
// for "</think>" only there (a cached render's messages passed that check when it was written).
//
// plain, when it holds one entry per message, is the messages' plainMsg as the decoder read them
// (chatRequest.plain); otherwise the messages are read here.
func renderNativeQwen3(msgs []jinja.Value, plain []nativeMsg, kw *jinja.Dict, addGen, contFinal jinja.Value, pc *PromptCache) (string, bool) {
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
	parts := plain
	if len(parts) != len(msgs) {
		parts = make([]nativeMsg, len(msgs))
		for i, m := range msgs {
			var ok bool
			if parts[i], ok = plainMsg(m); !ok {
				return "", false
			}
		}
	}
	offs := make([]int, len(msgs)+1) // offs[i]: the text length of msgs[:i]
	for i, m := range parts {
		switch m.role {
		case "system", "user":
		case "assistant":
			if i == len(parts)-1 {
				return "", false
			}
		default:
			return "", false
		}
		offs[i+1] = offs[i] + m.segLen()
	}
	var cached string // the render of parts[:k], a view of arena
	var arena *byteArena
	k := 0
	if pc != nil {
		k, cached, arena = pc.lookup(parts, offs)
	}
	for _, m := range parts[k:] {
		if m.role == "assistant" && strings.Contains(m.content, "</think>") {
			return "", false
		}
	}
	genPrompt := ""
	if addGen.IsTruthy() {
		genPrompt = imStart + "assistant\n"
		if think {
			genPrompt += "<think>\n\n</think>\n\n"
		}
	}
	size := offs[len(parts)] + len(genPrompt)
	if pc == nil {
		b := make([]byte, 0, size)
		for _, m := range parts {
			b = appendSeg(b, m)
		}
		return bytesView(append(b, genPrompt...), size), true
	}
	if arena == nil {
		b := make([]byte, 0, promptArenaCap(size))
		for _, m := range parts {
			b = appendSeg(b, m)
		}
		b = append(b, genPrompt...)
		arena = newByteArena(b)
		out := bytesView(b, size)
		pc.put(parts, len(parts), out[:offs[len(parts)]], arena, cap(b))
		return out, true
	}
	// The new messages' text, then the cached prefix's arena extended with it.
	scratch := promptScratch.Get().(*[]byte)
	more := (*scratch)[:0]
	for _, m := range parts[k:] {
		more = appendSeg(more, m)
	}
	more = append(more, genPrompt...)
	out, capacity, ok := extend(arena, cached, more)
	if !ok {
		// A branch: another continuation follows the cached prefix in its array; this prompt gets an
		// array of its own (one copy of the prefix, what every render cost without the cache).
		b := make([]byte, 0, promptArenaCap(size))
		b = append(append(b, cached...), more...)
		arena, out, capacity = newByteArena(b), bytesView(b, size), cap(b)
	}
	if cap(more) <= maxPromptScratch {
		*scratch = more[:0]
		promptScratch.Put(scratch)
	}
	pc.put(parts, len(parts), out[:offs[len(parts)]], arena, capacity)
	return out, true
}

// plainMsg returns a message's role and content when it is plain for a native render: a dict whose keys
// are a string role, a string content and at most a string name (which the template does not read). The
// role's value is not checked here.
func plainMsg(m jinja.Value) (nativeMsg, bool) {
	if !m.IsDict() {
		return nativeMsg{}, false
	}
	md := m.AsDict()
	var role, content string
	hasContent := false // md.Keys lists md.Data's keys once each (the dicts are built with Set)
	for _, k := range md.Keys {
		v := md.Data[k]
		switch {
		case k == "role" && v.IsString():
			role = v.AsString()
		case k == "content" && v.IsString():
			content, hasContent = v.AsString(), true
		case k == "name" && v.IsString():
		default:
			return nativeMsg{}, false
		}
	}
	return nativeMsg{role: role, content: content}, hasContent
}

// promptScratch holds the buffers (*[]byte) renderNativeQwen3 writes a cached prompt's new messages into
// before appending them to its arena; buffers above maxPromptScratch bytes are dropped.
var promptScratch = sync.Pool{New: func() any { return new([]byte) }}

const maxPromptScratch = 1 << 18
