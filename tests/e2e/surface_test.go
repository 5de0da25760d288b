package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go"
	"github.com/openai/openai-go/option"
	"github.com/openai/openai-go/responses"

	"github.com/kvgate/kvgate/cmd/kvgate-bench/harness"
	"github.com/kvgate/kvgate/kvstore/testenv"
)

// tokenizeGolden is testdata/tokenize_golden.json (IDs from HF tokenizers, the render from HF's Jinja).
type tokenizeGolden struct {
	Prompt     string              `json:"prompt"`
	PromptIDs  []int64             `json:"prompt_ids"`
	StrsPrompt string              `json:"strs_prompt"`
	Strs       []string            `json:"strs"`
	Messages   []map[string]string `json:"messages"`
	ChatIDs    []int64             `json:"chat_ids"`
	ChatRender string              `json:"chat_render"`
}

func readTokenizeGolden(t *testing.T) tokenizeGolden {
	t.Helper()
	b, err := os.ReadFile("testdata/tokenize_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g tokenizeGolden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

// The OpenAI routes beyond chat and completions, through the official openai-go client: a model object
// and a 404 in OpenAI's shape; Responses routed on its prefix (the second identical request lands on the
// same endpoint with cached tokens; the message-item spelling of the same conversation hits the same cache,
// streamed as Responses events); a Responses request with tools routed on load and said so; embeddings;
// /tokenize and /detokenize answered by the gateway with HF's IDs.
func TestOpenAISurfaceGo(t *testing.T) {
	t.Parallel() // waits on its own engines and gateway only; asserts no latency bound
	env := newEnv(t)
	engines := env.Engines("e", 2, harness.EngineOptions{TimeScale: 0.05})
	g := env.Gateway("g0", memoryConfig(env.Model(engines, 64, 1_000_000)))
	c := client(g)
	ctx := context.Background()

	// GET /v1/models/{id}
	m, err := c.Models.Get(ctx, model)
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != model || m.Object != "model" || m.OwnedBy != "kvgate" || m.Created == 0 {
		t.Fatalf("model object: %+v", m)
	}
	_, err = c.Models.Get(ctx, "no-such-model")
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" ||
		apiErr.Type != "invalid_request_error" || !strings.Contains(apiErr.Message, "no-such-model") {
		t.Fatalf("unknown model: %v", err)
	}

	// POST /v1/responses, text input with instructions: routed on the prefix.
	r := rand.New(rand.NewPCG(7, 8))
	instructions := "You answer in one sentence. " + words(r, 80)
	question := "Summarise: " + words(r, 30)
	var raw *http.Response
	res, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: model, Instructions: openai.String(instructions),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(question)}, MaxOutputTokens: openai.Int(6)},
		option.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	first := raw.Header.Get("x-kvgate-endpoint")
	if raw.Header.Get("x-kvgate-routing") != "kv-aware" || !slices.Contains([]string{"e0", "e1"}, first) ||
		res.Usage.InputTokens < 100 || res.Usage.OutputTokens != 6 || res.OutputText() == "" || res.Status != "incomplete" {
		t.Fatalf("responses: routing %q endpoint %q, %+v", raw.Header.Get("x-kvgate-routing"), first, res.Usage)
	}
	res2, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: model, Instructions: openai.String(instructions),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(question)}, MaxOutputTokens: openai.Int(6)},
		option.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	if ep := raw.Header.Get("x-kvgate-endpoint"); ep != first || res2.Usage.InputTokensDetails.CachedTokens < res.Usage.InputTokens/16*16-16 {
		t.Fatalf("repeat: endpoint %q (first %q), cached %d of %d", ep, first, res2.Usage.InputTokensDetails.CachedTokens, res.Usage.InputTokens)
	}

	// The same conversation as message items (system + user), streamed: the same prompt tokens, so the same
	// endpoint and cache; the events are the Responses stream, passed through.
	items := responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage(instructions, responses.EasyInputMessageRoleSystem),
		responses.ResponseInputItemParamOfMessage(question, responses.EasyInputMessageRoleUser)}
	st := c.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: model,
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: items}}, option.WithResponseInto(&raw))
	var types []string
	var text strings.Builder
	var done responses.Response
	for st.Next() {
		ev := st.Current()
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta.OfString)
		case "response.completed":
			done = ev.Response
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if raw.Header.Get("x-kvgate-endpoint") != first || raw.Header.Get("x-kvgate-routing") != "kv-aware" {
		t.Fatalf("stream: endpoint %q routing %q", raw.Header.Get("x-kvgate-endpoint"), raw.Header.Get("x-kvgate-routing"))
	}
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
	if len(types) < 9 || !slices.Equal(types[:4], want) || types[len(types)-1] != "response.completed" ||
		!slices.Contains(types, "response.output_text.delta") {
		t.Fatalf("stream events: %v", types)
	}
	if done.Status != "completed" || done.OutputText() != text.String() || text.Len() == 0 ||
		done.Usage.InputTokens != res.Usage.InputTokens || done.Usage.InputTokensDetails.CachedTokens < res.Usage.InputTokens/16*16-16 {
		t.Fatalf("stream end: status %q text %q (deltas %q) usage %+v", done.Status, done.OutputText(), text.String(), done.Usage)
	}

	// Tools do not map onto the gateway's chat render: routed on load, and the header says why.
	_, err = c.Responses.New(ctx, responses.ResponseNewParams{Model: model,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(question)}, MaxOutputTokens: openai.Int(3),
		Tools: []responses.ToolUnionParam{responses.ToolParamOfFunction("lookup", map[string]any{"type": "object"}, false)}},
		option.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	if raw.Header.Get("x-kvgate-routing") != "load-based" || raw.Header.Get("x-kvgate-routing-reason") != "tools" {
		t.Fatalf("tools: routing %q reason %q", raw.Header.Get("x-kvgate-routing"), raw.Header.Get("x-kvgate-routing-reason"))
	}

	// POST /v1/embeddings: load-based; unit vectors of the engine's default length.
	emb, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: model,
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"alpha river", "cobalt granite lantern"}}},
		option.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	if raw.Header.Get("x-kvgate-routing") != "load-based" || raw.Header.Get("x-kvgate-routing-reason") != "embeddings" ||
		len(emb.Data) != 2 || emb.Data[1].Index != 1 || len(emb.Data[0].Embedding) != 64 || emb.Usage.PromptTokens < 4 {
		t.Fatalf("embeddings: routing %q, %d vectors, usage %+v", raw.Header.Get("x-kvgate-routing"), len(emb.Data), emb.Usage)
	}
	var norm float64
	for _, x := range emb.Data[0].Embedding {
		norm += x * x
	}
	if math.Abs(norm-1) > 1e-3 {
		t.Fatalf("embedding norm² %v", norm)
	}

	// /tokenize and /detokenize (vLLM's shapes), answered by the gateway: HF's IDs.
	gold := readTokenizeGolden(t)
	root := openai.NewClient(option.WithBaseURL(g.URL()+"/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	var tok struct {
		Count       int       `json:"count"`
		MaxModelLen int       `json:"max_model_len"`
		Tokens      []int64   `json:"tokens"`
		TokenStrs   *[]string `json:"token_strs"`
	}
	if err := root.Post(ctx, "tokenize", map[string]any{"model": model, "prompt": gold.Prompt}, &tok); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tok.Tokens, gold.PromptIDs) || tok.Count != len(gold.PromptIDs) || tok.TokenStrs != nil {
		t.Fatalf("tokenize prompt: %+v, want %v", tok, gold.PromptIDs)
	}
	if err := root.Post(ctx, "tokenize", map[string]any{"prompt": gold.StrsPrompt, "return_token_strs": true}, &tok); err != nil {
		t.Fatal(err)
	}
	if tok.TokenStrs == nil || !slices.Equal(*tok.TokenStrs, gold.Strs) {
		t.Fatalf("token_strs: %+v, want %q", tok, gold.Strs)
	}
	if err := root.Post(ctx, "tokenize", map[string]any{"model": model, "messages": gold.Messages}, &tok); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tok.Tokens, gold.ChatIDs) {
		t.Fatalf("tokenize chat: %v, want %v", tok.Tokens, gold.ChatIDs)
	}
	var detok struct {
		Prompt string `json:"prompt"`
	}
	if err := root.Post(ctx, "detokenize", map[string]any{"model": model, "tokens": gold.ChatIDs}, &detok); err != nil {
		t.Fatal(err)
	}
	if detok.Prompt != gold.ChatRender {
		t.Fatalf("detokenize: %q, want %q", detok.Prompt, gold.ChatRender)
	}
	err = root.Post(ctx, "detokenize", map[string]any{"model": model, "tokens": []int64{1 << 31}}, &detok)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != "tokens" {
		t.Fatalf("detokenize out of vocabulary: %v", err)
	}
	err = root.Post(ctx, "tokenize", map[string]any{"model": "nope", "prompt": "x"}, &tok)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
		t.Fatalf("tokenize unknown model: %v", err)
	}
}

