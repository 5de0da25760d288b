package model

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvgate/kvgate/gateway/internal/tokenizer"
)

// processCPU returns the CPU time the process has used (all threads, GC included); the benchmarks report
// cpu-µs/op beside wall time because the machine they run on is shared.
func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportCPU(b *testing.B, c0 time.Duration) {
	b.ReportMetric(float64((processCPU()-c0).Microseconds())/float64(b.N), "cpu-µs/op")
}

// BenchmarkMultiTurn measures one turn of a ~32k-token multi-turn conversation (Qwen3, ChatML layout):
//   - next-turn: 32 conversations of ~32k tokens take turns growing by one assistant reply and one user
//     question (~1.5 KB of new text, different on every iteration); each prompt goes through EncodePrompt
//     after the previous turn's prompt of the same conversation did. With -benchtime 1000x each grows by
//     about 31 turns (32k to ~43k tokens). The timed loop also builds the prompt string (measured alone by
//     "next-turn-build"); "next-turn-new-text" encodes only the text each turn added, the lower bound;
//   - regenerate: the same ~32k-token conversation with its last message replaced on every iteration (a
//     branch off the same cached prefix, as when a user regenerates or edits the last message); the timed
//     loop also builds the prompt string (measured alone by "build-prompt");
//   - uncached: the same prompt with plain Encode (word cache only);
//   - new-text-only: the replaced last message's text alone, the lower bound for "regenerate".
//
// next-turn, next-turn-new-text and regenerate also report p50-µs/encode, the median wall time of the
// encode call alone (cpu-µs/op averages everything, the prompt building, arena growth, branch copies and
// the garbage collector included).
func BenchmarkMultiTurn(b *testing.B) {
	tk := loadTok(b, modelDir(b, "qwen3"))
	turns := conversation(b, tk, 1500, 32000)
	prev := turns[:len(turns)-1]
	last := turns[len(turns)-1]
	full := chatML(turns)
	b.Logf("%d turns, %d tokens in the last prompt, %d in its new turn", len(turns),
		len(tk.Encode(full, false)), len(tk.Encode(last, false)))
	prevPrompt := chatML(prev)
	head := strings.TrimSuffix(prevPrompt, "<|im_start|>assistant\n")
	role := "user"
	if len(prev)%2 == 1 {
		role = "assistant"
	}
	prompt := func(i int) string {
		return head + "<|im_start|>" + role + "\n" + last + strconv.Itoa(i) + "<|im_end|>\n<|im_start|>assistant\n"
	}
	if prompt(0) != chatML(append(prev[:len(prev):len(prev)], last+"0")) {
		b.Fatal("prompt builder disagrees with chatML")
	}
	b.Run("next-turn", func(b *testing.B) { benchNextTurn(b, md0(tk), full, false) })
	b.Run("next-turn-build", func(b *testing.B) { benchNextTurn(b, nil, full, false) })
	b.Run("next-turn-new-text", func(b *testing.B) { benchNextTurn(b, md0(tk), full, true) })
	b.Run("regenerate", func(b *testing.B) {
		md := New(tk, nil)
		md.EncodePrompt(prevPrompt) // the gateway saw the previous turn
		b.SetBytes(int64(len(full)))
		var calls []time.Duration
		i := 0
		c0 := processCPU()
		for b.Loop() {
			i++
			p := prompt(i)
			t0 := time.Now()
			md.EncodePrompt(p)
			calls = append(calls, time.Since(t0))
		}
		reportCPU(b, c0)
		reportMedian(b, calls)
	})
	b.Run("build-prompt", func(b *testing.B) {
		i := 0
		c0 := processCPU()
		for b.Loop() {
			i++
			_ = prompt(i)
		}
		reportCPU(b, c0)
	})
	b.Run("uncached", func(b *testing.B) {
		b.SetBytes(int64(len(full)))
		c0 := processCPU()
		for b.Loop() {
			tk.Encode(full, false)
		}
		reportCPU(b, c0)
	})
	b.Run("new-text-only", func(b *testing.B) {
		i := 0
		c0 := processCPU()
		for b.Loop() {
			i++
			tk.Encode(last+strconv.Itoa(i), false)
		}
		reportCPU(b, c0)
	})
}

func md0(tk *tokenizer.Tokenizer) *Model { return New(tk, nil) }

// benchNextTurn runs the "next-turn" benchmarks on conversations built from base (a ChatML prompt ending
// with the generation prompt): with md, each iteration encodes one conversation's next prompt through
// md.EncodePrompt (newTextOnly: encodes only the text the turn added, with the tokenizer); with a nil md it
// only builds the prompts.
func benchNextTurn(b *testing.B, md *Model, base string, newTextOnly bool) {
	const lanes = 32
	text := benchText(b)
	var snippets []string
	for off := len(text) / 2; len(snippets) < 64; off += 750 {
		snippets = append(snippets, strings.ToValidUTF8(text[off:off+750], ""))
	}
	prompts := make([]string, lanes)
	for j := range prompts {
		prompts[j] = strings.Replace(base, "You are a helpful assistant.", "You are a helpful assistant ("+strconv.Itoa(j)+").", 1)
		if md != nil {
			md.EncodePrompt(prompts[j])
		}
	}
	tk := (*tokenizer.Tokenizer)(nil)
	if md != nil {
		tk = md.Tokenizer()
	}
	b.SetBytes(int64(len(base)))
	var calls []time.Duration // wall time of each encode, for the median
	i := 0
	c0 := processCPU()
	for b.Loop() {
		i++
		j := i % lanes
		added := snippets[i%len(snippets)] + strconv.Itoa(i) + "<|im_end|>\n<|im_start|>user\n" +
			snippets[(i+7)%len(snippets)] + strconv.Itoa(i) + "<|im_end|>\n<|im_start|>assistant\n"
		switch {
		case md == nil:
			prompts[j] += added
		case newTextOnly:
			t0 := time.Now()
			tk.Encode(added, false)
			calls = append(calls, time.Since(t0))
		default:
			prompts[j] += added
			t0 := time.Now()
			md.EncodePrompt(prompts[j])
			calls = append(calls, time.Since(t0))
		}
	}
	reportCPU(b, c0)
	reportMedian(b, calls)
}

// reportMedian reports the median of the timed encode calls as p50-µs/encode: without the prompt building,
// the spikes of a shared machine, nor the occasional arena growth or branch copy (amortized in cpu-µs/op).
func reportMedian(b *testing.B, calls []time.Duration) {
	if len(calls) > 0 {
		slices.Sort(calls)
		b.ReportMetric(float64(calls[len(calls)/2].Nanoseconds())/1e3, "p50-µs/encode")
	}
}

// BenchmarkEncodeChat renders and encodes reference chat requests end to end (Qwen3 template + tokenizer),
// the per-request cost EncodeChat adds in the gateway.
func BenchmarkEncodeChat(b *testing.B) {
	md, err := Load(modelDir(b, "qwen3"))
	if err != nil {
		b.Fatal(err)
	}
	var convs []refConversation
	raw, err := os.ReadFile(filepath.Join(chatGoldens, "conversations.json"))
	if err != nil {
		b.Fatal(err)
	}
	if err := json.Unmarshal(raw, &convs); err != nil {
		b.Fatal(err)
	}
	for _, c := range convs {
		if c.Name != "multi_turn" && c.Name != "tools_call" {
			continue
		}
		body := requestBody(b, c)
		b.Run(c.Name, func(b *testing.B) {
			c0 := processCPU()
			for b.Loop() {
				if _, _, err := md.EncodeChat(body); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, c0)
		})
	}
}
