package upstream

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/gateway/internal/openai"
)

func TestChatBodySplices(t *testing.T) {
	ids := []uint32{151644, 872, 0}
	cases := []struct {
		mode, in, want, skip string
	}{
		{config.ChatTokenIDsKVTransfer, `{"model":"m","messages":[]}`,
			`{"kv_transfer_params":{"prompt_token_ids":[151644,872,0]},"model":"m","messages":[]}`, ""},
		{config.ChatTokenIDsKVTransfer, `{"model":"m","kv_transfer_params":{"do_remote_decode":true} ,"z":1}`,
			`{"model":"m","kv_transfer_params":{"prompt_token_ids":[151644,872,0],"do_remote_decode":true} ,"z":1}`, ""},
		{config.ChatTokenIDsKVTransfer, `{"kv_transfer_params": { } }`,
			`{"kv_transfer_params": {"prompt_token_ids":[151644,872,0] } }`, ""},
		{config.ChatTokenIDsKVTransfer, `{"kv_transfer_params":null,"a":2}`,
			`{"kv_transfer_params":{"prompt_token_ids":[151644,872,0]},"a":2}`, ""},
		{config.ChatTokenIDsKVTransfer, `{"kv_transfer_params":{"x":1,"prompt_token_ids":[]}}`,
			`{"kv_transfer_params":{"x":1,"prompt_token_ids":[151644,872,0]}}`, ""},
		{config.ChatTokenIDsKVTransfer, `{"kv_transfer_params":{"prompt_token_ids":[5]}}`,
			`{"kv_transfer_params":{"prompt_token_ids":[5]}}`, SkipClientSet},
		{config.ChatTokenIDsKVTransfer, `{"kv_transfer_params":"x"}`, `{"kv_transfer_params":"x"}`, SkipInvalidField},
		// the last occurrence is the one the engine reads
		{config.ChatTokenIDsKVTransfer, `{"kv_transfer_params":{"prompt_token_ids":[5]},"kv_transfer_params":{}}`,
			`{"kv_transfer_params":{"prompt_token_ids":[5]},"kv_transfer_params":{"prompt_token_ids":[151644,872,0]}}`, ""},
		{config.ChatTokenIDsInputIDs, ` {"model":"m"}`, ` {"input_ids":[151644,872,0],"model":"m"}`, ""},
		{config.ChatTokenIDsInputIDs, `{}`, `{"input_ids":[151644,872,0]}`, ""},
		{config.ChatTokenIDsInputIDs, `{"input_ids":null}`, `{"input_ids":[151644,872,0]}`, ""},
		{config.ChatTokenIDsInputIDs, `{"input_ids":[1,2]}`, `{"input_ids":[1,2]}`, SkipClientSet},
		{config.ChatTokenIDsPromptTokenIDs, `{"model":"m","prompt_token_ids":[9]}`, `{"model":"m","prompt_token_ids":[9]}`, SkipClientSet},
		{config.ChatTokenIDsPromptTokenIDs, "{\n\"model\":\"m\"}", "{\"prompt_token_ids\":[151644,872,0],\n\"model\":\"m\"}", ""},
		{config.ChatTokenIDsOff, `{"model":"m"}`, `{"model":"m"}`, ""},
	}
	for _, tc := range cases {
		got, skip := ChatBody(tc.mode, []byte(tc.in), ids)
		if string(got) != tc.want || skip != tc.skip {
			t.Errorf("%s %s:\n got %s (%q)\nwant %s (%q)", tc.mode, tc.in, got, skip, tc.want, tc.skip)
		}
		if !json.Valid(got) {
			t.Errorf("%s %s: invalid JSON %s", tc.mode, tc.in, got)
		}
	}
}

func TestHasMediaParts(t *testing.T) {
	for body, want := range map[string]bool{
		`{"messages":[{"role":"user","content":"look at image_url\" here"}]}`:                                                     false,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`:                                                   false,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:x"}}]}]}`: true,
		`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"x","format":"wav"}}]}]}`:             true,
		`{"messages":[{"role":"user","content":[{"image_url":{"url":"x"}}]}]}`:                                                    true,
		`{"messages":[{"role":"user","content":[{"type":"video_url","video_url":{"url":"x"}}]}]}`:                                 true,
	} {
		if got := HasMediaParts([]byte(body)); got != want {
			t.Errorf("%s: %v", body, got)
		}
	}
}

