package model

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/gateway/internal/tokenizer"
)

// layout renders a conversation (system prompt, then alternating user and assistant messages) the way one
// model family's chat template does for plain messages, ending with the generation prompt.
type layout func(system string, msgs []string) string

var layouts = map[string]layout{
	"qwen3": func(system string, msgs []string) string {
		var sb strings.Builder
		sb.WriteString("<|im_start|>system\n" + system + "<|im_end|>\n")
		for i, m := range msgs {
			sb.WriteString("<|im_start|>" + [2]string{"user", "assistant"}[i%2] + "\n" + m + "<|im_end|>\n")
		}
		sb.WriteString("<|im_start|>assistant\n")
		return sb.String()
	},
	"llama3_1": func(system string, msgs []string) string {
		var sb strings.Builder
		sb.WriteString("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" + system + "<|eot_id|>")
		for i, m := range msgs {
			sb.WriteString("<|start_header_id|>" + [2]string{"user", "assistant"}[i%2] + "<|end_header_id|>\n\n" + m + "<|eot_id|>")
		}
		sb.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
		return sb.String()
	},
	"gemma3": func(system string, msgs []string) string {
		var sb strings.Builder
		sb.WriteString("<bos>")
		for i, m := range msgs {
			if i == 0 {
				m = system + "\n\n" + m
			}
			sb.WriteString("<start_of_turn>" + [2]string{"user", "model"}[i%2] + "\n" + m + "<end_of_turn>\n")
		}
		sb.WriteString("<start_of_turn>model\n")
		return sb.String()
	},
}

// randomText returns message content: a cut of the bench text (at any byte, so sometimes invalid UTF-8)
// mixed with fragments that stress added-token boundaries (whole and partial delimiters of every layout,
// whitespace runs, CJK, emoji).
func randomText(r *rand.Rand, bench string) string {
	frags := []string{"<|im_end|>", "<|im_start|>", "<|im_", "|>", "<|eot_id|>", "<|start_header_id|>",
		"<end_of_turn>", "<start_of_turn>", "<bos>", "<", " ", "  ", "\n", "\n\n", "\t", "\r\n", "数据", "🙂",
		"é", "0123", " the", "<think>", "</think>"}
	var sb strings.Builder
	for n := r.IntN(4); n >= 0; n-- {
		if r.IntN(3) == 0 {
			sb.WriteString(frags[r.IntN(len(frags))])
			continue
		}
		off := r.IntN(len(bench) - 2000)
		sb.WriteString(bench[off : off+r.IntN(600)])
	}
	s := sb.String()
	if r.IntN(10) != 0 {
		s = strings.ToValidUTF8(s, "")
	}
	return s
}

type randomConv struct {
	system string
	msgs   []string
}

type encoded struct {
	prompt string
	ids    []uint32
}

// TestRandomConversationsMatchEncode drives one Model per reference model through random multi-turn
// traffic from several goroutines at once: conversations that grow turn by turn, messages edited in the
// middle of the history, regenerated answers, truncations, exact retries and new conversations sharing a
// system prompt or their first messages with another. Every EncodePrompt result must equal plain Encode,
// and every earlier result must still be intact at the end (the results share memory with the caches).
// It runs with the default caches, with caches small enough to evict constantly, and without the segment
// cache.
func TestRandomConversationsMatchEncode(t *testing.T) {
	bench := benchText(t)
	steps := 250
	if testing.Short() {
		steps = 80
	}
	for _, name := range []string{"qwen3", "llama3_1", "gemma3"} {
		tk := loadTok(t, modelDir(t, name))
		for _, opts := range []Options{{}, {PrefixCacheBytes: prefixShards * 64 << 10, SegmentCacheBytes: segmentShards * 4 << 10}, {SegmentCacheBytes: -1}} {
			t.Run(fmt.Sprintf("%s/%+v", name, opts), func(t *testing.T) {
				t.Parallel()
				randomTraffic(t, tk, layouts[name], NewWithOptions(tk, nil, opts), bench, steps)
			})
		}
	}
}

