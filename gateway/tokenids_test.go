package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/kvgate/kvgate/cmd/enginesim/sim"
	kvopenai "github.com/kvgate/kvgate/gateway/internal/openai"
)

// recorder is an openai-go middleware keeping the exact bytes the client sent.
type recorder struct {
	mu     sync.Mutex
	bodies [][]byte
}

func (r *recorder) middleware(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	if req.Body != nil {
		b, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(b))
		r.mu.Lock()
		r.bodies = append(r.bodies, b)
		r.mu.Unlock()
	}
	return next(req)
}

func (r *recorder) last() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bodies[len(r.bodies)-1]
}

// scrapeSample reads one sample (full name with labels, as exposed) from the gateway's /metrics (0 when absent).
func scrapeSample(t testing.TB, g *Gateway, sample string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + g.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			v, _ := strconv.ParseFloat(rest, 64)
			return v
		}
	}
	return 0
}

type tokenStatus struct {
	Verified     bool `json:"verified"`
	Mismatches   int  `json:"mismatches"`
	LastMismatch *struct {
		Check         string   `json:"check"`
		Position      int      `json:"position"`
		GatewayTokens []uint32 `json:"gateway_tokens"`
		EngineTokens  []uint32 `json:"engine_tokens"`
	} `json:"last_mismatch"`
	WithdrawnBy string `json:"withdrawn_by"`
}

