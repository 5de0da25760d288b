package main

// --mode redis: what one Redis costs the fleet (issue 14). See README.md, "Redis".

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/cmd/kvgate-bench/harness"
	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/kvevents"
)

// Targets of issue 14.
const (
	targetRedisFresh    = 300 * time.Microsecond
	targetRedisRepeated = 100 * time.Microsecond
	targetIngestPerBlk  = 2 * time.Microsecond
	targetBytesPerHold  = 120
	targetLongestCall   = 5 * time.Millisecond
)

// redisFlags are --mode redis's own flags (registered by addRedisFlags).
var redisFlags struct {
	promptTokens int
	repeatSet    int
	clearBlocks  int
	layouts      string
	layout       int // the layout being measured (gateway store.index_layout, the replay's and flood's index)
}

func addRedisFlags(fs *flag.FlagSet) {
	fs.IntVar(&redisFlags.promptTokens, "redis-prompt-tokens", 2000, "redis: tokens of each chat prompt (cut from the bench text)")
	fs.IntVar(&redisFlags.repeatSet, "redis-repeat-set", 10, "redis: distinct prompts the repeated phase cycles through")
	fs.IntVar(&redisFlags.clearBlocks, "redis-clear-blocks", 100000, "redis: blocks of one endpoint written, then cleared, to find the longest Redis call (0: skip)")
	fs.StringVar(&redisFlags.layouts, "redis-layouts", "2", "redis: index layouts to measure one after the other, each with its own redis-server, engine and gateway (comma-separated: 1 is the layout of releases before layout 2)")
}

// redisPhase is one measured phase of --mode redis.
type redisPhase struct {
	Name                string
	Requests            int
	PromptTokens        int64
	CachedTokens        int64 // means over the phase's answers
	RedisCPU, GatewayCP time.Duration
	P50, P99            time.Duration
	Commands            []cmdStat // per request
	Reads               float64   // Redis read events processed per request (INFO stats total_reads_processed): round trips
}

// cmdStat is one INFO commandstats line divided by the phase's requests.
type cmdStat struct {
	Name       string
	Calls, Use float64 // calls and µs per request
}

// slowest is the longest Redis call seen in SLOWLOG.
type slowest struct {
	Dur  time.Duration
	Args string
}

func (b *bench) redisScale(ctx context.Context) error {
	text, err := readBenchText(b.root)
	if err != nil {
		return err
	}
	var layouts []int
	for _, f := range strings.Split(redisFlags.layouts, ",") {
		l, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || l < 1 || l > 2 {
			return fmt.Errorf("redis: --redis-layouts %q: want 1 and/or 2", redisFlags.layouts)
		}
		layouts = append(layouts, l)
	}
	for _, l := range layouts {
		redisFlags.layout = l
		if err := b.redisScaleLayout(ctx, text); err != nil {
			return fmt.Errorf("redis: layout %d: %w", l, err)
		}
	}
	return nil
}

