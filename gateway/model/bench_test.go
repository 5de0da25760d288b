package model

import (
	"strconv"
	"testing"
)

// BenchmarkMultiTurn measures one turn of a ~32k-token multi-turn conversation (Qwen3, ChatML layout):
//   - cached: the whole prompt through EncodePrompt with the segment cache holding the earlier turns (the
//     new turn's text differs on every iteration, so it is always encoded);
//   - uncached: the same prompt with plain Encode (word cache only);
//   - new-text-only: the new turn's text alone, the lower bound.
func BenchmarkMultiTurn(b *testing.B) {
	tk := loadTok(b, modelDir(b, "qwen3"))
	turns := conversation(b, tk, 1500, 32000)
	prev := turns[:len(turns)-1]
	last := turns[len(turns)-1]
	full := chatML(turns)
	b.Logf("%d turns, %d tokens in the last prompt, %d in its new turn", len(turns),
		len(tk.Encode(full, false)), len(tk.Encode(last, false)))
	md := New(tk, nil)
	md.EncodePrompt(chatML(prev))
	b.Run("cached", func(b *testing.B) {
		b.SetBytes(int64(len(full)))
		i := 0
		for b.Loop() {
			b.StopTimer()
			i++
			p := chatML(append(prev[:len(prev):len(prev)], last+strconv.Itoa(i)))
			b.StartTimer()
			md.EncodePrompt(p)
		}
	})
	b.Run("uncached", func(b *testing.B) {
		b.SetBytes(int64(len(full)))
		for b.Loop() {
			tk.Encode(full, false)
		}
	})
	b.Run("new-text-only", func(b *testing.B) {
		i := 0
		for b.Loop() {
			b.StopTimer()
			i++
			s := last + strconv.Itoa(i)
			b.StartTimer()
			tk.Encode(s, false)
		}
	})
}
