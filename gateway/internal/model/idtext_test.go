package model

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"unsafe"
	"weak"

	"github.com/kvgate/kvgate/gateway/internal/openai"
)

// idTextTraffic encodes random conversations (next turns, retries, edits, truncations) and completions
// prompts, and checks that AppendIDsJSON of every result is openai.AppendIDs's text, then again for every
// earlier result at the end (the cached texts must not go stale).
func idTextTraffic(t *testing.T, md *Model, bench string, seed uint64, steps int) {
	r := rand.New(rand.NewPCG(seed, 11))
	render := layouts["qwen3"]
	type conv struct{ msgs []string }
	var convs []conv
	var results [][]uint32
	check := func(step int, ids []uint32) {
		got, want := md.AppendIDsJSON([]byte("x"), ids, openai.AppendIDs), openai.AppendIDs([]byte("x"), ids)
		if !bytes.Equal(got, want) {
			t.Fatalf("seed %d step %d: AppendIDsJSON of %d IDs differs from AppendIDs", seed, step, len(ids))
		}
	}
	for step := range steps {
		var c conv
		switch op := r.IntN(8); {
		case len(convs) == 0 || op == 0:
			c = conv{msgs: []string{randomText(r, bench)}}
		default:
			c = convs[r.IntN(len(convs))]
			c.msgs = slices.Clone(c.msgs)
			switch op {
			case 1:
				c.msgs[r.IntN(len(c.msgs))] = randomText(r, bench)
			case 2:
				c.msgs = c.msgs[:1+r.IntN(len(c.msgs))]
			case 3:
			default:
				c.msgs = append(c.msgs, randomText(r, bench), randomText(r, bench))
			}
		}
		if len(c.msgs) > 30 {
			c.msgs = c.msgs[:2]
		}
		convs = append(convs, c)
		p := render("You are a helpful assistant.", c.msgs)
		var ids []uint32
		if r.IntN(3) == 0 {
			ids = md.EncodeCompletion(p)
		} else {
			ids = md.EncodePrompt(p)
		}
		check(step, ids)
		if r.IntN(4) == 0 {
			check(step, ids) // the same IDs again: the whole text from the cache
		}
		results = append(results, ids)
	}
	for i, ids := range results {
		check(steps+i, ids)
	}
}

// TestAppendIDsJSONMatches: AppendIDsJSON equals openai.AppendIDs over random traffic, with the default
// cache, one small enough to evict constantly, none, and from four goroutines on one Model (-race).
func TestAppendIDsJSONMatches(t *testing.T) {
	bench := benchText(t)
	tk := loadTok(t, modelDir(t, "qwen3"))
	for _, limit := range []int{0, 16 << 10, -1} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			idTextTraffic(t, NewWithOptions(tk, nil, Options{IDTextCacheBytes: limit}), bench, uint64(limit&0xff)+1, 300)
		})
	}
	t.Run("concurrent", func(t *testing.T) {
		md := NewWithOptions(tk, nil, Options{IDTextCacheBytes: 256 << 10})
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() { idTextTraffic(t, md, bench, uint64(g%2), 80) })
		}
		wg.Wait()
	})
}

// TestAppendIDsJSONNextTurnExtends: the next turn of a conversation (a longer view of the same ID
// array) extends the cached text of the previous one instead of adding an entry; the cache stays within
// its limit.
func TestAppendIDsJSONNextTurnExtends(t *testing.T) {
	bench := benchText(t)
	tk := loadTok(t, modelDir(t, "qwen3"))
	md := NewWithOptions(tk, nil, Options{})
	render := layouts["qwen3"]
	msgs := []string{bench[:40000]} // ~10k tokens: the arena has room for the turns below
	prev := md.EncodePrompt(render("sys", msgs))
	md.AppendIDsJSON(nil, prev, openai.AppendIDs)
	for i := range 5 {
		msgs = append(msgs, bench[40000+i*1000:40500+i*1000], bench[40500+i*1000:41000+i*1000])
		ids := md.EncodePrompt(render("sys", msgs))
		if &ids[0] != &prev[0] {
			t.Fatal("the arena was reallocated; the test assumes an in-place extension")
		}
		if got := md.AppendIDsJSON(nil, ids, openai.AppendIDs); !bytes.Equal(got, openai.AppendIDs(nil, ids)) {
			t.Fatal("text differs")
		}
		c := md.idText.c
		e, found := c.Get(weak.Make(unsafe.SliceData(ids)), nil)
		entries := c.Len()
		used, _ := c.Bytes()
		if !found || e.n != len(ids) || entries != 1 || used > c.ShardLimit() {
			t.Fatalf("turn %d: entry %v, %d entries, %d bytes: the cached text was not extended", i, found, entries, used)
		}
		prev = ids
	}
}
