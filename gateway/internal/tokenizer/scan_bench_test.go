package tokenizer

import "testing"

// BenchmarkScan runs the pre-tokenizer scanners alone over the benchmark text (no BPE, no cache).
func BenchmarkScan(b *testing.B) {
	text := readBench(b)
	for _, sc := range []struct {
		name string
		each func(string, bool, func(string, bool))
	}{{"gpt", (&gptScanner{maxDigits: 3}).each}, {"deepseek", deepseekScanner{}.each}} {
		b.Run(sc.name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			n := 0
			for b.Loop() {
				sc.each(text, true, func(string, bool) { n++ })
			}
		})
	}
}
