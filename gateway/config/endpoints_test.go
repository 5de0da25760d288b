package config

import (
	"errors"
	"strings"
	"testing"
)

// One endpoint decodes strictly from the admin API's JSON, gets its defaults, and round-trips through the
// store's spec form; a bad value names its key.
func TestParseEndpoint(t *testing.T) {
	e, err := ParseEndpoint([]byte(`{"id":"e3","engine":"vllm","url":"http://10.0.0.7:8000","kv_events":"tcp://10.0.0.7:5557","max_inflight_requests":8}`))
	if err != nil {
		t.Fatal(err)
	}
	if e.ChatTokenIDs != ChatTokenIDsKVTransfer || e.DataParallelSize != 1 || e.MaxInflightRequests != 8 {
		t.Fatalf("defaults: %+v", e)
	}
	spec := string(EndpointJSON(e))
	if want := `{"chat_token_ids":"kv_transfer_params","data_parallel_size":1,"engine":"vllm","id":"e3","kv_events":"tcp://10.0.0.7:5557","max_inflight_requests":8,"url":"http://10.0.0.7:8000"}`; spec != want {
		t.Fatalf("spec:\n%s\nwant\n%s", spec, want)
	}
	back, err := ParseEndpoint([]byte(spec))
	if err != nil || back != e {
		t.Fatalf("round trip: %+v %v", back, err)
	}
	for body, key := range map[string]string{
		`{"id":"x","engine":"vllm","url":"http://h:1","bogus":1}`:               "endpoint.bogus",
		`{"id":"x","engine":"tgi","url":"http://h:1"}`:                          "endpoint.engine",
		`{"id":"x","engine":"vllm","url":"ftp://h"}`:                            "endpoint.url",
		`{"engine":"vllm","url":"http://h:1"}`:                                  "endpoint.id",
		`{"id":"x","engine":"vllm","url":"http://h:1","kv_replay":"tcp://h:2"}`: "endpoint.kv_replay",
		``: "endpoint",
	} {
		_, err := ParseEndpoint([]byte(body))
		var ce *Error
		if !errors.As(err, &ce) || ce.Key != key {
			t.Errorf("%s: %v, want key %s", body, err, key)
		}
	}
}

// endpoints_from: discovered endpoints' IDs and addresses (IPv4 and IPv6), defaults, and validation.
func TestEndpointsFrom(t *testing.T) {
	base := "models:\n  - name: m\n    tokenizer: t\n    endpoints_from: "
	c, err := Parse([]byte(base + "{dns: vllm.svc, port: 8000, kv_events_port: 5557, kv_replay_port: 5558}\n"))
	if err != nil {
		t.Fatal(err)
	}
	f := c.Models[0].EndpointsFrom
	if f.RefreshOrDefault() != DefaultDNSRefresh || f.EngineOrDefault() != EngineVLLM || c.EndpointDrainTimeout != DefaultEndpointDrainTimeout {
		t.Fatalf("defaults: %+v %v", f, c.EndpointDrainTimeout)
	}
	e := f.Endpoint("m", "fd00::7")
	if e.ID != "m@[fd00::7]:8000" || e.URL != "http://[fd00::7]:8000" || e.KVEvents != "tcp://[fd00::7]:5557" || e.KVReplay != "tcp://[fd00::7]:5558" {
		t.Fatalf("IPv6 endpoint: %+v", e)
	}
	if err := e.Check(); err != nil {
		t.Fatal(err)
	}
	for spec, key := range map[string]string{
		"{port: 8000}":                         "models[0].endpoints_from.dns",
		"{dns: a, port: 0}":                    "models[0].endpoints_from.port",
		"{dns: a, port: 1, kv_replay_port: 2}": "models[0].endpoints_from.kv_replay_port",
		"{dns: a, port: 1, engine: tgi}":       "models[0].endpoints_from.engine",
		"{dns: a, port: 1, resolver: nohost}":  "models[0].endpoints_from.resolver",
		"{dns: a, port: 1, refresh: -1s}":      "models[0].endpoints_from.refresh",
	} {
		_, err := Parse([]byte(base + spec + "\n"))
		if err == nil || !strings.Contains(err.Error(), key+":") {
			t.Errorf("%s: %v, want an error on %s", spec, err, key)
		}
	}
}