// redisScaleLayout measures one index layout (redisFlags.layout) and prints its figures.
func (b *bench) redisScaleLayout(ctx context.Context, text string) error {
	rd, err := harness.StartRedis(ctx, b.dir)
	if err != nil {
		return err
	}
	b.track(rd.Proc)
	rc := redis.NewClient(&redis.Options{Addr: rd.Addr})
	defer rc.Close()
	// Every call longer than 1 ms is kept (SLOWLOG).
	if err := rc.ConfigSet(ctx, "slowlog-log-slower-than", "1000").Err(); err != nil {
		return err
	}
	if err := rc.ConfigSet(ctx, "slowlog-max-len", "1024").Err(); err != nil {
		return err
	}
	rc.SlowLogReset(ctx)

	engines, err := b.engines(ctx, fmt.Sprintf("redis-l%d", redisFlags.layout), 1, harness.EngineOptions{Args: []string{"--time-scale", "0"}})
	if err != nil {
		return err
	}
	e := engines[0]
	model := b.base.Name
	prompt, err := bytesForTokens(ctx, e, model, text, redisFlags.promptTokens)
	if err != nil {
		return err
	}
	n := b.o.requests
	cut := func(i int) string {
		off := (i * 7919 * 13) % (len(text) - prompt)
		return strings.ToValidUTF8(fmt.Sprintf("Chat %d. ", i)+text[off:off+prompt], "")
	}
	// Record the engine's KV-event batches of the fresh phase, to replay them into an index of our own.
	rec, err := recordEvents(ctx, e.EventsAddr)
	if err != nil {
		return err
	}
	defer rec.stop()

	g, err := b.gateway(ctx, fmt.Sprintf("redis-bench-l%d", redisFlags.layout), engines, config.StoreRedis, rd.Addr)
	if err != nil {
		return err
	}
	gc := newClient()
	// Warm-up: connections, the policy, and the prompts the repeated phase cycles through.
	for i := range 20 {
		if _, err := post(ctx, gc, g.URL(), chatBody(model, "", fmt.Sprintf("warm-up %d. ", i)+text[:prompt], 1)); err != nil {
			return err
		}
	}
	repeat := make([][]byte, redisFlags.repeatSet)
	for i := range repeat {
		repeat[i] = chatBody(model, "", cut(1_000_000+i), 1)
		if _, err := post(ctx, gc, g.URL(), repeat[i]); err != nil {
			return err
		}
	}
	// Ignore what the warm-up recorded.
	time.Sleep(500 * time.Millisecond)
	rec.reset()

	fresh := make([][]byte, n)
	for i := range fresh {
		fresh[i] = chatBody(model, "", cut(i), 1)
	}
	again := make([][]byte, n)
	for i := range again {
		again[i] = repeat[i%len(repeat)]
	}
	var phases []redisPhase
	for _, ph := range []struct {
		name   string
		bodies [][]byte
	}{{"fresh 2k", fresh}, {"repeated 2k", again}} {
		p, err := b.redisPhase(ctx, rc, g, ph.name, ph.bodies)
		if err != nil {
			return err
		}
		phases = append(phases, p)
		if ph.name == "fresh 2k" {
			rec.pause()
		}
		fmt.Fprintf(b.out, "  measured %s\n", ph.name)
	}
	slow := readSlowest(ctx, rc)
	g.Stop(5 * time.Second)

	batches := rec.take()
	ing, err := b.replay(ctx, rc, batches)
	if err != nil {
		return err
	}
	var clr clearResult
	if redisFlags.clearBlocks > 0 {
		if clr, err = b.floodAndClear(ctx, rc, redisFlags.clearBlocks); err != nil {
			return err
		}
	}
	s2 := readSlowest(ctx, rc)
	if s2.Dur > slow.Dur {
		slow = s2
	}
	b.printRedis(phases, ing, clr, slow)
	return nil
}

// redisPhase sends bodies back to back through the gateway and measures, from the first request until the
// gateway and Redis are quiet again (their KV events ingested), Redis's and the gateway's CPU per request
// less each one's idle rate, and Redis's commandstats per request.
func (b *bench) redisPhase(ctx context.Context, rc *redis.Client, g *harness.Gateway, name string, bodies [][]byte) (redisPhase, error) {
	p := redisPhase{Name: name, Requests: len(bodies)}
	hc := newClient()
	if _, err := waitQuiet(g, -1); err != nil {
		return p, err
	}
	// Idle rates.
	r0, err := redisCPU(ctx, rc)
	if err != nil {
		return p, err
	}
	g0, _ := g.CPUTime()
	time.Sleep(idleWindow)
	r1, _ := redisCPU(ctx, rc)
	g1, _ := g.CPUTime()
	rIdle := float64(r1-r0) / float64(idleWindow)
	gIdle := float64(g1-g0) / float64(idleWindow)

	if err := rc.ConfigResetStat(ctx).Err(); err != nil {
		return p, err
	}
	r0, _ = redisCPU(ctx, rc)
	g0, _ = g.CPUTime()
	t0 := time.Now()
	lat := make([]time.Duration, 0, len(bodies))
	var cached, prompt int64
	for _, body := range bodies {
		a, err := post(ctx, hc, g.URL(), body)
		if err != nil {
			return p, err
		}
		lat = append(lat, a.Latency)
		cached += a.CachedTokens
		prompt += a.PromptTokens
	}
	if _, err := waitQuiet(g, gIdle); err != nil {
		return p, err
	}
	r1, _ = redisCPU(ctx, rc)
	g1, _ = g.CPUTime()
	el := time.Since(t0)
	nreq := time.Duration(len(bodies))
	p.RedisCPU = (r1 - r0 - time.Duration(rIdle*float64(el))) / nreq
	p.GatewayCP = (g1 - g0 - time.Duration(gIdle*float64(el))) / nreq
	p.CachedTokens = cached / int64(len(bodies))
	p.PromptTokens = prompt / int64(len(bodies))
	p.P50, p.P99 = quantile(lat, .5), quantile(lat, .99)
	stats, err := rc.Info(ctx, "commandstats").Result()
	if err != nil {
		return p, err
	}
	p.Commands = parseCommandStats(stats, float64(len(bodies)))
	info, err := rc.Info(ctx, "stats").Result()
	if err != nil {
		return p, err
	}
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "total_reads_processed:"); ok {
			n, _ := strconv.ParseFloat(v, 64)
			p.Reads = n / float64(len(bodies))
		}
	}
	return p, nil
}

