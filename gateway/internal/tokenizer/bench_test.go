package tokenizer

import (
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU returns the CPU time the calling OS thread has used. The one-core benchmarks lock their
// goroutine to a thread and report tokens per thread-CPU-second ("tok/cpu-s") beside wall-clock tok/s:
// on a shared machine the wall clock also counts the time other processes held the core.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// Benchmarks on the 1 MB bench text (testdata/goldens/bench.txt.gz). tok/s is reported per run; on one
// core unless the name says Parallel. Run: go test -run '^$' -bench . -benchtime 10x ./gateway/internal/tokenizer

// processCPU returns the CPU time (user+system) the whole process has used, all threads and GC included.
func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkLoad measures Load of Qwen3's 11 MB tokenizer.json and of the gzipped demo copy.
func BenchmarkLoad(b *testing.B) {
	dirs := map[string]string{
		"qwen3":    modelDir(b, "qwen3"),
		"qwen3-gz": filepath.Join(repoRoot(b), "examples", "models", "qwen3"),
		"llama3_1": modelDir(b, "llama3_1"),
	}
	for _, name := range []string{"qwen3", "qwen3-gz", "llama3_1"} {
		b.Run(name, func(b *testing.B) {
			c0 := processCPU()
			for b.Loop() {
				if _, err := Load(dirs[name]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((processCPU()-c0).Milliseconds())/float64(b.N), "cpu-ms/op")
		})
	}
}

// warmTexts is the "different text" the warm benchmarks fill the word cache from: the golden corpus and
// fuzz strings, never the bench text itself.
func warmTexts(b *testing.B) []string {
	var out []string
	for _, f := range []string{"corpus.jsonl", "fuzz.jsonl"} {
		for _, c := range readJSONL[corpusCase](b, filepath.Join("testdata", "goldens", f)) {
			out = append(out, c.Text)
		}
	}
	return out
}

func BenchmarkEncode(b *testing.B) {
	bench := readBench(b)
	warm := warmTexts(b)
	for _, m := range []string{"qwen3", "llama3_1", "deepseek_v3"} {
		tk := loadModel(b, m)
		n := len(tk.Encode(bench, false))
		b.Run(m+"/cold", func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.SetBytes(int64(len(bench)))
			var cpu time.Duration
			for b.Loop() {
				b.StopTimer()
				tk.ResetCache()
				b.StartTimer()
				c0 := threadCPU()
				tk.Encode(bench, false)
				cpu += threadCPU() - c0
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
			b.ReportMetric(float64(n)*float64(b.N)/cpu.Seconds(), "tok/cpu-s")
		})
		b.Run(m+"/warm", func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.SetBytes(int64(len(bench)))
			var cpu time.Duration
			for b.Loop() {
				b.StopTimer()
				tk.ResetCache()
				for _, w := range warm {
					tk.Encode(w, false)
				}
				b.StartTimer()
				c0 := threadCPU()
				tk.Encode(bench, false)
				cpu += threadCPU() - c0
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
			b.ReportMetric(float64(n)*float64(b.N)/cpu.Seconds(), "tok/cpu-s")
		})
		// Parallel: ~4 KB chunks (cut at line ends, as the HF side-by-side script does) encoded from all
		// GOMAXPROCS goroutines at once; the word cache is shared and in steady state.
		chunks := chunk(bench, 4000)
		b.Run(m+"/parallel", func(b *testing.B) {
			b.SetBytes(int64(len(bench)))
			c0 := processCPU()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					for _, c := range chunks {
						tk.Encode(c, false)
					}
				}
			})
			// tok/cpu-s close to the one-core figure means the goroutines do not slow each other down
			// (no lock, no shared writes on the hot path): throughput scales with the cores you give it.
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
			b.ReportMetric(float64(n)*float64(b.N)/(processCPU()-c0).Seconds(), "tok/cpu-s")
		})
	}
}

// chunk cuts text after line ends into pieces of just over size bytes.
func chunk(text string, size int) []string {
	var out []string
	var cur strings.Builder
	for _, l := range strings.SplitAfter(text, "\n") {
		cur.WriteString(l)
		if cur.Len() > size {
			out = append(out, cur.String())
			cur.Reset()
		}
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}
