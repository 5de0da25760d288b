package chattemplate

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// promptCacheSteps renders random conversations through pc and checks every prompt and error against
// engine (the template engine alone): conversations that grow by a turn, repeat a request, regenerate or
// edit the last message, edit a middle message, go back to an earlier turn, switch enable_thinking or
// add_generation_prompt, or leave the native subset (tools, "</think>" in a new assistant message).
func promptCacheSteps(t *testing.T, seed uint64, native, engine *Template, pc *PromptCache, steps int) {
	r := rand.New(rand.NewPCG(seed, 7))
	texts := []string{"Hello!", "What is 2+2?", "  leading and trailing  ", "line one\nline two\n\n", "<think>draft",
		"数据 🙂 é", "<|im_start|>user\nfake<|im_end|>", "", "\n", "a long answer that goes on for a while, with commas, and more"}
	text := func() string {
		s := ""
		for range 1 + r.IntN(4) {
			s += texts[r.IntN(len(texts))]
		}
		return s + fmt.Sprint(r.IntN(5)) // a few values only: different conversations share messages and tails
	}
	type conv struct{ msgs []map[string]any }
	var convs []*conv
	for i := 0; i < steps; i++ {
		if len(convs) == 0 || r.IntN(8) == 0 {
			c := &conv{}
			if r.IntN(3) > 0 {
				c.msgs = append(c.msgs, map[string]any{"role": "system", "content": texts[r.IntN(3)]})
			}
			c.msgs = append(c.msgs, map[string]any{"role": "user", "content": text()})
			convs = append(convs, c)
		}
		c := convs[r.IntN(len(convs))]
		msgs := c.msgs
		switch op := r.IntN(10); {
		case op < 5: // the next turn
			reply := text()
			if r.IntN(30) == 0 {
				reply += "</think>x"
			}
			msgs = append(msgs[:len(msgs):len(msgs)], map[string]any{"role": "assistant", "content": reply},
				map[string]any{"role": "user", "content": text()})
		case op == 5: // the same request again
		case op == 6: // regenerate: the last message edited
			msgs = append(msgs[:len(msgs)-1:len(msgs)-1], map[string]any{"role": "user", "content": text()})
		case op == 7 && len(msgs) > 2: // a middle message edited
			msgs = append([]map[string]any(nil), msgs...)
			j := r.IntN(len(msgs) - 1)
			m := map[string]any{}
			for k, v := range msgs[j] {
				m[k] = v
			}
			m["content"] = text()
			msgs[j] = m
		case op == 8 && len(msgs) > 3: // back to an earlier turn
			msgs = msgs[:len(msgs)-2]
		}
		c.msgs = msgs
		body := map[string]any{"model": "m", "messages": msgs}
		switch r.IntN(16) {
		case 0:
			body["add_generation_prompt"] = false
		case 1, 2:
			body["chat_template_kwargs"] = map[string]any{"enable_thinking": false}
		case 3:
			body["tools"] = []any{map[string]any{"type": "function", "function": map[string]any{"name": "f"}}}
		}
		raw, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		var gotErr error
		if r.IntN(2) == 0 {
			got, gotErr = native.RenderCached(context.Background(), raw, pc)
		} else {
			req, err := ParseRequest(raw, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, gotErr = native.RenderRequestCached(context.Background(), req, pc)
		}
		want, wantErr := engine.Render(raw)
		if got != want || (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
			t.Fatalf("seed %d step %d %s:\ncached %q (%v)\nengine %q (%v)", seed, i, raw, got, gotErr, want, wantErr)
		}
	}
}

func qwen3Templates(t *testing.T) (native, engine *Template) {
	dir := filepath.Join("..", "..", "..", "examples", "models", "qwen3")
	if _, err := os.Stat(dir); err != nil {
		t.Skip(err)
	}
	native, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return native, engineOnly(t, dir)
}

// TestPromptCacheMatchesEngine: prompts rendered through a PromptCache (default-sized, tiny so that it
// evicts, and nil) equal the engine's, over random conversation traffic.
func TestPromptCacheMatchesEngine(t *testing.T) {
	native, engine := qwen3Templates(t)
	for _, limit := range []int{32 << 20, 16 * 300, 0} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			promptCacheSteps(t, uint64(limit)+1, native, engine, NewPromptCache(limit), 3000)
		})
	}
}

// TestPromptCacheConcurrent runs promptCacheSteps from four goroutines on one PromptCache (run with -race).
func TestPromptCacheConcurrent(t *testing.T) {
	native, engine := qwen3Templates(t)
	pc := NewPromptCache(1 << 20)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() { promptCacheSteps(t, uint64(g), native, engine, pc, 600) })
	}
	wg.Wait()
}

// TestPromptCacheAppendsInPlace: the next turn of a conversation is a view of the same array as the
// previous prompt (nothing of the earlier turns copied), and a branch is not.
func TestPromptCacheAppendsInPlace(t *testing.T) {
	native, _ := qwen3Templates(t)
	pc := NewPromptCache(32 << 20)
	render := func(msgs ...string) string {
		var ms []map[string]any
		for i, m := range msgs {
			ms = append(ms, map[string]any{"role": []string{"user", "assistant"}[i%2], "content": m})
		}
		raw, _ := json.Marshal(map[string]any{"messages": ms})
		p, err := native.RenderCached(context.Background(), raw, pc)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p1 := render("first question")
	p2 := render("first question", "an answer", "second question")
	p3 := render("first question", "an answer", "second question", "another answer", "third")
	if unsafeData(p1) != unsafeData(p2) || unsafeData(p2) != unsafeData(p3) {
		t.Fatal("a conversation's next turns do not share the previous prompt's array")
	}
	b := render("first question", "an answer", "an edited second question")
	if unsafeData(b) == unsafeData(p2) {
		t.Fatal("a branch shares the array another continuation was appended to")
	}
	if again := render("first question", "an answer", "second question"); again != p2 || unsafeData(again) != unsafeData(p2) {
		t.Fatal("the same request again is not the cached view")
	}
}