// ingestResult is the replay of recorded event batches into a Redis index of the bench's own.
type ingestResult struct {
	Batches, Blocks int
	PerBlock        time.Duration // Redis CPU per block stored
	Wall            time.Duration
	BytesOneHolder  float64 // used_memory growth per block, one endpoint holding the blocks
	BytesTwoHolders float64 // per (block, holder) once a second endpoint holds the same blocks
}

// replay publishes the recorded batches on a ZMQ PUB socket of our own to a kvevents.Ingester writing a
// fresh Redis index (prefix "kvgbench"), as a gateway ingests an engine, twice (endpoints r0 and r1: the
// second measures what one more holder of the same blocks costs).
func (b *bench) replay(ctx context.Context, rc *redis.Client, batches [][]byte) (ingestResult, error) {
	var res ingestResult
	if len(batches) == 0 {
		return res, errors.New("redis: no KV-event batches were recorded")
	}
	for _, p := range batches {
		eb, err := kvevents.Decode(p)
		if err != nil {
			return res, fmt.Errorf("redis: recorded batch: %w", err)
		}
		for _, ev := range eb.Events {
			if s, ok := ev.(kvevents.BlockStored); ok {
				res.Blocks += len(s.BlockHashes)
			}
		}
	}
	res.Batches = len(batches)
	idx, err := kvstore.NewRedisIndex(rc, kvstore.RedisConfig{Prefix: "kvgbench", IndexLayout: redisFlags.layout})
	if err != nil {
		return res, err
	}
	mem0, err := usedMemory(ctx, rc)
	if err != nil {
		return res, err
	}
	for h, ep := range []kvstore.EndpointID{"r0", "r1"} {
		cpu0, _ := redisCPU(ctx, rc)
		t0 := time.Now()
		if err := b.replayOnce(ctx, idx, ep, batches); err != nil {
			return res, err
		}
		wall := time.Since(t0)
		cpu1, _ := redisCPU(ctx, rc)
		mem, _ := usedMemory(ctx, rc)
		if h == 0 {
			res.PerBlock = (cpu1 - cpu0) / time.Duration(res.Blocks)
			res.Wall = wall
			res.BytesOneHolder = float64(mem-mem0) / float64(res.Blocks)
		} else {
			res.BytesTwoHolders = float64(mem-mem0) / float64(2*res.Blocks)
		}
	}
	return res, nil
}

