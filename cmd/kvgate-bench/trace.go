package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"
)

// MooncakeBlockTokens is the block size of the Mooncake traces' hash_ids: each ID names 512 tokens.
const MooncakeBlockTokens = 512

// traceRecord is one line of a Mooncake-format trace (github.com/kvcache-ai/Mooncake, FAST25-release):
// arrival time in milliseconds, prompt and output lengths in tokens, and the remapped hash of each
// 512-token block of the prompt (equal IDs at equal positions mean equal prefixes).
type traceRecord struct {
	Timestamp    int64   `json:"timestamp"`
	InputLength  int     `json:"input_length"`
	OutputLength int     `json:"output_length"`
	HashIDs      []int64 `json:"hash_ids"`
}

// readTrace parses a JSONL trace; blank lines are skipped; a bad line is an error naming its number.
func readTrace(r io.Reader) ([]traceRecord, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	var out []traceRecord
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var rec traceRecord
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rec); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", n, err)
		}
		if rec.InputLength < 1 || rec.OutputLength < 0 || rec.Timestamp < 0 {
			return nil, fmt.Errorf("trace line %d: input_length %d, output_length %d, timestamp %d",
				n, rec.InputLength, rec.OutputLength, rec.Timestamp)
		}
		if need := (rec.InputLength + MooncakeBlockTokens - 1) / MooncakeBlockTokens; len(rec.HashIDs) != need {
			return nil, fmt.Errorf("trace line %d: %d hash_ids for %d input tokens (want %d)", n,
				len(rec.HashIDs), rec.InputLength, need)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("trace: no records")
	}
	return out, nil
}

func readTraceFile(path string) ([]traceRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readTrace(f)
}

// traceWorkload turns records into completions requests: hash ID h becomes blockTokens one-token words
// drawn from a generator seeded by (seed, h), so equal IDs give equal text and equal tokens wherever they
// appear; the last block is cut to the prompt's scaled length. Lengths scale by blockTokens/512, output
// lengths too (at least 1, at most maxOutput); timestamps are kept (the load generator rescales them).
func traceWorkload(src *textSource, recs []traceRecord, blockTokens, maxOutput int, seed uint64, limit int) *workload {
	scale := float64(blockTokens) / MooncakeBlockTokens
	if limit > 0 && len(recs) > limit {
		recs = recs[:limit]
	}
	blocks := map[int64]string{}
	block := func(h int64) string {
		if s, ok := blocks[h]; ok {
			return s
		}
		r := rand.New(rand.NewPCG(seed, uint64(h)))
		words := make([]string, blockTokens)
		for i := range words {
			words[i] = src.words[r.IntN(len(src.words))]
		}
		s := strings.Join(words, "")
		blocks[h] = s
		return s
	}
	t0 := recs[0].Timestamp
	ss := make([]session, len(recs))
	var in, out int
	for i, rec := range recs {
		tokens := max(1, int(math.Round(float64(rec.InputLength)*scale)))
		var b strings.Builder
		for j, h := range rec.HashIDs {
			text := block(h)
			if j == len(rec.HashIDs)-1 {
				last := min(max(tokens-j*blockTokens, 1), blockTokens)
				text = cutWords(text, last)
			}
			b.WriteString(text)
		}
		o := min(max(1, int(math.Round(float64(rec.OutputLength)*scale))), maxOutput)
		ss[i] = session{At: time.Duration(rec.Timestamp-t0) * time.Millisecond, Group: int(rec.HashIDs[0]) + 1,
			Turns: []turn{{User: b.String(), MaxTokens: o}}}
		in += tokens
		out += o
	}
	span := time.Duration(recs[len(recs)-1].Timestamp-t0) * time.Millisecond
	return &workload{Name: "trace", Sessions: ss, Timed: true,
		Desc: fmt.Sprintf("%d trace requests over %.0f s of trace time, 512-token blocks scaled to %d tokens (mean prompt %d, mean output %d tokens)",
			len(recs), span.Seconds(), blockTokens, in/len(recs), out/len(recs))}
}

// cutWords returns the first n words of a text of words that each start with a space.
func cutWords(s string, n int) string {
	seen := 0
	for i := 0; i < len(s); i++ {
		if s[i] == ' ' {
			if seen == n {
				return s[:i]
			}
			seen++
		}
	}
	return s
}

// traceShape parametrizes a generated Mooncake-format trace: conversations that start at Poisson times
// (Rate per second), open with one of Systems shared system prompts (Zipf-like popularity, 2–SystemBlocks
// blocks), and grow by 1–TurnBlocks blocks (the previous answer and a new question) over up to Turns turns
// ThinkMS apart.
type traceShape struct {
	Requests, Systems, SystemBlocks, Turns, TurnBlocks int
	Rate                                               float64
	ThinkMS                                            int
}

var (
	traceGenFull  = traceShape{Requests: 400, Systems: 24, SystemBlocks: 10, Turns: 6, TurnBlocks: 3, Rate: 1, ThinkMS: 20000}
	traceGenQuick = traceShape{Requests: 80, Systems: 6, SystemBlocks: 8, Turns: 4, TurnBlocks: 2, Rate: 1, ThinkMS: 8000}
)

// generateTrace writes a Mooncake-format trace of sh (seeded) in timestamp order.
func generateTrace(sh traceShape, seed uint64) []traceRecord {
	r := rand.New(rand.NewPCG(seed, 0xd))
	next := int64(0)
	id := func(n int) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = next
			next++
		}
		return out
	}
	systems := make([][]int64, sh.Systems)
	weights := make([]float64, sh.Systems)
	var wsum float64
	for i := range systems {
		systems[i] = id(2 + r.IntN(max(sh.SystemBlocks-1, 1)))
		weights[i] = 1 / math.Pow(float64(i+1), 0.8)
		wsum += weights[i]
	}
	var recs []traceRecord
	var t float64 // ms
	for len(recs) < sh.Requests {
		t += -math.Log(1-r.Float64()) / sh.Rate * 1000
		x := r.Float64() * wsum
		k := 0
		for ; k < sh.Systems-1 && x > weights[k]; k++ {
			x -= weights[k]
		}
		ids := append([]int64(nil), systems[k]...)
		at := t
		turns := 1 + r.IntN(sh.Turns)
		for range turns {
			ids = append(ids, id(1+r.IntN(sh.TurnBlocks))...)
			in := (len(ids)-1)*MooncakeBlockTokens + 1 + r.IntN(MooncakeBlockTokens)
			recs = append(recs, traceRecord{Timestamp: int64(at), InputLength: in, OutputLength: 20 + r.IntN(400),
				HashIDs: append([]int64(nil), ids...)})
			at += float64(sh.ThinkMS/2 + r.IntN(sh.ThinkMS+1))
		}
	}
	// Timestamp order, as the public traces are.
	slices.SortStableFunc(recs, func(a, b traceRecord) int { return cmp.Compare(a.Timestamp, b.Timestamp) })
	return recs[:sh.Requests]
}

// writeTrace writes records as JSONL.
func writeTrace(w io.Writer, recs []traceRecord) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for _, rec := range recs {
		if err := enc.Encode(rec); err != nil {
			return err
		}
	}
	return bw.Flush()
}
