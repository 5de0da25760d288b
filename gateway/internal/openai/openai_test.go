package openai

import (
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

func TestParseRequest(t *testing.T) {
	r, err := ParseRequest(Chat, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_completion_tokens":7,"cache_salt":"s","x_unknown":{"a":1}}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Model != "m" || !r.Stream || r.MaxTokens != 7 || r.CacheSalt != "s" || r.HasPromptTokenIDs {
		t.Fatalf("%+v", r)
	}
	r, err = ParseRequest(Completions, []byte(`{"model":"m","prompt":[[1,2,3],[4]]}`))
	if err != nil || !r.PromptIsIDs || !reflect.DeepEqual(r.PromptIDs, []uint32{1, 2, 3}) || r.MaxTokens != -1 {
		t.Fatalf("%+v %v", r, err)
	}
	r, err = ParseRequest(Completions, []byte(`{"model":"m","prompt":["a","b"]}`))
	if err != nil || r.PromptText != "a" {
		t.Fatalf("%+v %v", r, err)
	}
}

func TestParseRequestErrors(t *testing.T) {
	cases := []struct {
		api         API
		body, param string
	}{
		{Chat, `{"model":"m","messages":[]`, ""},
		{Chat, `[1]`, ""},
		{Chat, `{"messages":[{}]}`, "model"},
		{Chat, `{"model":3,"messages":[{}]}`, "model"},
		{Chat, `{"model":"m","messages":{}}`, "messages"},
		{Chat, `{"model":"m","messages":[{}],"stream":"yes"}`, "stream"},
		{Chat, `{"model":"m","messages":[{}],"max_tokens":-1}`, "max_tokens"},
		{Chat, `{"model":"m","messages":[{}],"max_tokens":1.5}`, "max_tokens"},
		{Completions, `{"model":"m"}`, "prompt"},
		{Completions, `{"model":"m","prompt":[1,"a"]}`, "prompt"},
		{Completions, `{"model":"m","prompt":[5000000000]}`, "prompt"},
		{Completions, `{"model":"m","prompt":[]}`, "prompt"},
	}
	for _, tc := range cases {
		_, err := ParseRequest(tc.api, []byte(tc.body))
		var oe *Error
		if !errors.As(err, &oe) || oe.Status != http.StatusBadRequest {
			t.Fatalf("%s: err %v", tc.body, err)
		}
		if want := str(tc.param); oe.Param != want {
			t.Errorf("%s: param %v, want %v", tc.body, oe.Param, want)
		}
	}
}

func TestErrorJSONShape(t *testing.T) {
	var v map[string]map[string]any
	if err := json.Unmarshal(ModelNotFound("x").JSON(), &v); err != nil {
		t.Fatal(err)
	}
	e := v["error"]
	if e["type"] != "invalid_request_error" || e["param"] != "model" || e["code"] != "model_not_found" || e["message"] == "" {
		t.Fatalf("%v", e)
	}
	if err := json.Unmarshal(BadRequest("", "x").JSON(), &v); err != nil {
		t.Fatal(err)
	}
	if _, ok := v["error"]["param"]; !ok || v["error"]["param"] != nil {
		t.Fatalf("param must be present and null: %v", v)
	}
}

func TestSplice(t *testing.T) {
	in := []byte(` { "model":"m", "messages":[], "zz_unknown": [1, 2] }`)
	got := string(SpliceChatTokenIDs(in, []uint32{1, 22, 333}))
	want := ` {"prompt_token_ids":[1,22,333], "model":"m", "messages":[], "zz_unknown": [1, 2] }`
	if got != want {
		t.Fatalf("got %s", got)
	}
	if got := string(SpliceChatTokenIDs([]byte(`{ }`), []uint32{4})); got != `{"prompt_token_ids":[4] }` {
		t.Fatalf("empty object: %s", got)
	}
	out, err := SpliceCompletionPrompt([]byte(`{"prompt": "hello",  "keep":  {"a": "b"}}`), []uint32{9, 8})
	if err != nil || string(out) != `{"prompt": [9,8],  "keep":  {"a": "b"}}` {
		t.Fatalf("%s %v", out, err)
	}
	// A repeated key: the last "prompt" is the one ParseRequest tokenized and the engine reads.
	out, err = SpliceCompletionPrompt([]byte(`{"prompt":"a","x":{"prompt":"in"},"prompt" : "b\"}"}`), []uint32{7})
	if err != nil || string(out) != `{"prompt":"a","x":{"prompt":"in"},"prompt" : [7]}` {
		t.Fatalf("repeated prompt: %s %v", out, err)
	}
	body := []byte(`{"model":"m", "prompt": "hi \"there\"" ,"n":1}`)
	r, err := ParseRequest(Completions, body)
	if err != nil || string(body[r.PromptSpan[0]:r.PromptSpan[1]]) != `"hi \"there\""` {
		t.Fatalf("prompt span %v of %s (%v)", r.PromptSpan, body, err)
	}
	if out, err := r.SplicePromptJSON(body, []byte("[5]")); err != nil || string(out) != `{"model":"m", "prompt": [5] ,"n":1}` {
		t.Fatalf("splice at span: %s %v", out, err)
	}
	if _, err := SpliceCompletionPrompt([]byte(`{"model":"m"}`), []uint32{7}); err == nil {
		t.Fatal("no prompt: no error")
	}
}

func FuzzParseRequest(f *testing.F) {
	f.Add(uint8(1), []byte(`{"model":"m","messages":[{"role":"user","content":"x"}]}`))
	f.Add(uint8(2), []byte(`{"model":"m","prompt":[[1,2],[3]],"max_tokens":3}`))
	f.Add(uint8(1), []byte(`{"model":"m","messages":[{}],"max_completion_tokens":9223372036854775807}`))
	f.Add(uint8(2), []byte(`{"model":"m","prompt":"x","max_tokens":2.0,"max_completion_tokens":-1e400}`))
	f.Fuzz(func(t *testing.T, api uint8, body []byte) {
		a := API(api%2 + 1)
		r, err := ParseRequest(a, body)
		if a == Chat {
			checkChatAgainstGJSON(t, body, r, err)
		}
		if err != nil {
			var oe *Error
			if !errors.As(err, &oe) || oe.Status != 400 {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if r.Model == "" {
			t.Fatal("accepted without model")
		}
		if r.MaxTokens < -1 || r.MaxTokens > MaxTokensCap || r.N < 1 || r.N > MaxNCap {
			t.Fatalf("max tokens %d outside [-1, MaxTokensCap] or n %d outside [1, MaxNCap]", r.MaxTokens, r.N)
		}
		if a == Chat {
			if r.Chat == nil || r.Chat.Messages() < 1 {
				t.Fatal("chat request without its decoded messages")
			}
			if !json.Valid(SpliceChatTokenIDs(body, []uint32{1, 2})) {
				t.Fatalf("splice made invalid JSON from %q", body)
			}
		} else if out, err := SpliceCompletionPrompt(body, []uint32{1}); err != nil || !json.Valid(out) {
			t.Fatalf("splice prompt: %v %q", err, out)
		} else if r.SinglePrompt && !r.PromptIsIDs {
			// The prompt an engine decodes (the last "prompt", as encoding/json and Python's json keep) is the IDs.
			var sent struct{ Prompt json.RawMessage }
			if err := json.Unmarshal(out, &sent); err != nil || string(sent.Prompt) != "[1]" {
				t.Fatalf("splice prompt: the engine would read %q (%v) from %q", sent.Prompt, err, out)
			}
			// At the parsed span, the same bytes as the scan.
			if at, err := r.SplicePromptJSON(body, []byte("[1]")); err != nil || string(at) != string(out) {
				t.Fatalf("splice at span %v: %v\n%q\nwant %q", r.PromptSpan, err, at, out)
			}
		}
	})
}

// max_tokens and max_completion_tokens: non-negative integers, integral floats accepted (OpenAI and vLLM
// take 2.0), and huge values read as MaxTokensCap so prompt + n × max_tokens cannot overflow.
func TestMaxTokensValues(t *testing.T) {
	for raw, want := range map[string]int64{
		`0`: 0, `7`: 7, `2.0`: 2, `7e2`: 700, `-0`: 0, `-0.0`: 0, `4294967296`: MaxTokensCap,
		`4294967297`: MaxTokensCap, `9223372036854775807`: MaxTokensCap, `9223372036854775808`: MaxTokensCap,
		`1e30`: MaxTokensCap, `1e400`: MaxTokensCap, `null`: -1,
	} {
		for _, field := range []string{"max_tokens", "max_completion_tokens"} {
			r, err := ParseRequest(Chat, []byte(`{"model":"m","messages":[{}],"`+field+`":`+raw+`}`))
			if err != nil || r.MaxTokens != want {
				t.Errorf("%s=%s: %v %v, want %d", field, raw, r, err, want)
			}
		}
	}
	for _, raw := range []string{`-1`, `2.5`, `-9223372036854775809`, `-1e400`, `"7"`, `true`, `[1]`, `1e-1`} {
		_, err := ParseRequest(Completions, []byte(`{"model":"m","prompt":"x","max_tokens":`+raw+`}`))
		if oe, ok := errors.AsType[*Error](err); !ok || oe.Status != 400 || oe.Param != "max_tokens" {
			t.Errorf("max_tokens=%s: %v", raw, err)
		}
	}
}

// n: a positive integer (integral floats accepted), 1 when absent; huge values read as MaxNCap.
func TestNValues(t *testing.T) {
	for raw, want := range map[string]int64{`absent`: 1, `null`: 1, `1`: 1, `3`: 3, `2.0`: 2, `1e9`: MaxNCap} {
		body := `{"model":"m","prompt":"x","n":` + raw + `}`
		if raw == "absent" {
			body = `{"model":"m","prompt":"x"}`
		}
		r, err := ParseRequest(Completions, []byte(body))
		if err != nil || r.N != want {
			t.Errorf("n=%s: %v %v, want %d", raw, r, err, want)
		}
	}
	for _, raw := range []string{`0`, `-1`, `1.5`, `"2"`} {
		_, err := ParseRequest(Chat, []byte(`{"model":"m","messages":[{}],"n":`+raw+`}`))
		if oe, ok := errors.AsType[*Error](err); !ok || oe.Status != 400 || oe.Param != "n" {
			t.Errorf("n=%s: %v", raw, err)
		}
	}
}

// checkChatAgainstGJSON compares the one-scan chat parse with the gjson reference: the same fields, or
// errors on the same parameter. The one difference allowed: nesting deeper than the template decoder
// takes (128) is refused at once (gjson accepted it and the render refused it later, also with a 400).
func checkChatAgainstGJSON(t *testing.T, body []byte, r *Request, err error) {
	t.Helper()
	want, werr := referenceParse(Chat, body)
	if werr == nil && err != nil && strings.Contains(err.Error(), "nested too deeply") {
		return
	}
	if (err == nil) != (werr == nil) {
		t.Fatalf("%q: one scan: %v; gjson: %v", body, err, werr)
	}
	if err != nil {
		oe, _ := errors.AsType[*Error](err)
		we, _ := errors.AsType[*Error](werr)
		if oe == nil || we == nil || oe.Param != we.Param || oe.Status != we.Status {
			t.Fatalf("%q: one scan: %v; gjson: %v", body, err, werr)
		}
		return
	}
	got := *r
	got.Chat = nil
	if !reflect.DeepEqual(&got, want) {
		t.Fatalf("%q: one scan %+v, gjson %+v", body, got, *want)
	}
}

// TestParseChatMatchesGJSON runs the comparison on hand-picked bodies (the fuzz target covers the rest).
func TestParseChatMatchesGJSON(t *testing.T) {
	for _, body := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_completion_tokens":7,"cache_salt":"s"}`,
		` {"model":"a\u00e9\"b" , "messages" : [ {} ] , "n" : 2.0, "stream": null, "max_tokens": 1e400 } `,
		`{"model":"m","messages":[{}],"model":"n","prompt_token_ids":[1,2]}`,
		`{"model":"m","messages":[{}],"cache_salt":"x\ny"}`,
		`{"model":"m","messages":[{}],"cache_salt":5}`,
		`{"model":"","messages":[{}]}`,
		`{"model":"m","messages":[]}`,
		`{"model":"m","messages":"x"}`,
		`{"model":"m"}`,
		`{"model":"m","messages":[{}],"stream":1}`,
		`{"model":"m","messages":[{}],"n":0}`,
		`{"model":"m","messages":[{}],"add_generation_prompt":"maybe"}`,
		`{"model":"m","messages":[{}]} x`,
		`{"model":"m","messages":[{}],}`,
		`"x"`, `[]`, ``, `   `,
		"{\"model\":\"m\xff\",\"messages\":[{}]}",
	} {
		r, err := ParseRequest(Chat, []byte(body))
		checkChatAgainstGJSON(t, []byte(body), r, err)
	}
	deep := `{"model":"m","messages":[{}],"x":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}`
	if _, err := ParseRequest(Chat, []byte(deep)); err == nil || !strings.Contains(err.Error(), "nested too deeply") {
		t.Fatalf("deep body: %v", err)
	}
}
