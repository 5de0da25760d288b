package sim

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore/testenv"
)

// goldenPayloads reads the kv-events reference payloads in kvstore/kvevents/testdata/payloads.hex.txt.
func goldenPayloads(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../../../kvstore/kvevents/testdata/payloads.hex.txt")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		name, payload, _ := strings.Cut(line, " ")
		out[name] = payload
	}
	return out
}

type goldenJSON struct {
	HashVectors struct {
		SHA256CBOR struct {
			Cases map[string]struct {
				BlockHashesHex    []string `json:"block_hashes_hex"`
				BlockHashesUint64 []uint64 `json:"block_hashes_uint64"`
			} `json:"cases"`
		} `json:"sha256_cbor"`
	} `json:"hash_vectors"`
}

func goldenHashes(t *testing.T) goldenJSON {
	t.Helper()
	b, err := os.ReadFile("../../../kvstore/kvevents/testdata/golden.json")
	if err != nil {
		t.Fatal(err)
	}
	return decode[goldenJSON](t, b)
}

// The simulator's events (cache events → kvevents values → kvevents.Encode) reproduce the reference
// payload bytes: BlockStored of tokens 1..32 (GPU), BlockRemoved of block 1 (CPU), AllBlocksCleared, at
// ts 1700000000.5, dp rank 0.
func TestEventPayloadsMatchGoldens(t *testing.T) {
	golden := goldenPayloads(t)
	toks := seqTokens(32, 1)
	h, _ := newBlockHasher("0")
	hs := h.blockHashes(toks, 16, "", "")
	events := []kvEvent{
		{kind: "BlockStored", medium: tierGPU, hashes: hs, tokens: toks},
		{kind: "BlockRemoved", medium: tierCPU, hashes: hs[1:]},
		{kind: "AllBlocksCleared"},
	}
	for _, tc := range []struct{ encoding, form, golden string }{
		{"array", "int", "vllm/array_last/hash_int"},
		{"array", "bytes", "vllm/array_last/hash_bytes"},
		{"map", "int", "vllm/map/hash_int"},
		{"map", "bytes", "vllm/map/hash_bytes"},
		{"vllm/array_v0_11", "int", "vllm/array_v0_11/hash_int"},
		{"vllm/array_lora_name", "bytes", "vllm/array_lora_name/hash_bytes"},
	} {
		layout, err := parseLayout(tc.encoding)
		if err != nil {
			t.Fatal(err)
		}
		form, err := parseHashForm(tc.form)
		if err != nil {
			t.Fatal(err)
		}
		p := &publisher{layout: layout, form: form, blockSize: 16}
		got, err := p.encode(1700000000.5, events)
		if err != nil {
			t.Fatalf("%s: %v", tc.golden, err)
		}
		if hex.EncodeToString(got) != golden[tc.golden] {
			t.Errorf("%s:\n got %x\nwant %s", tc.golden, got, golden[tc.golden])
		}
	}
}

// pyClient runs testdata/zmq_client.py (pyzmq on libzmq) and returns its JSON lines after READY.
type pyClient struct {
	cmd   *exec.Cmd
	lines chan string
}

// startSub starts a libzmq subscriber to e's events and waits until e's PUB socket has its subscription.
func startSub(t *testing.T, e *Engine, topic string, n int) *pyClient {
	t.Helper()
	c := startPy(t, "sub", e.EventsAddr(), topic, strconv.Itoa(n), "20000")
	waitFor(t, "subscription", func() bool { return len(e.EventSubscriptions()) > 0 })
	return c
}

func startPy(t *testing.T, args ...string) *pyClient {
	t.Helper()
	python := testenv.PythonWith(t, "zmq", "msgpack")
	cmd := exec.Command(python, append([]string{"testdata/zmq_client.py"}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	c := &pyClient{cmd: cmd, lines: make(chan string, 100)}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			if sc.Text() == "READY" {
				close(ready)
				continue
			}
			c.lines <- sc.Text()
		}
		close(c.lines)
		io.Copy(io.Discard, out)
	}()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("python client not ready")
	}
	return c
}

type subMsg struct {
	Topic  string          `json:"topic"`
	Seq    uint64          `json:"seq"`
	Frames int             `json:"frames"`
	Batch  json.RawMessage `json:"batch"`
}

func (c *pyClient) next(t *testing.T) subMsg {
	t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			t.Fatal("python client exited early")
		}
		return decode[subMsg](t, []byte(l))
	case <-time.After(10 * time.Second):
		t.Fatal("no message from the python client")
	}
	return subMsg{}
}