func randomTraffic(t *testing.T, tk *tokenizer.Tokenizer, render layout, md *Model, bench string, steps int) {
	systems := []string{"You are a helpful assistant.", strings.ToValidUTF8(bench[1000:1700], ""), strings.ToValidUTF8(bench[5000:5400], "")}
	var (
		mu    sync.Mutex
		pool  []randomConv // conversations any goroutine may continue or branch
		saved []encoded
	)
	var wg sync.WaitGroup
	for g := range 3 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g)+1, 42))
			for step := range steps {
				mu.Lock()
				var c randomConv
				switch op := r.IntN(10); {
				case len(pool) == 0 || op == 0: // a new conversation
					c = randomConv{system: systems[r.IntN(len(systems))], msgs: []string{randomText(r, bench)}}
				default:
					c = pool[r.IntN(len(pool))]
					c.msgs = slices.Clone(c.msgs)
					switch op {
					case 1: // edit a message in the middle of the history
						c.msgs[r.IntN(len(c.msgs))] = randomText(r, bench)
					case 2: // regenerate or rewrite the last message
						c.msgs[len(c.msgs)-1] = randomText(r, bench)
					case 3: // truncate
						c.msgs = c.msgs[:1+r.IntN(len(c.msgs))]
					case 4: // a new conversation sharing the first messages
						k := 1 + r.IntN(len(c.msgs))
						c.msgs = append(c.msgs[:k], randomText(r, bench))
					case 5: // retry the same prompt
					default: // the next turn: the assistant's answer and the user's next message
						c.msgs = append(c.msgs, randomText(r, bench), randomText(r, bench))
					}
				}
				if len(c.msgs) > 40 {
					c.msgs = c.msgs[:2]
				}
				pool = append(pool, c)
				mu.Unlock()
				p := render(c.system, c.msgs)
				got, want := md.EncodePrompt(p), tk.Encode(p, false)
				if !slices.Equal(got, want) {
					t.Errorf("goroutine %d step %d (%d messages, %d bytes): EncodePrompt differs from Encode at %d (%d vs %d IDs)",
						g, step, len(c.msgs), len(p), mismatch(got, want), len(got), len(want))
					return
				}
				if cap(got) != len(got) {
					t.Errorf("step %d: result has spare capacity %d (appending could overwrite a shared array)", step, cap(got)-len(got))
				}
				mu.Lock()
				saved = append(saved, encoded{p, got})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for i, s := range saved {
		if !slices.Equal(s.ids, tk.Encode(s.prompt, false)) {
			t.Fatalf("result %d was modified after it was returned", i)
		}
	}
}

