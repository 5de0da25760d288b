package model

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/gateway/internal/chattemplate"
	"github.com/kvgate/kvgate/gateway/internal/openai"
	"github.com/kvgate/kvgate/gateway/internal/tokenizer"
	"github.com/kvgate/kvgate/gateway/internal/upstream"
	"github.com/kvgate/kvgate/kvstore"
)

// turnText cuts the bench text into message texts of about bytes bytes, starting at off.
func turnText(bench string, off, bytes int) string {
	off %= len(bench) - bytes
	return strings.ToValidUTF8(bench[off:off+bytes], "")
}

type chatMsg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// BenchmarkNewTurn measures what one new turn of a conversation costs the gateway's text pipeline, at
// history lengths of 512, 2k, 8k, 32k and 128k tokens (Qwen3 of examples/models, bench text, turns of ~560
// new tokens: an assistant reply and the next user message, ~280 tokens each).
//
// Each iteration starts from a fresh Model whose caches saw the previous request of the conversation
// (untimed, followed by a runtime.GC so the setup's garbage does not land on the timed stages), then times the new request's stages one after the other:
//   - chat: body-µs (openai.ParseRequest: the body decoded, the chat request included), render-µs
//     (the Model's render: RenderRequestCached through its rendered-prompt cache), tokenize-µs (EncodePrompt), hash-µs (block keys, 16 tokens a block), splice-µs
//     (Model.AppendIDsJSON then upstream.ChatBodyJSONFor, prompt_token_ids, as the gateway's engineBody);
//   - completion: body-µs, tokenize-µs (EncodeCompletion), hash-µs, splice-µs (Model.AppendIDsJSON then
//     Request.SplicePromptJSON at the parsed prompt's span, as the gateway's engineBody) and
//     splice-uncached-µs (untimed: openai.SpliceCompletionPrompt, every ID formatted and the body scanned);
//   - new-µs: Encode of the turn's new text alone (the rendered prompt's bytes after the previous
//     request's prompt) by a second instance of the tokenizer that saw the same history, so that in both
//     the new text's words are seen for the first time; the target's denominator.
//
// Reported values are medians over the iterations (run with -benchtime 15x); ratio is
// (render+tokenize)/new for chat and tokenize/new for completions; the target is <= 2.
func BenchmarkNewTurn(b *testing.B) {
	dir := filepath.Join(repoRoot(b), "examples", "models", "qwen3")
	base, err := Load(dir)
	if err != nil {
		b.Fatal(err)
	}
	tk, tmpl := base.Tokenizer(), base.tmpl.(*chattemplate.Template)
	// alone encodes the new text by itself. It is a second instance of the same tokenizer so that its word
	// cache sees what tk's sees (the history, then the new text for the first time) and neither encode
	// finds the new text's words already cached by the other.
	alone, err := tokenizer.Load(dir)
	if err != nil {
		b.Fatal(err)
	}
	bench := benchText(b)
	const half = 1120 // bytes of bench text per message: ~280 tokens
	for _, api := range []string{"chat", "completion"} {
		for _, hist := range []int{512, 2048, 8192, 32768, 131072} {
			b.Run(fmt.Sprintf("%s/history=%d", api, hist), func(b *testing.B) {
				// The history: system, then user/assistant pairs until the prompt holds hist tokens.
				msgs := []chatMsg{{"system", "You are a helpful assistant."}}
				off := 0
				for {
					msgs = append(msgs, chatMsg{"user", turnText(bench, off, half)})
					off += half
					if n := len(tk.Encode(completionPrompt(msgs), false)); n >= hist {
						break
					}
					msgs = append(msgs, chatMsg{"assistant", turnText(bench, off, half)})
					off += half
				}
				var body, render, tokenize, hash, splice, spliceAll, newAlone, total []time.Duration
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					next := append(slices.Clip(msgs), chatMsg{"assistant", turnText(bench, off+2*i*half, half)},
						chatMsg{"user", turnText(bench, off+(2*i+1)*half, half)})
					md := NewWithOptions(tk, tmpl, Options{})
					var prevPrompt, newPrompt string
					var prevBody, newBody []byte
					if api == "chat" {
						prevBody, newBody = chatBody(b, msgs), chatBody(b, next)
						var prevIDs []uint32
						prevPrompt, prevIDs, err = md.EncodeChat(prevBody)
						if err != nil {
							b.Fatal(err)
						}
						// The previous request went to the engine with its IDs, as the gateway sends it.
						upstream.ChatBodyJSON(config.ChatTokenIDsPromptTokenIDs, prevBody, md.AppendIDsJSON(nil, prevIDs, openai.AppendIDs))
					} else {
						prevPrompt, newPrompt = completionPrompt(msgs), completionPrompt(next)
						prevBody, newBody = completionBody(b, prevPrompt), completionBody(b, newPrompt)
						// The previous request went to the engine with its IDs, as the gateway sends it.
						openai.SpliceCompletionPromptJSON(prevBody, md.AppendIDsJSON(nil, md.EncodeCompletion(prevPrompt), openai.AppendIDs))
					}
					alone.Encode(prevPrompt, false)
					// The setup's garbage (a fresh Model, the previous request's encode) is collected
					// here, so that the timed stages pay for their own allocations only.
					runtime.GC()
					b.StartTimer()
					t0 := time.Now()
					var ids []uint32
					var creq *openai.Request
					if api == "chat" {
						req, err := openai.ParseRequest(openai.Chat, newBody)
						if err != nil {
							b.Fatal(err)
						}
						creq = req
						t1 := time.Now()
						prompt, err := md.render(req.Chat)
						if err != nil {
							b.Fatal(err)
						}
						t2 := time.Now()
						ids = md.EncodePrompt(prompt)
						t3 := time.Now()
						body, render, tokenize = append(body, t1.Sub(t0)), append(render, t2.Sub(t1)), append(tokenize, t3.Sub(t2))
						newPrompt = prompt
					} else {
						req, err := openai.ParseRequest(openai.Completions, newBody)
						if err != nil {
							b.Fatal(err)
						}
						creq = req
						t1 := time.Now()
						ids = md.EncodeCompletion(req.PromptText)
						t2 := time.Now()
						body, tokenize = append(body, t1.Sub(t0)), append(tokenize, t2.Sub(t1))
					}
					t4 := time.Now()
					keys := kvstore.Hasher{}.Keys(ids, 16, kvstore.ExtraKeys{})
					t5 := time.Now()
					hash = append(hash, t5.Sub(t4))
					if api == "chat" {
						// As the gateway's engineBody: the IDs' text through the Model's cache, then spliced.
						out, _ := upstream.ChatBodyJSONFor(creq, config.ChatTokenIDsPromptTokenIDs, newBody, md.AppendIDsJSON(nil, ids, openai.AppendIDs))
						splice = append(splice, time.Since(t5))
						_ = out
					} else {
						// As engineBody for completions: the prompt's IDs through the Model's cache, spliced in
						// place of "prompt"; and, untimed, the splice formatting every ID, for the ratio.
						if _, err := creq.SplicePromptJSON(newBody, md.AppendIDsJSON(nil, ids, openai.AppendIDs)); err != nil {
							b.Fatal(err)
						}
						splice = append(splice, time.Since(t5))
						b.StopTimer()
						u0 := time.Now()
						if _, err := openai.SpliceCompletionPrompt(newBody, ids); err != nil {
							b.Fatal(err)
						}
						spliceAll = append(spliceAll, time.Since(u0))
						b.StartTimer()
					}
					_ = keys
					b.StopTimer()
					// The new text alone: the new prompt after the longest common prefix with the previous one.
					k := 0
					for k < len(prevPrompt) && k < len(newPrompt) && prevPrompt[k] == newPrompt[k] {
						k++
					}
					newText := newPrompt[k:]
					a0 := time.Now()
					alone.Encode(newText, false)
					newAlone = append(newAlone, time.Since(a0))
					if i == 0 && !slices.Equal(ids, tk.Encode(newPrompt, api == "completion")) {
						b.Fatal("IDs differ from a full encode")
					}
					b.StartTimer()
				}
				work := tokenize
				if api == "chat" {
					work = make([]time.Duration, len(render))
					for i := range render {
						work[i] = render[i] + tokenize[i]
					}
					b.ReportMetric(median(render), "render-µs")
				} else {
					b.ReportMetric(median(spliceAll), "splice-uncached-µs")
				}
				b.ReportMetric(median(splice), "splice-µs")
				for i := range work {
					total = append(total, work[i])
				}
				b.ReportMetric(median(body), "body-µs")
				b.ReportMetric(median(tokenize), "tokenize-µs")
				b.ReportMetric(median(hash), "hash-µs")
				b.ReportMetric(median(newAlone), "new-µs")
				b.ReportMetric(median(total)/median(newAlone), "ratio")
			})
		}
	}
}

// median returns the median of ds in µs.
func median(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[len(s)/2].Nanoseconds()) / 1e3
}

// completionPrompt renders msgs as an agent that builds its own prompts for /v1/completions would:
// plain text, one "Role: text" block per message, ending with "Assistant:".
func completionPrompt(msgs []chatMsg) string {
	var sb strings.Builder
	for _, m := range msgs {
		sb.WriteString(strings.ToUpper(m.Role[:1]) + m.Role[1:] + ": " + m.Content + "\n")
	}
	sb.WriteString("Assistant:")
	return sb.String()
}

func chatBody(b testing.TB, msgs []chatMsg) []byte {
	body, err := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	if err != nil {
		b.Fatal(err)
	}
	return body
}

func completionBody(b *testing.B, prompt string) []byte {
	body, err := json.Marshal(map[string]any{"model": "m", "prompt": prompt})
	if err != nil {
		b.Fatal(err)
	}
	return body
}