// events of an array-layout batch [ts, [event...], dp_rank] as decoded by msgpack-python.
func batchEvents(t *testing.T, raw json.RawMessage) []json.RawMessage {
	t.Helper()
	var b []json.RawMessage
	if err := json.Unmarshal(raw, &b); err != nil || len(b) != 3 || string(b[2]) != "0" {
		t.Fatalf("batch %s", raw)
	}
	var evs []json.RawMessage
	if err := json.Unmarshal(b[1], &evs); err != nil {
		t.Fatalf("events %s", b[1])
	}
	return evs
}

func eventsEngine(t *testing.T, mutate func(*Config)) *Engine {
	return startEngine(t, func(c *Config) {
		c.KVEvents = KVEventsConfig{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: "tcp://*:0",
			ReplayEndpoint: "tcp://*:0", Topic: "kv@sim@m"}
		if mutate != nil {
			mutate(c)
		}
	})
}

// A libzmq subscriber receives and decodes the simulator's events; block hashes are vLLM's sha256_cbor
// golden values (seed "0"), with LoRA name and cache salt folded in as vLLM does.
func TestEventsReachLibzmqSubscriber(t *testing.T) {
	e := eventsEngine(t, nil)
	sub := startSub(t, e, "kv@", 4)
	g := goldenHashes(t).HashVectors.SHA256CBOR.Cases
	prompt := seqTokens(33, 1) // 2 full blocks + 1 token (the last token is always computed)
	for _, req := range []map[string]any{
		{"model": "m", "prompt": prompt, "max_tokens": 1},
		{"model": "m:my-lora", "prompt": prompt, "max_tokens": 1},
		{"model": "m", "prompt": prompt, "max_tokens": 1, "cache_salt": "salt123"},
	} {
		if r := post(t, e, "/v1/completions", req); r.status != 200 {
			t.Fatalf("%v: %d %s", req, r.status, r.body)
		}
	}
	post(t, e, "/reset_prefix_cache", "")
	for i, tc := range []struct {
		golden, lora string
	}{{"plain", "null"}, {"lora_name=my-lora", `"my-lora"`}, {"cache_salt=salt123", "null"}} {
		m := sub.next(t)
		if m.Topic != "kv@sim@m" || m.Seq != uint64(i) {
			t.Fatalf("message %d: topic %q seq %d", i, m.Topic, m.Seq)
		}
		evs := batchEvents(t, m.Batch)
		want := g[tc.golden].BlockHashesUint64
		// Last array-like layout: [tag, hashes, parent, tokens, block_size, lora_id, medium, lora_name, 4 × None].
		wantEv := `["BlockStored",[` + strconv.FormatUint(want[0], 10) + `,` + strconv.FormatUint(want[1], 10) + `],null,` +
			mustJSON(seqTokens(32, 1)) + `,16,null,"GPU",` + tc.lora + `,null,null,null,null]`
		if len(evs) != 1 || compactJSON(t, evs[0]) != wantEv {
			t.Fatalf("%s: events %s\nwant %s", tc.golden, m.Batch, wantEv)
		}
	}
	m := sub.next(t)
	if evs := batchEvents(t, m.Batch); m.Seq != 3 || len(evs) != 1 || compactJSON(t, evs[0]) != `["AllBlocksCleared"]` {
		t.Fatalf("reset batch seq %d %s", m.Seq, m.Batch)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func compactJSON(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var v any
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.UseNumber() // keep 64-bit hashes exact
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return mustJSON(v)
}

// vLLM ≥ 0.24 tagged maps with 32-byte digests; CPU-tier events as placeholders.
func TestEventsMapEncodingBytesHashesAndCPUPlaceholders(t *testing.T) {
	e := eventsEngine(t, func(c *Config) {
		c.EventsEncoding, c.EventsHashForm = "map", "bytes"
		c.NumGPUBlocks, c.NumCPUBlocks, c.CPUEventsSelfDescribing = 3, 10, false
	})
	sub := startSub(t, e, "", 2)
	g := goldenHashes(t).HashVectors.SHA256CBOR.Cases["plain"]
	post(t, e, "/v1/completions", map[string]any{"model": "m", "prompt": seqTokens(33, 1), "max_tokens": 1})
	post(t, e, "/v1/completions", map[string]any{"model": "m", "prompt": seqTokens(33, 500), "max_tokens": 1})
	type hexv struct {
		Hex string `json:"hex"`
	}
	type mapEv struct {
		Type        string   `json:"type"`
		BlockHashes []hexv   `json:"block_hashes"`
		Parent      *hexv    `json:"parent_block_hash"`
		TokenIDs    []uint32 `json:"token_ids"`
		BlockSize   int      `json:"block_size"`
		Medium      string   `json:"medium"`
	}
	first := batchEvents(t, sub.next(t).Batch)
	ev := decode[mapEv](t, first[0])
	if ev.Type != "BlockStored" || len(ev.BlockHashes) != 2 || ev.BlockHashes[0].Hex != g.BlockHashesHex[0] ||
		ev.BlockHashes[1].Hex != g.BlockHashesHex[1] || ev.Parent != nil || ev.Medium != "GPU" || len(ev.TokenIDs) != 32 {
		t.Fatalf("first batch %s", first)
	}
	// The second prompt needs 3 blocks: a's 2 cached ones are evicted (tail first) to the CPU tier.
	second := batchEvents(t, sub.next(t).Batch)
	var kinds []string
	for _, raw := range second {
		ev := decode[mapEv](t, raw)
		kinds = append(kinds, ev.Type+"/"+ev.Medium)
		if ev.Type == "BlockStored" && ev.Medium == "CPU" && (len(ev.TokenIDs) != 0 || ev.BlockSize != 0 || ev.Parent != nil) {
			t.Fatalf("CPU store is not a placeholder: %s", raw)
		}
	}
	want := []string{"BlockRemoved/GPU", "BlockStored/CPU", "BlockRemoved/GPU", "BlockStored/CPU", "BlockStored/GPU"}
	if !reflect.DeepEqual(kinds, want) {
		t.Fatalf("second batch kinds %v, want %v", kinds, want)
	}
}

// A dropped batch leaves a sequence gap; the replay ROUTER returns exactly the batches from the gap on,
// then the end marker.
func TestReplayReturnsMissedBatches(t *testing.T) {
	e := eventsEngine(t, nil)
	sub := startSub(t, e, "", 2)
	prompt := func(i int) map[string]any {
		return map[string]any{"model": "m", "prompt": seqTokens(17, uint32(1000*i)), "max_tokens": 1}
	}
	post(t, e, "/v1/completions", prompt(1)) // seq 0
	// Batches are published asynchronously: wait for seq 0 before arming the fault, or it may hit seq 0.
	m0 := sub.next(t)
	setFaults(t, e, `{"drop_event_batches":1}`)
	post(t, e, "/v1/completions", prompt(2)) // seq 1, dropped
	post(t, e, "/v1/completions", prompt(3)) // seq 2
	m2 := sub.next(t)
	if m0.Seq != 0 || m2.Seq != 2 {
		t.Fatalf("subscriber saw seqs %d, %d; want 0, 2", m0.Seq, m2.Seq)
	}
	if v := metric(t, e, `enginesim:kv_event_batches_dropped_total{model_name="m"}`); v != 1 {
		t.Fatalf("dropped batches metric %v", v)
	}
	rep := startPy(t, "replay", e.ReplayAddr(), "1", "20000")
	r1, r2, end := rep.next(t), rep.next(t), rep.next(t)
	if r1.Seq != 1 || r2.Seq != 2 || end.Seq != endSeq || string(end.Batch) != "null" || r1.Frames != 3 || end.Frames != 3 {
		t.Fatalf("replay seqs %d %d %d (end batch %s)", r1.Seq, r2.Seq, end.Seq, end.Batch)
	}
	if compactJSON(t, r2.Batch) != compactJSON(t, m2.Batch) {
		t.Fatalf("replayed batch 2 differs from the published one:\n%s\n%s", r2.Batch, m2.Batch)
	}
	evs := batchEvents(t, r1.Batch)
	var ev []json.RawMessage
	json.Unmarshal(evs[0], &ev)
	if len(ev) < 4 || compactJSON(t, ev[3]) != mustJSON(seqTokens(16, 2000)) {
		t.Fatalf("missed batch %s is not prompt 2's block", r1.Batch)
	}
}

// restart_event_seq starts the sequence over at 0 with an empty cache, as a restarted engine would.
func TestRestartEventSequence(t *testing.T) {
	e := eventsEngine(t, nil)
	sub := startSub(t, e, "", 3)
	body := map[string]any{"model": "m", "prompt": seqTokens(17, 1), "max_tokens": 1}
	post(t, e, "/v1/completions", body)
	post(t, e, "/v1/completions", map[string]any{"model": "m", "prompt": seqTokens(17, 100), "max_tokens": 1})
	// Batches are published asynchronously: see both before arming the restart.
	seqs := []uint64{sub.next(t).Seq, sub.next(t).Seq}
	setFaults(t, e, `{"restart_event_seq":true}`)
	r := post(t, e, "/v1/completions", body)
	if c := decode[completionJSON](t, r.body).Usage.PromptTokensDetails.CachedTokens; c != 0 {
		t.Fatalf("cache survived the restart: %d cached", c)
	}
	seqs = append(seqs, sub.next(t).Seq)
	if !reflect.DeepEqual(seqs, []uint64{0, 1, 0}) {
		t.Fatalf("seqs %v, want [0 1 0]", seqs)
	}
	if f := e.Faults(); f.RestartEventSeq {
		t.Fatal("restart stayed armed")
	}
}