// FuzzChatBody: whatever the client sent, the output is valid JSON, and removing what the gateway added
// gives back the client's members unchanged.
func FuzzChatBody(f *testing.F) {
	for _, s := range []string{`{"model":"m","messages":[]}`, `{"kv_transfer_params":{"a":1}}`, `{"kv_transfer_params":null}`,
		`{"input_ids":null,"x":[1,{"y":2}]}`, `{"prompt_token_ids":[1]}`, ` { } `, `{"kv_transfer_params":{"prompt_token_ids":null}}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"input_ids":null,"kv_transfer_params":{"a":1}}`,
		`{"model":"m","prompt_token_ids":[1],"messages":[{"role":"user","content":"x"}],"kv_transfer_params":{}}`} {
		f.Add(s, uint8(0))
	}
	modes := []string{config.ChatTokenIDsKVTransfer, config.ChatTokenIDsInputIDs, config.ChatTokenIDsPromptTokenIDs}
	f.Fuzz(func(t *testing.T, body string, m uint8) {
		var in map[string]any
		if json.Unmarshal([]byte(body), &in) != nil || in == nil { // only objects reach ChatBody
			return
		}
		mode := modes[int(m)%len(modes)]
		out, skip := ChatBody(mode, []byte(body), []uint32{1, 2})
		// For a body the gateway parsed as a chat, the splice that trusts the parse's member flags (no
		// second scan when the member is absent) gives the same bytes.
		if req, err := openai.ParseRequest(openai.Chat, []byte(body)); err == nil {
			if o2, s2 := ChatBodyJSONFor(req, mode, []byte(body), openai.AppendIDs(nil, []uint32{1, 2})); string(o2) != string(out) || s2 != skip {
				t.Fatalf("%s %s: from the parse %s (%q), from the scan %s (%q)", mode, body, o2, s2, out, skip)
			}
		}
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s -> invalid %s: %v", body, out, err)
		}
		if skip != "" {
			if string(out) != body {
				t.Fatalf("skipped (%s) but changed: %s", skip, out)
			}
			return
		}
		want := []any{1.0, 2.0}
		if mode == config.ChatTokenIDsKVTransfer {
			kv, _ := got[mode].(map[string]any)
			if !reflect.DeepEqual(kv["prompt_token_ids"], want) {
				t.Fatalf("%s -> %s", body, out)
			}
			delete(kv, "prompt_token_ids")
			if orig, ok := in[mode].(map[string]any); ok {
				delete(orig, "prompt_token_ids")
			} else {
				delete(got, mode)
				delete(in, mode)
			}
		} else {
			if !reflect.DeepEqual(got[mode], want) {
				t.Fatalf("%s -> %s", body, out)
			}
			delete(got, mode)
			delete(in, mode)
		}
		if !reflect.DeepEqual(got, in) {
			t.Fatalf("%s -> %s: other members changed", body, out)
		}
	})
}

// BenchmarkChatBody: the per-request cost of the chat splice and the media check, for a 2 KB chat and a
// ~600 KB one (a 128k-token conversation).
func BenchmarkChatBody(b *testing.B) {
	for _, n := range []int{8, 2500} {
		var msgs []string
		for i := range n {
			msgs = append(msgs, `{"role":"user","content":"The committee reviewed section `+strconv.Itoa(i)+` of the maintenance log and noted that the valve was resealed before the afternoon shift."}`)
		}
		body := []byte(`{"model":"qwen3","stream":true,"messages":[` + strings.Join(msgs, ",") + `],"max_tokens":16}`)
		ids := make([]uint32, len(body)/4)
		for i := range ids {
			ids[i] = uint32(i * 37 % 151000)
		}
		b.Run(strconv.Itoa(len(body)/1024)+"KB", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if HasMediaParts(body) {
					b.Fatal("media")
				}
				ChatBody(config.ChatTokenIDsKVTransfer, body, ids)
			}
		})
	}
}

// containsMediaHint is the reference hasMediaHint must equal: a bytes.Contains per hint.
func containsMediaHint(body []byte) bool {
	for _, h := range mediaHints {
		if bytes.Contains(body, h) {
			return true
		}
	}
	return false
}

// FuzzMediaHint: the two-scan prefilter answers exactly as one bytes.Contains per hint, on any bytes.
func FuzzMediaHint(f *testing.F) {
	for _, h := range mediaHints {
		f.Add(string(h))
		f.Add("x" + string(h) + "y")
		f.Add(string(h[:len(h)-1]))
		f.Add(string(h[1:]))
	}
	for _, s := range []string{``, `"`, `_`, `__`, `""`, `"_url`, `input_`, `_audio`, `{"type":"image"}`,
		`{"messages":[{"role":"user","content":"look at image_url\" here"}]}`, `imag_pil`, `"image_"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := hasMediaHint([]byte(s)), containsMediaHint([]byte(s)); got != want {
			t.Fatalf("%q: hasMediaHint %v, bytes.Contains %v", s, got, want)
		}
	})
}

// BenchmarkMediaHint: the media prefilter on a text-only chat body of ~300 B and ~10 KB (a 2k-token
// prompt), two scans against the bytes.Contains per hint it replaced.
func BenchmarkMediaHint(b *testing.B) {
	for _, n := range []int{300, 10000} {
		txt := strings.Repeat("the quick brown fox jumps over the lazy dog, printing its import path; ", n/70+1)[:n]
		body := []byte(`{"model":"qwen3","messages":[{"role":"user","content":"` + txt + `"}],"max_tokens":1}`)
		b.Run(strconv.Itoa(len(body))+"B/two-scans", func(b *testing.B) {
			for b.Loop() {
				hasMediaHint(body)
			}
		})
		b.Run(strconv.Itoa(len(body))+"B/contains-per-hint", func(b *testing.B) {
			for b.Loop() {
				containsMediaHint(body)
			}
		})
	}
}
