package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const minimal = `
models:
  - name: qwen3
    tokenizer: examples/models/qwen3
    endpoints:
      - {id: e0, engine: vllm, url: "http://127.0.0.1:8001", max_inflight_requests: 4}
`

func TestParseDefaults(t *testing.T) {
	c, err := Parse([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != ":8080" || c.Store.Kind != "memory" || c.StoreDownLimitShare != 1 || c.MaxBodyBytes != 64<<20 {
		t.Fatalf("defaults: %+v", c)
	}
	m := c.Models[0]
	if m.BlockSize != 16 || m.QueueTimeout != 5*time.Second || m.Policy.Name != "three-tier" {
		t.Fatalf("model defaults: %+v", m)
	}
	if e := m.Endpoints[0]; e.DataParallelSize != 1 || e.Ranks() != 1 {
		t.Fatalf("endpoint data_parallel_size default: %+v", e)
	}
	c2, err := Parse([]byte(strings.Replace(minimal, "max_inflight_requests: 4}", "max_inflight_requests: 4, data_parallel_size: 4}", 1)))
	if err != nil || c2.Models[0].Endpoints[0].Ranks() != 4 {
		t.Fatalf("data_parallel_size 4: %v %+v", err, c2)
	}
	if got := string(m.Policy.ConfigJSON()); got != "{}" {
		t.Fatalf("empty policy config JSON = %s", got)
	}
}

// chat_token_ids defaults by engine kind; the drift-guard keys default, and verify_token_ids_every: 0 stays 0.
func TestChatTokenIDsDefaults(t *testing.T) {
	y := `
models:
  - name: q
    tokenizer: x
    endpoints:
      - {id: a, engine: vllm, url: "http://h:1"}
      - {id: b, engine: sglang, url: "http://h:2"}
      - {id: c, engine: enginesim, url: "http://h:3"}
      - {id: d, engine: vllm, url: "http://h:4", chat_token_ids: prompt_token_ids}
      - {id: e, engine: sglang, url: "http://h:5", chat_token_ids: "off"}
`
	c, err := Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range c.Models[0].Endpoints {
		got = append(got, e.ChatTokenIDs)
	}
	if strings.Join(got, ",") != "kv_transfer_params,input_ids,prompt_token_ids,prompt_token_ids,off" {
		t.Fatalf("chat_token_ids: %v", got)
	}
	if *c.VerifyTokenIDsEvery != 1000 || c.TokenIDsResumeMatches != 3 || c.TokenIDsRecheckInterval != time.Second {
		t.Fatalf("guard defaults: %d %d %v", *c.VerifyTokenIDsEvery, c.TokenIDsResumeMatches, c.TokenIDsRecheckInterval)
	}
	c, err = Parse([]byte("verify_token_ids_every: 0\n" + y))
	if err != nil || *c.VerifyTokenIDsEvery != 0 {
		t.Fatalf("verify_token_ids_every 0: %v", err)
	}
}

// TestValidationNamesKeyPath: more cases of testdata/errors (TestConfigErrors), built from minimal.
func TestValidationNamesKeyPath(t *testing.T) {
	cases := []struct {
		name, yaml, key string
	}{
		{"block size", strings.Replace(minimal, "tokenizer: examples/models/qwen3", "tokenizer: x\n    block_size: -3", 1), "models[0].block_size"},
		{"max prompt tokens", strings.Replace(minimal, "tokenizer: examples/models/qwen3", "tokenizer: x\n    max_prompt_tokens: -1", 1), "models[0].max_prompt_tokens"},
		{"chat token ids", strings.Replace(minimal, "max_inflight_requests: 4}", "max_inflight_requests: 4, chat_token_ids: messages}", 1), "models[0].endpoints[0].chat_token_ids"},
		{"verify every", "verify_token_ids_every: -1\n" + minimal, "verify_token_ids_every"},
		{"sim kinds", "simulate: {engines: 2, engine_kinds: [vllm, tgi]}\n" + minimal, "simulate.engine_kinds[1]"},
		{"data parallel size", strings.Replace(minimal, "max_inflight_requests: 4}", "max_inflight_requests: 4, data_parallel_size: -1}", 1), "models[0].endpoints[0].data_parallel_size"},
		{"data parallel size max", strings.Replace(minimal, "max_inflight_requests: 4}", "max_inflight_requests: 4, data_parallel_size: 65}", 1), "models[0].endpoints[0].data_parallel_size"},
		{"data parallel ipc", strings.Replace(minimal, "max_inflight_requests: 4}", "max_inflight_requests: 4, data_parallel_size: 2, kv_events: \"ipc:///tmp/x\"}", 1), "models[0].endpoints[0].kv_events"},
		{"rank-like id", strings.Replace(minimal, "id: e0", "id: e0/dp1", 1), "models[0].endpoints[0].id"},
		{"reservation layout", "store: {kind: redis, addrs: [\"127.0.0.1:6379\"], reservation_layout: 3}\n" + minimal, "store.reservation_layout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.key+":") {
				t.Fatalf("want error naming %s, got %v", tc.key, err)
			}
		})
	}
	if _, err := Parse(nil); !errors.Is(err, ErrEmpty) {
		t.Fatalf("empty: %v", err)
	}
}