func (b *bench) replayOnce(ctx context.Context, idx kvstore.Index, ep kvstore.EndpointID, batches [][]byte) error {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pub := zmq4.NewPub(pctx)
	defer pub.Close()
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		return err
	}
	addr := "tcp://" + pub.Addr().(*net.TCPAddr).String()
	ing, err := kvevents.NewIngester(kvevents.IngesterConfig{Endpoint: ep, Model: b.base.Name, EventsAddr: addr,
		BlockSize: b.base.BlockSize, Hasher: kvstore.Hasher{Seed: b.cfg.BlockKeySeed}, Index: idx,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	if err := ing.Start(pctx); err != nil {
		return err
	}
	defer ing.Close()
	// The subscription must be in place before the first batch (a PUB drops what no one subscribed to):
	// send a probe batch (AllBlocksCleared, seq 0) until the ingester counts one.
	probe, err := kvevents.Encode(kvevents.EventBatch{TS: 1, Events: []kvevents.Event{kvevents.AllBlocksCleared{}}}, kvevents.LayoutMap, kvevents.HashUint)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for ing.Stats().Batches == 0 {
		if time.Now().After(deadline) {
			return errors.New("redis: replay ingester never received a batch")
		}
		if err := pub.Send(zmq4.NewMsgFrom([]byte("kv"), seqFrame(0), probe)); err != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
	base := ing.Stats().Batches
	// Paced so the PUB's high-water mark never drops a batch: at most 256 ahead of the ingester.
	for i, p := range batches {
		for uint64(i)-(ing.Stats().Batches-base) > 256 {
			time.Sleep(200 * time.Microsecond)
		}
		if err := pub.Send(zmq4.NewMsgFrom([]byte("kv"), seqFrame(uint64(i)+1), p)); err != nil {
			return err
		}
	}
	for ing.Stats().Batches-base < uint64(len(batches)) {
		if time.Now().After(deadline.Add(5 * time.Minute)) {
			return fmt.Errorf("redis: replay: %d of %d batches applied", ing.Stats().Batches-base, len(batches))
		}
		time.Sleep(time.Millisecond)
	}
	if s := ing.Stats(); s.Gaps+s.IndexErrors+s.Orphans+s.DecodeErrors != 0 {
		return fmt.Errorf("redis: replay: ingester stats %+v", s)
	}
	return nil
}

func seqFrame(s uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], s)
	return b[:]
}

// clearResult is one endpoint's flood of blocks and its clear.
type clearResult struct {
	Blocks int
	Clear  time.Duration
	// Probe is the longest a PING from another connection waited while the clear ran.
	Probe time.Duration
}

// floodAndClear writes n distinct blocks for one endpoint (128-block chains, 32-block updates, as ingestion
// writes them), then clears the endpoint while another connection PINGs.
func (b *bench) floodAndClear(ctx context.Context, rc *redis.Client, n int) (clearResult, error) {
	res := clearResult{Blocks: n}
	idx, err := kvstore.NewRedisIndex(rc, kvstore.RedisConfig{Prefix: "kvgflood", IndexLayout: redisFlags.layout})
	if err != nil {
		return res, err
	}
	h := kvstore.Hasher{Seed: 1}
	var ups []kvstore.Update
	toks := make([]uint32, 128*16)
	for done, chain := 0, 0; done < n; chain++ {
		for i := range toks {
			toks[i] = uint32(chain*31 + i)
		}
		keys := h.Keys(toks, 16, kvstore.ExtraKeys{})
		keys = keys[:min(len(keys), n-done)]
		fams := make([]kvstore.Family, len(keys))
		for i := range fams {
			fams[i] = kvstore.FamilyOf(keys[0])
		}
		for i := 0; i < len(keys); i += 32 {
			j := min(i+32, len(keys))
			ups = append(ups, kvstore.Update{Endpoint: "flood", Tier: kvstore.TierGPU, Keys: keys[i:j], Families: fams[i:j]})
		}
		done += len(keys)
		if len(ups) >= 64 || done >= n {
			if err := idx.Apply(ctx, b.base.Name, ups); err != nil {
				return res, err
			}
			ups = ups[:0]
		}
	}
	probe := redis.NewClient(&redis.Options{Addr: rc.Options().Addr})
	defer probe.Close()
	probe.Ping(ctx)
	stop := make(chan struct{})
	worst := make(chan time.Duration, 1)
	go func() {
		var w time.Duration
		for {
			select {
			case <-stop:
				worst <- w
				return
			default:
			}
			t := time.Now()
			probe.Ping(ctx)
			w = max(w, time.Since(t))
			time.Sleep(time.Millisecond)
		}
	}()
	t0 := time.Now()
	err = idx.ClearEndpoint(ctx, b.base.Name, "flood")
	res.Clear = time.Since(t0)
	close(stop)
	res.Probe = <-worst
	return res, err
}

