package model

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/gateway/internal/tokenizer"
)

// completionModels are the reference tokenizers (the five of .cache/models and the example Qwen3).
func completionModels(t *testing.T) map[string]*tokenizer.Tokenizer {
	out := map[string]*tokenizer.Tokenizer{}
	for _, name := range []string{"qwen3", "llama3_1", "deepseek_v3", "llama2", "gemma3"} {
		out[name] = loadTok(t, modelDir(t, name))
	}
	out["examples/qwen3"] = loadTok(t, filepath.Join(repoRoot(t), "examples", "models", "qwen3"))
	return out
}

// completionTraffic sends growing prompts (an agent appending turns), re-sent prompts, branches (a prompt
// cut back and continued differently), unrelated prompts and invalid UTF-8, and checks every result
// against the plain Encode(prompt, true).
func completionTraffic(t *testing.T, tk *tokenizer.Tokenizer, md *Model, bench string, seed uint64, steps int) {
	r := rand.New(rand.NewPCG(seed, 3))
	var prompts []string
	for i := range steps {
		var p string
		switch k := r.IntN(10); {
		case len(prompts) == 0 || k == 0: // a new prompt
			p = "Instructions:\n" + randomText(r, bench)
		case k < 7: // the next turn of a seen prompt
			p = prompts[r.IntN(len(prompts))] + "\nUser: " + randomText(r, bench) + "\nAssistant:"
		case k < 8: // the same prompt again
			p = prompts[r.IntN(len(prompts))]
		default: // a branch: cut a seen prompt somewhere and continue differently
			old := prompts[r.IntN(len(prompts))]
			p = old[:r.IntN(len(old)+1)] + randomText(r, bench)
		}
		if len(p) > 400<<10 {
			p = p[:1000]
		}
		want := tk.Encode(p, true)
		got := md.EncodeCompletion(p)
		if !slices.Equal(got, want) {
			t.Fatalf("step %d: EncodeCompletion differs from Encode(prompt, true) at ID %d of %d (%d bytes)", i, mismatch(got, want), len(want), len(p))
		}
		if len(got) > 0 && cap(got) != len(got) {
			t.Fatalf("step %d: result not clipped (len %d cap %d)", i, len(got), cap(got))
		}
		prompts = append(prompts, p)
	}
}

func TestRandomCompletionsMatchEncode(t *testing.T) {
	bench := benchText(t)
	steps := 300
	if testing.Short() {
		steps = 80
	}
	for name, tk := range completionModels(t) {
		for _, opts := range []Options{{}, {CompletionCacheBytes: prefixShards * 64 << 10}, {CompletionCacheBytes: -1}} {
			t.Run(fmt.Sprintf("%s/%+v", name, opts), func(t *testing.T) {
				t.Parallel()
				completionTraffic(t, tk, NewWithOptions(tk, nil, opts), bench, uint64(len(name)), steps)
			})
		}
	}
}

// TestCompletionNextTurnUsesCache: a prompt extending a seen one is served from the cache (its IDs share
// the earlier prompt's array), on the tokenizers with text cuts.
func TestCompletionNextTurnUsesCache(t *testing.T) {
	bench := strings.ToValidUTF8(benchText(t)[:200000], "")
	for name, tk := range completionModels(t) {
		t.Run(name, func(t *testing.T) {
			md := New(tk, nil)
			p := "Story:\n" + bench[:20000] + "\nAssistant:"
			first := md.EncodeCompletion(p)
			next := p + " " + bench[20000:21000] + "\nUser: " + bench[21000:22000] + "\nAssistant:"
			second := md.EncodeCompletion(next)
			if !slices.Equal(second, tk.Encode(next, true)) {
				t.Fatal("next turn differs from Encode")
			}
			shared := len(first) > 100 && len(second) > 100 && &first[0] == &second[0]
			if shared != tk.TextCuts() {
				t.Errorf("next turn shares the first prompt's IDs: %v, want %v (TextCuts)", shared, tk.TextCuts())
			}
		})
	}
}

// TestConcurrentCompletions runs completion traffic from several goroutines on one Model (run with -race).
func TestConcurrentCompletions(t *testing.T) {
	bench := benchText(t)
	tk := loadTok(t, modelDir(t, "qwen3"))
	md := NewWithOptions(tk, nil, Options{CompletionCacheBytes: prefixShards * 256 << 10})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() { completionTraffic(t, tk, md, bench, uint64(g%2), 60) })
	}
	wg.Wait()
}