func readyTokens(t testing.TB, g *Gateway) map[string]tokenStatus {
	t.Helper()
	resp, err := getReadyz(g)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		TokenIDs map[string]tokenStatus `json:"token_ids"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return body.TokenIDs
}

// dialectSim starts one simulated engine of api serving name.
func dialectSim(t testing.TB, api, name string, mod func(*sim.Config)) *sim.Engine {
	return startSims(t, 1, func(c *sim.Config) {
		c.API, c.ServedModelNames = api, []string{name}
		c.KVEvents = sim.KVEventsConfig{Publisher: "null"}
		if mod != nil {
			mod(c)
		}
	})[0]
}

var weatherTool = openai.ChatCompletionToolParam{Function: openai.FunctionDefinitionParam{Name: "get_weather",
	Description: openai.String("Current weather for a city."),
	Parameters: openai.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}},
		"required": []string{"city"}}}}

// For each engine dialect, through the official client: chat (with and without tools, streamed and not)
// reaches the engine with the gateway's token IDs in that engine's field and every other byte as the
// client sent it; the engine tokenizes nothing; the answer is the engine's chat.completion. A request with
// an image goes with its original body and is counted.
func TestChatTokenIDsDialects(t *testing.T) {
	vllm := dialectSim(t, sim.APIVLLM, "qwen3", nil)
	sgl := dialectSim(t, sim.APISGLang, "qwen3-sgl", nil)
	yaml := "listen: \"127.0.0.1:0\"\nscrape_interval: 100ms\nmodels:\n" +
		"  - {name: qwen3, tokenizer: " + qwenDir + ", endpoints: [{id: v0, engine: vllm, url: \"http://" + vllm.HTTPAddr() + "\"}]}\n" +
		"  - {name: qwen3-sgl, tokenizer: " + qwenDir + ", endpoints: [{id: s0, engine: sglang, url: \"http://" + sgl.HTTPAddr() + "\"}]}\n"
	g := startGateway(t, yaml)
	for id, st := range readyTokens(t, g) {
		if !st.Verified {
			t.Fatalf("%s not verified after start: %+v", id, st)
		}
	}
	rec := &recorder{}
	c := openai.NewClient(option.WithBaseURL("http://"+g.Addr()+"/v1"), option.WithAPIKey("unused"),
		option.WithMaxRetries(0), option.WithMiddleware(rec.middleware))
	ctx := context.Background()
	enc, _ := testEncoder("")
	for _, d := range []struct {
		model, ep string
		e         *sim.Engine
		field     func(ids string) string // what the gateway inserts after the client's '{'
	}{
		{"qwen3", "v0", vllm, func(ids string) string { return `"kv_transfer_params":{"prompt_token_ids":` + ids + `},` }},
		{"qwen3-sgl", "s0", sgl, func(ids string) string { return `"input_ids":` + ids + `,` }},
	} {
		checkBody := func(what string) {
			t.Helper()
			client := rec.last()
			_, ids, err := enc.EncodeChat(client)
			if err != nil {
				t.Fatal(err)
			}
			want := "{" + d.field(string(kvopenai.AppendIDs(nil, ids))) + string(client[1:])
			if got := string(d.e.LastChatBody()); got != want {
				t.Fatalf("%s %s: engine got\n%s\nwant\n%s", d.model, what, got, want)
			}
		}
		msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("Name three rivers in Europe.")}
		var hdr *http.Response
		cc, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: d.model, Messages: msgs,
			MaxTokens: openai.Int(3), Temperature: openai.Float(0.2), User: openai.String("u-1")}, option.WithResponseInto(&hdr))
		if err != nil {
			t.Fatal(err)
		}
		if cc.Object != "chat.completion" || len(cc.Choices) != 1 || cc.Choices[0].Message.Content == "" ||
			hdr.Header.Get(sim.HeaderPromptTokenized) != "false" || hdr.Header.Get("x-kvgate-endpoint") != d.ep {
			t.Fatalf("%s: %+v %v", d.model, cc, hdr.Header)
		}
		checkBody("chat")
		_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: d.model, Messages: msgs,
			MaxTokens: openai.Int(3), Tools: []openai.ChatCompletionToolParam{weatherTool}})
		if err != nil {
			t.Fatal(err)
		}
		checkBody("chat with tools")
		if !strings.Contains(string(d.e.LastChatBody()), `"tools":[`) {
			t.Fatal("tools not forwarded")
		}
		stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: d.model, Messages: msgs,
			MaxTokens: openai.Int(4), Tools: []openai.ChatCompletionToolParam{weatherTool},
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}}, option.WithResponseInto(&hdr))
		chunks, usage := 0, int64(0)
		for stream.Next() {
			ch := stream.Current()
			if ch.Object != "chat.completion.chunk" {
				t.Fatalf("chunk object %q", ch.Object)
			}
			chunks++
			usage = max(usage, ch.Usage.PromptTokens)
		}
		if err := stream.Err(); err != nil || chunks < 4 || usage == 0 || hdr.Header.Get(sim.HeaderPromptTokenized) != "false" {
			t.Fatalf("%s stream: %v, %d chunks, usage %d, %v", d.model, err, chunks, usage, hdr.Header)
		}
		checkBody("stream")
		if n := d.e.PromptsTokenized(); n != 0 {
			t.Fatalf("%s: the engine tokenized %d prompts", d.model, n)
		}
		// An image part: the gateway cannot tokenize it exactly, so the body goes as sent (the engine
		// answers; this simulated text model refuses images with its own 400) and the skip is counted.
		skipped := fmt.Sprintf(`kvgate_token_ids_skipped_total{endpoint="%s",reason="multimodal"}`, d.ep)
		_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: d.model, MaxTokens: openai.Int(2),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage([]openai.ChatCompletionContentPartUnionParam{
				openai.TextContentPart("What is in this picture?"),
				openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: "data:image/png;base64,iVBORw0KGgo="})})}})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 {
			t.Fatalf("%s image: %v", d.model, err)
		}
		if got := string(d.e.LastChatBody()); got != string(rec.last()) {
			t.Fatalf("%s image: engine got %s, client sent %s", d.model, got, rec.last())
		}
		if v := scrapeSample(t, g, skipped); v != 1 {
			t.Fatalf("%s = %v", skipped, v)
		}
	}
	// A client that set the field itself wins, counted as client_set.
	body := `{"model":"qwen3","max_tokens":2,"messages":[{"role":"user","content":"hi"}],"kv_transfer_params":{"prompt_token_ids":[9,8,7]}}`
	if st, _, b := post(t, "http://"+g.Addr()+"/v1/chat/completions", body); st != 200 || string(vllm.LastChatBody()) != body {
		t.Fatalf("client-set: %d %s; engine got %s", st, b, vllm.LastChatBody())
	}
	if v := scrapeSample(t, g, `kvgate_token_ids_skipped_total{endpoint="v0",reason="client_set"}`); v != 1 {
		t.Fatalf("client_set skips = %v", v)
	}
	// continue_final_message on a final message the rendered prompt does not contain (Qwen3's template
	// re-renders the reasoning): the gateway forwards it as sent and the engine answers it (here, as vLLM
	// and transformers do, with a 400).
	body = `{"model":"qwen3","max_tokens":2,"add_generation_prompt":false,"continue_final_message":true,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"<think>abc</think>The answer"}]}`
	if st, _, b := post(t, "http://"+g.Addr()+"/v1/chat/completions", body); st != 400 || string(vllm.LastChatBody()) != body ||
		!strings.Contains(string(b), "continue_final_message") {
		t.Fatalf("continue_final_message: %d %s; engine got %s", st, b, vllm.LastChatBody())
	}
	if v := scrapeSample(t, g, `kvgate_token_ids_skipped_total{endpoint="v0",reason="continue_final_message"}`); v != 1 {
		t.Fatalf("continue_final_message skips = %v", v)
	}
}

// The drift guard: an engine whose template differs from the start never gets token IDs (its probes
// mismatch before any traffic); once it matches it does; a drift raised later is caught by a sampled
// request check, after which it gets original bodies (no client request fails); lifted, it gets tokens again.
func TestDriftGuard(t *testing.T) {
	e := dialectSim(t, sim.APIVLLM, "qwen3", func(c *sim.Config) { c.Faults.TemplateDrift = true })
	g := startGateway(t, gwYAML(fmt.Sprintf("      - {id: e0, engine: vllm, url: \"http://%s\"}\n", e.HTTPAddr()),
		"verify_token_ids_every: 2\ntoken_ids_resume_matches: 2\ntoken_ids_recheck_interval: 100ms\n"))
	base := "http://" + g.Addr() + "/v1/chat/completions"
	chat := func(i int) {
		t.Helper()
		body := fmt.Sprintf(`{"model":"qwen3","max_tokens":2,"messages":[{"role":"user","content":"question number %d, about drift"}]}`, i)
		if st, _, b := post(t, base, body); st != 200 {
			t.Fatalf("request %d failed: %d %s", i, st, b)
		}
	}
	setDrift := func(on bool) {
		f := e.Faults()
		f.TemplateDrift = on
		if err := e.SetFaults(f); err != nil {
			t.Fatal(err)
		}
	}
	verified := func() bool { return readyTokens(t, g)["e0"].Verified }
	mismatches := func() float64 {
		return scrapeSample(t, g, `kvgate_token_ids_mismatch_total{endpoint="e0",model="qwen3"}`)
	}

	// 1. Drifted from the start: the probes caught it; every request goes original (the engine tokenizes).
	st := readyTokens(t, g)["e0"]
	if st.Verified || st.LastMismatch == nil || !strings.HasPrefix(st.LastMismatch.Check, "probe:") || mismatches() < 1 {
		t.Fatalf("start: %+v, mismatches %v", st, mismatches())
	}
	if p := st.LastMismatch.Position; p != 2 || len(st.LastMismatch.GatewayTokens) == 0 ||
		st.LastMismatch.GatewayTokens[p] == st.LastMismatch.EngineTokens[p] {
		t.Fatalf("mismatch detail: %+v", st.LastMismatch)
	}
	for i := range 4 {
		chat(i)
	}
	if n := e.PromptsTokenized(); n != 4 {
		t.Fatalf("drifted engine tokenized %d of 4 prompts: some carried token IDs", n)
	}
	if v := scrapeSample(t, g, `kvgate_token_ids_skipped_total{endpoint="e0",reason="unverified"}`); v != 4 {
		t.Fatalf("unverified skips = %v", v)
	}

	// 2. Lifted: two matching probe rounds, then token IDs.
	setDrift(false)
	if !waitFor(5*time.Second, verified) {
		t.Fatalf("never verified after the drift was lifted: %+v", readyTokens(t, g)["e0"])
	}
	for i := 10; i < 14; i++ {
		chat(i)
	}
	if n := e.PromptsTokenized(); n != 4 {
		t.Fatalf("verified engine tokenized %d more prompts", n-4)
	}

	// 3. Drift raised while verified: requests keep succeeding; a sampled check catches it (WithdrawnBy:
	// the probe rounds that follow replace LastMismatch).
	before := mismatches()
	setDrift(true)
	sent := 0
	for i := 20; i < 60 && verified(); i++ {
		chat(i)
		sent++
		time.Sleep(20 * time.Millisecond)
	}
	if verified() {
		t.Fatal("sampled checks never caught the drift")
	}
	st = readyTokens(t, g)["e0"]
	if mismatches() <= before || st.LastMismatch == nil || st.WithdrawnBy != "sample" {
		t.Fatalf("after drift: %+v, mismatches %v (before %v)", st, mismatches(), before)
	}
	tok := e.PromptsTokenized()
	for i := 100; i < 103; i++ {
		chat(i)
	}
	if n := e.PromptsTokenized() - tok; n != 3 {
		t.Fatalf("after the mismatch %d of 3 requests went original", n)
	}

	// 4. Lifted again: token IDs resume after two matching checks.
	setDrift(false)
	if !waitFor(5*time.Second, verified) {
		t.Fatal("never verified again")
	}
	tok = e.PromptsTokenized()
	for i := 200; i < 203; i++ {
		chat(i)
	}
	if n := e.PromptsTokenized() - tok; n != 0 {
		t.Fatalf("%d requests went original after recovery", n)
	}
}