func (b *bench) printRedis(phases []redisPhase, ing ingestResult, clr clearResult, slow slowest) {
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(b.out, "\nRedis index layout %d: cost per request (%d requests per phase, one gateway, one enginesim at --time-scale 0, local redis-server; load average %s)\n",
		redisFlags.layout, b.o.requests, strings.Join(strings.Fields(string(load))[:3], " "))
	w := tabwriter.NewWriter(b.out, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "phase\tprompt tok\tcached tok\tRedis CPU/req\tgateway CPU/req\tp50\tp99\ttarget\t")
	for _, p := range phases {
		t := targetRedisFresh
		if strings.HasPrefix(p.Name, "repeated") {
			t = targetRedisRepeated
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t≤ %s %s\t\n", p.Name, p.PromptTokens, p.CachedTokens, us(p.RedisCPU),
			us(p.GatewayCP), us(p.P50), us(p.P99), us(t), verdict(p.RedisCPU <= t))
	}
	w.Flush()
	for _, p := range phases {
		var parts []string
		calls := 0.0
		for _, c := range p.Commands {
			calls += c.Calls
			if c.Calls < 0.05 {
				continue
			}
			parts = append(parts, fmt.Sprintf("%s %.1f× %.0f µs", c.Name, c.Calls, c.Use))
		}
		fmt.Fprintf(b.out, "  %s, per request (%.1f commands, %.1f Redis reads): %s\n", p.Name, calls, p.Reads, strings.Join(parts, ", "))
	}
	fmt.Fprintf(b.out, "ingestion (replay of the fresh phase's %d recorded event batches, %d blocks): %.2f µs Redis CPU per block (≤ %s %s), %.0f k blocks/s wall\n",
		ing.Batches, ing.Blocks, float64(ing.PerBlock.Nanoseconds())/1e3, us(targetIngestPerBlk), verdict(ing.PerBlock <= targetIngestPerBlk),
		float64(ing.Blocks)/ing.Wall.Seconds()/1e3)
	fmt.Fprintf(b.out, "memory: %.0f B per (block, holder) with one holder, %.0f B with two (≤ %d B %s)\n",
		ing.BytesOneHolder, ing.BytesTwoHolders, targetBytesPerHold, verdict(max(ing.BytesOneHolder, ing.BytesTwoHolders) <= targetBytesPerHold))
	if clr.Blocks > 0 {
		fmt.Fprintf(b.out, "clear of one endpoint's %d blocks: %s; a PING meanwhile waited at most %s\n", clr.Blocks,
			clr.Clear.Round(time.Millisecond), clr.Probe.Round(10*time.Microsecond))
	}
	if slow.Dur > 0 {
		fmt.Fprintf(b.out, "longest Redis call (SLOWLOG, ≥ 1 ms): %s %s (≤ %s %s)\n", slow.Dur.Round(10*time.Microsecond), slow.Args,
			targetLongestCall, verdict(slow.Dur <= targetLongestCall))
	} else {
		fmt.Fprintf(b.out, "longest Redis call: < 1 ms (SLOWLOG empty at 1 ms) (≤ %s met)\n", targetLongestCall)
	}
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// readBenchText returns the tokenizer's 1 MB bench text (gateway/internal/tokenizer/testdata/goldens/bench.txt.gz).
func readBenchText(root string) (string, error) {
	f, err := os.Open(filepath.Join(root, "gateway", "internal", "tokenizer", "testdata", "goldens", "bench.txt.gz"))
	if err != nil {
		return "", err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return "", err
	}
	b, err := io.ReadAll(zr)
	return string(b), err
}

// bytesForTokens returns how many bytes of text make a user message of about target tokens.
func bytesForTokens(ctx context.Context, e *harness.Engine, model, text string, target int) (int, error) {
	empty, err := e.Tokenize(ctx, chatBody(model, "", "", 1))
	if err != nil {
		return 0, err
	}
	n := target * 4
	for range 5 {
		// The mean over eight cuts spread over the text (its density varies).
		got := 0
		for i := range 8 {
			off := i * (len(text) - n) / 8
			ids, err := e.Tokenize(ctx, chatBody(model, "", strings.ToValidUTF8(text[off:off+n], ""), 1))
			if err != nil {
				return 0, err
			}
			got += (len(ids) - len(empty)) / 8
		}
		if got >= target*98/100 && got <= target*102/100 {
			break
		}
		n = max(1, n*target/max(got, 1))
	}
	return n, nil
}

// redisCPU returns the server's used_cpu_user + used_cpu_sys (INFO cpu).
func redisCPU(ctx context.Context, c *redis.Client) (time.Duration, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	for line := range strings.SplitSeq(info, "\n") {
		line = strings.TrimSpace(line)
		for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, k); ok {
				x, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return 0, err
				}
				total += x
			}
		}
	}
	return time.Duration(total * 1e9), nil
}