func TestSecretsAndLookup(t *testing.T) {
	c, err := Parse([]byte("client_api_keys_env: KEYS\n" + strings.Replace(minimal, "block", "block", 1) +
		"    lora_adapters: [sql-lora]\n"))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"KVGATE_ADMIN_TOKEN": " tok\n", "KEYS": "a, b,,"}
	s := c.Secrets(func(k string) string { return env[k] })
	if s.AdminToken != "tok" || len(s.ClientAPIKeys) != 2 || s.ClientAPIKeys[1] != "b" {
		t.Fatalf("secrets %+v", s)
	}
	m, lora, ok := c.ModelByName("sql-lora")
	if !ok || m.Name != "qwen3" || lora != "sql-lora" {
		t.Fatalf("lookup %v %q %v", m, lora, ok)
	}
	if _, _, ok := c.ModelByName("gpt-4"); ok {
		t.Fatal("unknown model found")
	}
}

// Every shipped example config must parse.
func TestExampleConfigs(t *testing.T) {
	files, _ := filepath.Glob("../../examples/configs/*.yaml")
	if len(files) < 2 {
		t.Fatalf("examples/configs holds %d configs, want demo.yaml and redis-fleet.yaml at least", len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Parse(b); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(minimal))
	f.Add([]byte("models: [{name: a}]\nstore: {kind: redis, addrs: [x]}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if err == nil && len(c.Models) == 0 {
			t.Fatal("valid config without models")
		}
	})
}

// The store's per-endpoint index bound: the key when set; on Redis without it, index_max_entries shared by
// every endpoint and rank; memory without it: none (index_max_entries bounds the whole index).
func TestIndexPerEndpointCap(t *testing.T) {
	two := strings.Replace(minimal, "max_inflight_requests: 4}", "max_inflight_requests: 4, data_parallel_size: 3}\n      - {id: e1, engine: vllm, url: \"http://127.0.0.1:8002\"}", 1)
	for _, tc := range []struct {
		yaml string
		want int
	}{
		{minimal, 0},
		{"index_max_entries_per_endpoint: 5000\n" + minimal, 5000},
		{"store: {kind: redis, addrs: [\"127.0.0.1:6379\"]}\nindex_max_entries: 4000\n" + two, 1000}, // 3 ranks + 1
		{"store: {kind: redis, addrs: [\"127.0.0.1:6379\"]}\n" + two, 16 << 20 / 4},
		{"store: {kind: redis, addrs: [\"127.0.0.1:6379\"]}\nindex_max_entries_per_endpoint: 7\n" + two, 7},
	} {
		c, err := Parse([]byte(tc.yaml))
		if err != nil {
			t.Fatal(err)
		}
		if got := c.IndexPerEndpointCap(); got != tc.want {
			t.Fatalf("%s: cap %d, want %d", tc.yaml, got, tc.want)
		}
	}
	if _, err := Parse([]byte("index_max_entries_per_endpoint: -1\n" + minimal)); err == nil || !strings.Contains(err.Error(), "index_max_entries_per_endpoint:") {
		t.Fatalf("negative cap: %v", err)
	}
	if _, err := Parse([]byte("index_max_engine_hashes_per_endpoint: -1\n" + minimal)); err == nil || !strings.Contains(err.Error(), "index_max_engine_hashes_per_endpoint:") {
		t.Fatalf("negative engine-hash cap: %v", err)
	}
	if c, err := Parse([]byte("index_max_engine_hashes_per_endpoint: 4096\n" + minimal)); err != nil || c.IndexMaxEngineHashesPerEndpoint != 4096 {
		t.Fatalf("engine-hash cap: %v %+v", err, c)
	}
}