// nodeSurface is what tests/e2e/node/surface.mjs prints.
type nodeSurface struct {
	Model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		OwnedBy string `json:"owned_by"`
	} `json:"model"`
	Missing struct {
		Status              int
		Code, Type, Message string
	} `json:"missing"`
	Responses []struct {
		Endpoint, Routing, Status, Text string
		InputTokens                     int64 `json:"input_tokens"`
		CachedTokens                    int64 `json:"cached_tokens"`
		OutputTokens                    int64 `json:"output_tokens"`
	} `json:"responses"`
	Stream struct {
		Endpoint, Routing, Deltas, Text string
		Types                           []string
		CachedTokens                    int64 `json:"cached_tokens"`
	} `json:"stream"`
	Embeddings struct {
		Routing, Reason string
		Count, Dims     int
		Norm2           float64
	} `json:"embeddings"`
	Tokenize struct {
		Tokens      []int64
		Count       int
		Detokenized string
	} `json:"tokenize"`
}

// The same routes through Node's official openai package (tests/e2e/node, installed by `make node-deps`):
// a model ID with a "/" (the SDK escapes it) is a 404 in OpenAI's shape, Responses (plain and streamed
// events) hit the cache on a repeat, embeddings arrive in the SDK's default base64 and decode to unit
// vectors, and /tokenize gives HF's IDs.
func TestOpenAISurfaceNode(t *testing.T) {
	node := testenv.Command(t, "node")
	if _, err := os.Stat("node/node_modules/openai/package.json"); err != nil {
		testenv.Missing(t, "Node's openai package is not installed in tests/e2e/node (run `make node-deps`): %v", err)
	}
	env := newEnv(t)
	engines := env.Engines("e", 2, harness.EngineOptions{TimeScale: 0.05})
	g := env.Gateway("g0", memoryConfig(env.Model(engines, 64, 1_000_000)))
	r := rand.New(rand.NewPCG(9, 10))
	instructions := "You answer in one sentence. " + words(r, 80)
	question := "Summarise: " + words(r, 30)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "node/surface.mjs", g.URL(), model, instructions, question)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	var got nodeSurface
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("node output %q: %v", b, err)
	}
	if got.Model.ID != model || got.Model.Object != "model" || got.Model.OwnedBy != "kvgate" {
		t.Fatalf("model: %+v", got.Model)
	}
	if got.Missing.Status != 404 || got.Missing.Code != "model_not_found" || !strings.Contains(got.Missing.Message, "no-such/model") {
		t.Fatalf("missing model: %+v", got.Missing)
	}
	a, c := got.Responses[0], got.Responses[1]
	if a.Routing != "kv-aware" || c.Endpoint != a.Endpoint || a.OutputTokens != 5 || a.Text == "" || a.Status != "incomplete" ||
		a.InputTokens < 100 || c.CachedTokens < a.InputTokens/16*16-16 {
		t.Fatalf("responses: %+v", got.Responses)
	}
	s := got.Stream
	if s.Endpoint != a.Endpoint || s.Routing != "kv-aware" || len(s.Types) < 9 || s.Types[0] != "response.created" ||
		s.Types[len(s.Types)-1] != "response.completed" || s.Deltas == "" || s.Text != s.Deltas || s.CachedTokens < a.InputTokens/16*16-16 {
		t.Fatalf("stream: %+v", s)
	}
	e := got.Embeddings
	if e.Routing != "load-based" || e.Reason != "embeddings" || e.Count != 2 || e.Dims != 64 || math.Abs(e.Norm2-1) > 1e-3 {
		t.Fatalf("embeddings: %+v", e)
	}
	gold := readTokenizeGolden(t)
	if !slices.Equal(got.Tokenize.Tokens, gold.PromptIDs) || got.Tokenize.Count != len(gold.PromptIDs) || got.Tokenize.Detokenized != gold.Prompt {
		t.Fatalf("tokenize: %+v", got.Tokenize)
	}
}