func usedMemory(ctx context.Context, c *redis.Client) (int64, error) {
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, errors.New("redis: INFO memory has no used_memory")
}

// parseCommandStats reads INFO commandstats ("cmdstat_get:calls=3,usec=12,...") per request, busiest first.
func parseCommandStats(info string, per float64) []cmdStat {
	var out []cmdStat
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		c := cmdStat{Name: strings.TrimPrefix(name, "cmdstat_")}
		for kv := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			x, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				c.Calls = x / per
			case "usec":
				c.Use = x / per
			}
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Use > out[j].Use })
	return out
}

// readSlowest returns the longest SLOWLOG entry (and resets the log).
func readSlowest(ctx context.Context, c *redis.Client) slowest {
	var s slowest
	logs, err := c.SlowLogGet(ctx, 1024).Result()
	if err != nil {
		return s
	}
	for _, l := range logs {
		if l.Duration > s.Dur {
			a := strings.Join(l.Args, " ")
			if len(a) > 60 {
				a = a[:60] + "…"
			}
			a = strings.Trim(strconv.QuoteToGraphic(a), `"`) // layout 2's field names are binary
			s = slowest{Dur: l.Duration, Args: a}
		}
	}
	c.SlowLogReset(ctx)
	return s
}

// eventRecorder subscribes to an engine's KV events and keeps each batch's payload.
type eventRecorder struct {
	sub    zmq4.Socket
	cancel context.CancelFunc
	done   chan struct{}
	mu     chanMutex
	on     bool
	got    [][]byte
}

// chanMutex is a one-slot channel used as a mutex (the recorder's goroutine and the bench share got).
type chanMutex chan struct{}

func (m chanMutex) lock()   { m <- struct{}{} }
func (m chanMutex) unlock() { <-m }

func recordEvents(ctx context.Context, addr string) (*eventRecorder, error) {
	if addr == "" {
		return nil, errors.New("redis: the engine publishes no KV events")
	}
	sctx, cancel := context.WithCancel(ctx)
	r := &eventRecorder{sub: zmq4.NewSub(sctx), cancel: cancel, done: make(chan struct{}), mu: make(chanMutex, 1), on: true}
	if err := r.sub.Dial(addr); err != nil {
		cancel()
		return nil, err
	}
	if err := r.sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		cancel()
		return nil, err
	}
	go func() {
		defer close(r.done)
		for {
			m, err := r.sub.Recv()
			if err != nil {
				return
			}
			if len(m.Frames) < 3 {
				continue
			}
			r.mu.lock()
			if r.on {
				r.got = append(r.got, bytes.Clone(m.Frames[2]))
			}
			r.mu.unlock()
		}
	}()
	return r, nil
}

func (r *eventRecorder) reset() { r.mu.lock(); r.got, r.on = nil, true; r.mu.unlock() }
func (r *eventRecorder) pause() { r.mu.lock(); r.on = false; r.mu.unlock() }
func (r *eventRecorder) take() [][]byte {
	r.mu.lock()
	defer r.mu.unlock()
	return r.got
}
func (r *eventRecorder) stop() { r.cancel(); r.sub.Close(); <-r.done }
