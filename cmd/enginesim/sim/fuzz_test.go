package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"testing"
)

// FuzzParsePrompts: any completions prompt either parses into token lists or fails with a 400
// RequestError, never a panic; token-ID input round-trips.
func FuzzParsePrompts(f *testing.F) {
	for _, s := range []string{`"hello"`, `[1,2,3]`, `["a","b"]`, `[[1],[2,3]]`, `["a",[1]]`, `[]`, `[-1]`, `null`,
		`{"a":1}`, `[[]]`, `[1.5]`, `[4294967296]`, `[[1],"x",[]]`, `"\u00e9\ud83d\ude00"`} {
		f.Add([]byte(s))
	}
	e := &Engine{model: byteModel{}}
	f.Fuzz(func(t *testing.T, raw []byte) {
		prompts, err := e.parsePrompts(raw)
		if err != nil {
			re, ok := errors.AsType[*RequestError](err)
			if !ok || re.Status != 400 {
				t.Fatalf("error %T %v", err, err)
			}
			return
		}
		if len(prompts) == 0 {
			t.Fatal("no prompts and no error")
		}
		var ids []uint32
		if json.Unmarshal(raw, &ids) == nil && len(ids) > 0 {
			if len(prompts) != 1 || len(prompts[0]) != len(ids) {
				t.Fatalf("token list %v parsed as %v", ids, prompts)
			}
		}
	})
}

// FuzzKVEventsConfig: --kv-events-config either parses (with vLLM's defaults filled) or fails with a
// *ConfigError.
func FuzzKVEventsConfig(f *testing.F) {
	for _, s := range []string{`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}`,
		`{}`, `{"buffer_steps":-1}`, `{"topic":"kv@x"}`, `[]`, `{"publisher":null}`, `{"hwm":"x"}`, ``} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseKVEventsConfig(s)
		if err != nil {
			if _, ok := errors.AsType[*ConfigError](err); !ok {
				t.Fatalf("error %T %v", err, err)
			}
			return
		}
		if c.Publisher == "" || c.Endpoint == "" {
			t.Fatalf("defaults not filled: %+v", c)
		}
	})
}

// FuzzChatBody: the byte-level chat renderer and the request decoding never panic; errors are 400s.
func FuzzChatBody(f *testing.F) {
	for _, s := range []string{`{"messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"}]}]}`,
		`{"messages":[]}`, `{"messages":[{"content":"x"}]}`, `{"messages":[{"role":"u","content":5}]}`, `{`, `null`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		prompt, ids, err := byteModel{}.EncodeChat(body)
		if err != nil {
			if re, ok := errors.AsType[*RequestError](err); !ok || re.Status != 400 {
				t.Fatalf("error %T %v", err, err)
			}
			return
		}
		if len(ids) != len(prompt) || !bytes.HasSuffix([]byte(prompt), []byte("<|assistant|>\n")) {
			t.Fatalf("prompt %q with %d ids", prompt, len(ids))
		}
	})
}

// FuzzJSONInt: an integer request field (max_tokens) either decodes or fails, never panics; integer literals
// keep their value (saturated at the int bounds) and fractional numbers are refused.
func FuzzJSONInt(f *testing.F) {
	for _, s := range []string{`2`, `2.0`, `2.5`, `-1`, `1e3`, `1e30`, `-1e30`, `9223372036854775807`,
		`9223372036854775808`, `-9223372036854775809`, `"2"`, `null`, `true`, `[]`, `0.0000001`, `-0`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var p struct {
			N *jsonInt `json:"n"`
		}
		body := append(append([]byte(`{"n":`), raw...), '}')
		if err := json.Unmarshal(body, &p); err != nil || p.N == nil {
			return
		}
		var exact int64
		if json.Unmarshal(raw, &exact) == nil && int64(*p.N) != exact {
			t.Fatalf("%s decoded as %d", raw, *p.N)
		}
		var fl float64
		if json.Unmarshal(raw, &fl) != nil || fl != math.Trunc(fl) {
			t.Fatalf("%s accepted as %d but is not an integral number", raw, *p.N)
		}
	})
}
