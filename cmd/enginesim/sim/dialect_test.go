package sim

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"testing"
)

// shapes are the field names and /tokenize shapes quoted from vLLM's and SGLang's sources.
type shapes struct {
	VLLM struct {
		Tokenize struct {
			Route    string   `json:"route"`
			Response []string `json:"response"`
		} `json:"tokenize"`
	} `json:"vllm"`
	SGLang struct {
		Tokenize struct {
			Route    string   `json:"route"`
			Response []string `json:"response"`
		} `json:"tokenize"`
	} `json:"sglang"`
}

func loadShapes(t *testing.T) shapes {
	b, err := os.ReadFile("testdata/dialects.json")
	if err != nil {
		t.Fatal(err)
	}
	return decode[shapes](t, b)
}

func keys(t *testing.T, b []byte) []string {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

const dialectChat = `{"model":"qwen3","max_tokens":2,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Name a prime number."}]`

// Each dialect honours its own field, ignores the others (tokenizing the messages itself, as that engine
// does) and says which it did; /tokenize answers chat bodies in the engine's shape; the template-drift
// fault changes what the engine renders but not requests that bring their token IDs.
func TestDialects(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skips loading the Qwen3 tokenizer")
	}
	sh := loadShapes(t)
	vllm := startEngine(t, func(c *Config) { c.Model = qwen3Dir; c.ServedModelNames = []string{"qwen3"} })
	sgl := startEngine(t, func(c *Config) { c.Model = qwen3Dir; c.ServedModelNames = []string{"qwen3"}; c.API = APISGLang })

	// The engine's own tokens for the chat, from each dialect's /tokenize.
	vt := post(t, vllm, sh.VLLM.Tokenize.Route[len("POST "):], dialectChat+`}`)
	st := post(t, sgl, sh.SGLang.Tokenize.Route[len("POST "):], dialectChat+`}`)
	want := func(sk []string) []string { s := slices.Clone(sk); sort.Strings(s); return s }
	if vt.status != 200 || !reflect.DeepEqual(keys(t, vt.body), want(sh.VLLM.Tokenize.Response)) {
		t.Fatalf("vLLM /tokenize: %d %s", vt.status, vt.body)
	}
	if st.status != 200 || !reflect.DeepEqual(keys(t, st.body), want(sh.SGLang.Tokenize.Response)) {
		t.Fatalf("SGLang /v1/tokenize: %d %s", st.status, st.body)
	}
	type tok struct {
		Tokens []uint32 `json:"tokens"`
		Count  int      `json:"count"`
	}
	ids := decode[tok](t, vt.body)
	if s := decode[tok](t, st.body); !slices.Equal(s.Tokens, ids.Tokens) || ids.Count != len(ids.Tokens) || len(ids.Tokens) < 10 {
		t.Fatalf("the dialects tokenize the chat differently: %v / %v", ids, s)
	}
	if r := post(t, sgl, "/tokenize", dialectChat+`}`); r.status != 404 {
		t.Fatalf("SGLang mode serves vLLM's /tokenize: %d", r.status)
	}
	if r := post(t, sgl, "/v1/tokenize", `{"prompt":"a","messages":[{"role":"user","content":"b"}]}`); r.status != 400 {
		t.Fatalf("SGLang /v1/tokenize with prompt and messages: %d %s", r.status, r.body)
	}
	if r := post(t, sgl, "/v1/tokenize", `{"prompt":["a b","c"]}`); r.status != 200 || !reflect.DeepEqual(keys(t, r.body), want(sh.SGLang.Tokenize.Response)) {
		t.Fatalf("SGLang /v1/tokenize prompt list: %d %s", r.status, r.body)
	}

	// The load gauges' names per dialect are checked with the gateway's parser in gateway/internal/endpoints
	// (TestParseSimulatorDialects).

	fake := seqTokens(40, 100) // not the chat's tokens: usage shows which prompt the engine ran
	list, _ := json.Marshal(fake)
	L := string(list)
	cases := []struct {
		e         *Engine
		extra     string
		tokenized bool
	}{
		{vllm, `,"kv_transfer_params":{"do_remote_decode":false,"prompt_token_ids":` + L + `}`, false},
		{vllm, `,"prompt_token_ids":` + L, false},
		{vllm, `,"kv_transfer_params":{"prompt_token_ids":[]}`, true},
		{vllm, `,"input_ids":` + L, true},
		{sgl, `,"input_ids":` + L, false},
		{sgl, `,"prompt_token_ids":` + L, true},
		{sgl, `,"kv_transfer_params":{"prompt_token_ids":` + L + `}`, true},
	}
	for i, tc := range cases {
		before := tc.e.PromptsTokenized()
		for _, stream := range []bool{false, true} {
			body := dialectChat + tc.extra + `,"stream":` + strconv.FormatBool(stream) + `,"stream_options":` + map[bool]string{false: "null", true: `{"include_usage":true}`}[stream] + `}`
			r := post(t, tc.e, "/v1/chat/completions", body)
			if r.status != 200 || r.header.Get(HeaderPromptTokenized) != strconv.FormatBool(tc.tokenized) {
				t.Fatalf("case %d stream=%v: %d %s=%q %s", i, stream, r.status, HeaderPromptTokenized, r.header.Get(HeaderPromptTokenized), r.body)
			}
			var usage []byte = r.body
			if stream {
				ev := sseEvents(t, r.body)
				usage = []byte(ev[len(ev)-2])
			}
			u := decode[struct {
				Usage struct {
					PromptTokens int `json:"prompt_tokens"`
				} `json:"usage"`
			}](t, usage)
			wantN := len(fake)
			if tc.tokenized {
				wantN = len(ids.Tokens)
			}
			if u.Usage.PromptTokens != wantN {
				t.Fatalf("case %d stream=%v: prompt_tokens %d, want %d", i, stream, u.Usage.PromptTokens, wantN)
			}
			if string(tc.e.LastChatBody()) != body {
				t.Fatalf("case %d: LastChatBody %s", i, tc.e.LastChatBody())
			}
		}
		n := int64(0)
		if tc.tokenized {
			n = 2
		}
		if got := tc.e.PromptsTokenized() - before; got != n {
			t.Fatalf("case %d: prompts tokenized +%d, want +%d", i, got, n)
		}
	}
	if got := metric(t, vllm, `enginesim:prompts_tokenized_total{model_name="qwen3"}`); got != float64(vllm.PromptsTokenized()) || got != 4 {
		t.Fatalf("enginesim:prompts_tokenized_total = %v (PromptsTokenized %d)", got, vllm.PromptsTokenized())
	}

	// Template drift: /tokenize and self-tokenized requests see the changed template; /tokenize is not counted.
	for _, e := range []*Engine{vllm, sgl} {
		path := "/tokenize"
		if e == sgl {
			path = "/v1/tokenize"
		}
		before := e.PromptsTokenized()
		f := e.Faults()
		f.TemplateDrift = true
		if err := e.SetFaults(f); err != nil {
			t.Fatal(err)
		}
		d := decode[tok](t, post(t, e, path, dialectChat+`}`).body)
		if slices.Equal(d.Tokens, ids.Tokens) || len(d.Tokens) < 3 || d.Tokens[2] == ids.Tokens[2] { // "system\n" gains a newline
			t.Fatalf("%s with template_drift: %v (undrifted %v)", path, d.Tokens, ids.Tokens)
		}
		if r := post(t, e, "/v1/chat/completions", dialectChat+`}`); r.status != 200 ||
			decode[struct {
				Usage struct {
					PromptTokens int `json:"prompt_tokens"`
				} `json:"usage"`
			}](t, r.body).Usage.PromptTokens != len(d.Tokens) {
			t.Fatalf("drifted chat: %s", r.body)
		}
		f.TemplateDrift = false
		e.SetFaults(f)
		if u := decode[tok](t, post(t, e, path, dialectChat+`}`).body); !slices.Equal(u.Tokens, ids.Tokens) {
			t.Fatalf("drift lifted: %v", u.Tokens)
		}
		if got := e.PromptsTokenized() - before; got != 1 {
			t.Fatalf("%s: /tokenize counted as tokenized prompts (+%d, want +1 for the one chat)", path, got)
		}
	}
}