func mismatch(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestNextTurnSharesIDs checks the point of the arenas: the next turn of a conversation returns IDs in the
// same array as the previous turn's (no copy), a caller appending to a result gets its own copy, and a
// branch (an edited last message) gets its own array while the original conversation keeps its IDs.
func TestNextTurnSharesIDs(t *testing.T) {
	tk := loadTok(t, modelDir(t, "qwen3"))
	md := New(tk, nil)
	bench := benchText(t)
	msgs := []string{strings.ToValidUTF8(bench[:900], "")}
	render := layouts["qwen3"]
	first := md.EncodePrompt(render("sys", msgs))
	prev, shared := first, 0
	for k := range 6 {
		msgs = append(msgs, strings.ToValidUTF8(bench[1000+k*700:1300+k*700], ""), strings.ToValidUTF8(bench[1300+k*700:1700+k*700], ""))
		p := render("sys", msgs)
		ids := md.EncodePrompt(p)
		if !slices.Equal(ids, tk.Encode(p, false)) {
			t.Fatalf("turn %d differs from Encode", k)
		}
		if cap(ids) != len(ids) {
			t.Fatalf("turn %d: cap %d != len %d", k, cap(ids), len(ids))
		}
		if &ids[0] == &prev[0] {
			shared++
		}
		prev = ids
	}
	// About 1,000 IDs were added: the arena grew once or twice (it keeps a quarter, at least 1024 IDs,
	// spare), every other turn appended in place.
	if shared < 4 {
		t.Errorf("%d of 6 turns extended the previous turn's array in place, want >= 4", shared)
	}
	// Appending to a result must not touch the arena the next turn appends to.
	mine := append(prev, 1, 2, 3)
	mine[0] = 0 // the caller's own copy
	branch := slices.Clone(msgs)
	branch[len(branch)-1] = "an edited last message"
	p := render("sys", branch)
	if got := md.EncodePrompt(p); !slices.Equal(got, tk.Encode(p, false)) {
		t.Fatal("branch differs from Encode")
	}
	p = render("sys", msgs)
	if got := md.EncodePrompt(p); !slices.Equal(got, tk.Encode(p, false)) || !slices.Equal(prev, got) || &got[0] != &prev[0] {
		t.Fatal("the original conversation's IDs changed or were copied")
	}
}

// TestProbeEnds checks the candidate positions a lookup tries: the ends of the learned end tokens from the
// prompt's end backwards (several tokens interleaved, none below minPrefix), and every added-token end
// once more than maxEndTokens end tokens were learned; lookups stay exact in both modes.
func TestProbeEnds(t *testing.T) {
	tk := loadTok(t, modelDir(t, "qwen3"))
	c := newPrefixCache(1 << 20)
	c.noteEnd("<|im_start|>")
	c.noteEnd("<|im_end|>")
	c.noteEnd("<|im_start|>") // already known
	if l := *c.ends.Load(); len(l) != 2 {
		t.Fatalf("ends = %q", l)
	}
	prompt := strings.Repeat("x", 300) + "<|im_start|>a<|im_end|>b<|im_start|><|im_start|>c" + "<|im_end|>"
	var got []int
	c.probeEnds(prompt, tk.AddedTokenEnds, func(p int) bool { got = append(got, p); return true })
	var want []int
	for p := len(prompt); p >= minPrefix; p-- {
		if strings.HasSuffix(prompt[:p], "<|im_start|>") || strings.HasSuffix(prompt[:p], "<|im_end|>") {
			want = append(want, p)
		}
	}
	if !slices.Equal(got, want) || len(want) != 5 {
		t.Fatalf("probed %v, want %v", got, want)
	}
	for i := range maxEndTokens {
		c.noteEnd(fmt.Sprintf("<tok%d>", i))
	}
	if !c.manyEnds.Load() {
		t.Fatal("manyEnds not set")
	}
	got = got[:0]
	c.probeEnds(prompt, tk.AddedTokenEnds, func(p int) bool { got = append(got, p); return true })
	if !slices.Equal(got, want) { // the same ends: both are added tokens of Qwen3
		t.Fatalf("fallback probed %v, want %v", got, want)
	}
	// A Model whose cache fell back still finds the previous turn.
	md := New(tk, nil)
	md.prefixes.manyEnds.Store(true)
	bench := benchText(t)
	msgs := []string{strings.ToValidUTF8(bench[:900], "")}
	first := md.EncodePrompt(layouts["qwen3"]("sys", msgs))
	msgs = append(msgs, "an answer", "a question")
	p := layouts["qwen3"]("sys", msgs)
	if ids := md.EncodePrompt(p); !slices.Equal(ids, tk.Encode(p, false)) || &ids[0] != &first[0] {
		t.Fatal("fallback lookup missed the previous turn or differs from Encode")
	}
}

// FuzzEncodePromptTurns encodes a two-turn conversation whose messages are the fuzz inputs (any bytes,
// delimiters included) through one Model, then the first turn again: each result must equal plain Encode,
// and the first result must be intact after the second call appended to the shared arena. The committed
// seed corpus is in testdata/fuzz/FuzzEncodePromptTurns.
func FuzzEncodePromptTurns(f *testing.F) {
	tk := loadTok(f, modelDir(f, "qwen3"))
	md := New(tk, nil)
	long := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 8)
	f.Add("hello", "world", "again")
	f.Add(long, " leading space", "\n\nnewlines")
	f.Add(long+"<|im_end|>", "<|im_start|>user\n", "<|im_")
	f.Add(long+"\xff\xfe", "数据🙂", "")
	render := layouts["qwen3"]
	f.Fuzz(func(t *testing.T, a, b, c string) {
		p1 := render(long, []string{a})
		p2 := render(long, []string{a, b, c})
		ids1 := md.EncodePrompt(p1)
		ids2 := md.EncodePrompt(p2)
		want1 := tk.Encode(p1, false)
		if !slices.Equal(ids1, want1) {
			t.Fatalf("first turn differs from Encode")
		}
		if !slices.Equal(ids2, tk.Encode(p2, false)) {
			t.Fatalf("second turn differs from Encode")
		}
		if again := md.EncodePrompt(p1); !slices.Equal(again, want1) || !slices.Equal(ids1, want1) {
			t.Fatalf("first turn changed after the second")
		}
	})
}

// TestPrefixKeyHeadAndTail: prompts of one length that differ only in their opening (a fixed instruction
// after a variable question) get keys of their own, so a lookup compares against its own entry only; the
// tail alone gave them one key. A conversation's turns (same opening, other endings) differ as before.
func TestPrefixKeyHeadAndTail(t *testing.T) {
	c := newPrefixCache(1 << 20)
	tail := strings.Repeat("Answer in one sentence and cite the source. ", 20)
	seen := map[uint64]string{}
	for i := range 1000 {
		p := fmt.Sprintf("Question %04d: ", i) + tail
		k := c.key(p, len(p), c.headHash(p))
		if q, dup := seen[k]; dup {
			t.Fatalf("%q and %q share key %x", q[:14], p[:14], k)
		}
		seen[k] = p
	}
	a, b := strings.Repeat("y", 300)+"turn one", strings.Repeat("y", 300)+"turn two"
	if c.key(a, len(a), c.headHash(a)) == c.key(b, len(b), c.headHash(b)) {
		t.Fatal("turns with other endings share a key")
	}
	if c.key(a, 300, c.headHash(a)) != c.key(b, 300, c.headHash(b)) || c.key(a, 300, c.headHash(a)) != c.key(a[:300], 300, c.headHash(a[:300])) {
		t.Fatal("one prefix, two keys")
	}
}
