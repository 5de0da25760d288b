package gateway

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/gateway/config"
	kvopenai "github.com/kvgate/kvgate/gateway/internal/openai"
	"github.com/kvgate/kvgate/gateway/internal/route"
	"github.com/kvgate/kvgate/gateway/internal/upstream"
)

// TestCompletionBodyThroughIDTextCache: a completions body built through the model's ID-text cache
// (engineBody for completions) is byte-for-byte the one upstream.Body builds from the IDs alone, and its
// "prompt" is the tokenizer's IDs, for a prompt that grows turn by turn (the cached text is extended), is
// edited below the cached length (a new array: nothing cached is reused) and is sent again unchanged.
func TestCompletionBodyThroughIDTextCache(t *testing.T) {
	enc, err := testEncoder("")
	if err != nil {
		t.Fatal(err)
	}
	if appenderOf(&route.Plan{Model: &route.Model{Encoder: enc}}) == nil {
		t.Fatal("the Qwen3 model has no ID-text cache: the test would not reach it")
	}
	var tk tokenIDs
	prompt := "The quick brown fox jumps over the lazy dog."
	var prompts []string
	for i := range 6 {
		prompt += fmt.Sprintf(" Turn %d: the answer was %d, and the next question follows.", i, i*37)
		prompts = append(prompts, prompt)
	}
	prompts = append(prompts, strings.Replace(prompt, "quick", "slow", 1), prompt, prompt)
	for _, kind := range []string{config.EngineSim, config.EngineVLLM} {
		for i, text := range prompts {
			body, _ := json.Marshal(map[string]any{"model": "qwen3", "prompt": text, "max_tokens": 4})
			req, err := kvopenai.ParseRequest(kvopenai.Completions, body)
			if err != nil {
				t.Fatal(err)
			}
			p := &route.Plan{Model: &route.Model{Encoder: enc}, IDs: enc.EncodeCompletion(req.PromptText)}
			got, err := tk.completionBody(req, p, route.Candidate{Engine: kind}, body)
			if err != nil {
				t.Fatal(err)
			}
			want, err := upstream.Body(kind, req, body, p.IDs)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Fatalf("%s turn %d: cached body differs:\n got %.200s\nwant %.200s", kind, i, got, want)
			}
			var sent struct{ Prompt []uint32 }
			if err := json.Unmarshal(got, &sent); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(sent.Prompt, p.IDs) || len(sent.Prompt) < 10 {
				t.Fatalf("%s turn %d: prompt IDs %v, want %v", kind, i, sent.Prompt, p.IDs)
			}
		}
	}
}
