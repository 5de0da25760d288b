package kvstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
)

// BenchmarkRedisMatchShapes times one Match of a 128-block prompt on a real redis-server, per index layout
// and shape, with 16 endpoints registered under the model:
//   - hit: the prompt is held whole by 2 endpoints;
//   - partial: its first 8 blocks (a shared system prompt) are held by every endpoint, the rest is new each
//     call (a fresh conversation behind a known system prompt);
//   - miss: a prompt nobody has seen (a new block 0 each call).
//
// It reports p50/p99 wall time, Redis CPU per call (INFO cpu) and Redis commands per call (INFO
// commandstats), so an old and a new build can be compared side by side:
//
//	go test -run '^$' -bench RedisMatchShapes -benchtime 2000x ./kvstore/
func BenchmarkRedisMatchShapes(b *testing.B) {
	for _, layout := range []int{1, 2} {
		for _, shape := range []string{"hit", "partial", "miss"} {
			b.Run(fmt.Sprintf("layout%d/%s", layout, shape), func(b *testing.B) { benchMatchShape(b, layout, shape) })
		}
	}
}

func benchMatchShape(b *testing.B, layout int, shape string) {
	ctx := context.Background()
	srv := redistest.Start(b)
	c := srv.Client(b)
	idx, err := kvstore.NewRedisIndex(c, kvstore.RedisConfig{Prefix: "shapes", IndexLayout: layout})
	if err != nil {
		b.Fatal(err)
	}
	defer idx.Close()
	const nEP, sysBlocks = 16, 8
	h := kvstore.Hasher{Seed: 1}
	prompt := func(sys, tail uint32) []kvstore.BlockKey { return sysPromptKeys(h, sysBlocks, sys, tail) }
	add := func(ep kvstore.EndpointID, ks []kvstore.BlockKey) { addGPU(b, idx, ep, ks) }
	// Every endpoint holds 64 prompts of its own (the fleet's other traffic), and the system prompt's blocks.
	sys := prompt(7, 1<<30)[:sysBlocks]
	for e := range nEP {
		ep := benchEP(e)
		for p := range 64 {
			add(ep, prompt(uint32(1000+e*64+p), uint32(e*64+p)<<12))
		}
		add(ep, sys)
	}
	hit := prompt(7, 5<<20)
	add(benchEP(0), hit)
	add(benchEP(1), hit)
	var lat p50
	calls0 := totalCommandCalls(b, c)
	cpu0 := redisCPU(b, c)
	i := uint32(0)
	for b.Loop() {
		var ks []kvstore.BlockKey
		want := 0
		switch shape {
		case "hit":
			ks, want = hit, 128
		case "partial":
			ks, want = prompt(7, 9<<20+i<<12), sysBlocks
		case "miss":
			ks = prompt(1<<20+i, 1<<29+i<<12)
		}
		i++
		t0 := time.Now()
		m, err := idx.Match(ctx, "m", ks)
		lat.add(time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		best := 0
		for _, e := range m {
			best = max(best, e.GPUBlocks)
		}
		if best != want {
			b.Fatalf("%s: longest run %d, want %d (%+v)", shape, best, want, m)
		}
	}
	cpu := redisCPU(b, c) - cpu0
	calls := totalCommandCalls(b, c) - calls0 - 2 // the two INFOs of the figures themselves
	b.ReportMetric(cpu/float64(b.N)*1e6, "redis-cpu-µs/op")
	b.ReportMetric(float64(calls)/float64(b.N), "cmds/op")
	lat.report(b)
}

// totalCommandCalls is the sum of calls over INFO commandstats.
func totalCommandCalls(b *testing.B, c *redis.Client) int64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		if _, rest, ok := strings.Cut(line, ":calls="); ok {
			var x int64
			fmt.Sscanf(rest, "%d", &x)
			n += x
		}
	}
	return n
}
