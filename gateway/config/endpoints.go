package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Defaults of the run-time endpoint keys.
const (
	DefaultEndpointDrainTimeout = 10 * time.Minute
	DefaultConfigWatchInterval  = time.Second
	DefaultDNSRefresh           = 5 * time.Second
)

// RunTimeEndpoints are the top-level keys of endpoints at run time (README "Endpoints at run time").
type RunTimeEndpoints struct {
	// EndpointDrainTimeout bounds a drain (a removed or drained endpoint): when its in-flight leases have
	// not all ended after this long, it is dropped anyway (default 10m).
	EndpointDrainTimeout time.Duration `yaml:"endpoint_drain_timeout"`
	// ConfigWatchInterval is how often `kvgate serve` looks at the config file for a change (modification
	// time, size and content; default 1s). SIGHUP re-reads it at once.
	ConfigWatchInterval time.Duration `yaml:"config_watch_interval"`
}

func (r *RunTimeEndpoints) applyDefaults() {
	if r.EndpointDrainTimeout == 0 {
		r.EndpointDrainTimeout = DefaultEndpointDrainTimeout
	}
	if r.ConfigWatchInterval == 0 {
		r.ConfigWatchInterval = DefaultConfigWatchInterval
	}
}

func (r *RunTimeEndpoints) check(bad func(key, format string, a ...any)) {
	if r.EndpointDrainTimeout < 0 {
		bad("endpoint_drain_timeout", "must not be negative")
	}
	if r.ConfigWatchInterval < 0 {
		bad("config_watch_interval", "must not be negative")
	}
}

// EndpointsFrom discovers a model's endpoints from DNS: every A and AAAA record of DNS (a Kubernetes
// headless Service name, for instance) is one endpoint at http://ADDR:Port, re-resolved every Refresh;
// addresses that appear are added, those that disappear are drained and removed.
type EndpointsFrom struct {
	// DNS is the name to resolve (required).
	DNS string `yaml:"dns"`
	// Port is the engines' HTTP port (required).
	Port int `yaml:"port"`
	// KVEventsPort and KVReplayPort, when set, are the engines' ZMQ PUB and ROUTER ports (tcp://ADDR:port).
	KVEventsPort int `yaml:"kv_events_port"`
	KVReplayPort int `yaml:"kv_replay_port"`
	// Engine is the engines' kind (enginesim, vllm or sglang; default vllm).
	Engine string `yaml:"engine"`
	// Refresh is the re-resolution period (default 5s).
	Refresh time.Duration `yaml:"refresh"`
	// Resolver is a DNS server host:port to ask (default: the system's resolver).
	Resolver string `yaml:"resolver"`
	// MaxInflightRequests, MaxInflightTokens, ChatTokenIDs and DataParallelSize apply to every discovered
	// endpoint as the endpoint keys of the same names.
	MaxInflightRequests int64  `yaml:"max_inflight_requests"`
	MaxInflightTokens   int64  `yaml:"max_inflight_tokens"`
	ChatTokenIDs        string `yaml:"chat_token_ids"`
	DataParallelSize    int    `yaml:"data_parallel_size"`
}

// RefreshOrDefault returns Refresh, or DefaultDNSRefresh when unset.
func (f *EndpointsFrom) RefreshOrDefault() time.Duration {
	if f.Refresh <= 0 {
		return DefaultDNSRefresh
	}
	return f.Refresh
}

// EngineOrDefault returns Engine, or vllm when unset.
func (f *EndpointsFrom) EngineOrDefault() string {
	if f.Engine == "" {
		return EngineVLLM
	}
	return f.Engine
}

// Endpoint returns the endpoint discovered at address ip (an IPv4 or IPv6 address without brackets). Its
// ID is "<model>@<host:port>", unique per model and address.
func (f *EndpointsFrom) Endpoint(model, ip string) Endpoint {
	hp := func(port int) string { return net.JoinHostPort(ip, fmt.Sprint(port)) }
	e := Endpoint{ID: model + "@" + hp(f.Port), Engine: f.EngineOrDefault(), URL: "http://" + hp(f.Port),
		MaxInflightRequests: f.MaxInflightRequests, MaxInflightTokens: f.MaxInflightTokens,
		ChatTokenIDs: f.ChatTokenIDs, DataParallelSize: f.DataParallelSize}
	if f.KVEventsPort > 0 {
		e.KVEvents = "tcp://" + hp(f.KVEventsPort)
	}
	if f.KVReplayPort > 0 && f.KVEventsPort > 0 {
		e.KVReplay = "tcp://" + hp(f.KVReplayPort)
	}
	e.ApplyDefaults()
	return e
}

func (f *EndpointsFrom) check(p string, bad func(key, format string, a ...any)) {
	if f.DNS == "" {
		bad(p+".dns", "required (a DNS name)")
	}
	for k, v := range map[string]int{"port": f.Port, "kv_events_port": f.KVEventsPort, "kv_replay_port": f.KVReplayPort} {
		if v < 0 || v > 65535 || (k == "port" && v == 0) {
			bad(p+"."+k, "want a TCP port 1..65535, got %d", v)
		}
	}
	if f.KVReplayPort > 0 && f.KVEventsPort == 0 {
		bad(p+".kv_replay_port", "needs kv_events_port")
	}
	switch f.EngineOrDefault() {
	case EngineSim, EngineVLLM, EngineSGLang:
	default:
		bad(p+".engine", "want enginesim, vllm or sglang, got %q", f.Engine)
	}
	if f.Refresh < 0 {
		bad(p+".refresh", "must not be negative")
	}
	if f.Resolver != "" {
		if _, _, err := net.SplitHostPort(f.Resolver); err != nil {
			bad(p+".resolver", "want host:port, got %q", f.Resolver)
		}
	}
	e := f.Endpoint("m", "127.0.0.1")
	e.check(p, bad)
}

// ApplyDefaults fills chat_token_ids (the engine's default) and data_parallel_size (1) when unset.
func (e *Endpoint) ApplyDefaults() {
	if e.ChatTokenIDs == "" {
		e.ChatTokenIDs = DefaultChatTokenIDs[e.Engine]
	}
	if e.DataParallelSize == 0 {
		e.DataParallelSize = 1
	}
}

// Check validates one endpoint on its own (the file's checks, ID uniqueness aside); errors name the key
// as "endpoint.<key>".
func (e Endpoint) Check() error {
	var errs []error
	e.check("endpoint", func(key, format string, a ...any) {
		errs = append(errs, &Error{Key: key, Msg: fmt.Sprintf(format, a...)})
	})
	return errors.Join(errs...)
}

func (e Endpoint) check(q string, bad func(key, format string, a ...any)) {
	if e.ID == "" {
		bad(q+".id", "required")
	}
	switch e.Engine {
	case EngineSim, EngineVLLM, EngineSGLang:
	default:
		bad(q+".engine", "want enginesim, vllm or sglang, got %q", e.Engine)
	}
	if u, err := url.Parse(e.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad(q+".url", "want an http(s)://host:port URL, got %q", e.URL)
	}
	if e.KVEvents != "" && !strings.HasPrefix(e.KVEvents, "tcp://") && !strings.HasPrefix(e.KVEvents, "ipc://") {
		bad(q+".kv_events", "want tcp://host:port, got %q", e.KVEvents)
	}
	if e.KVReplay != "" && e.KVEvents == "" {
		bad(q+".kv_replay", "needs kv_events")
	}
	if e.MaxInflightRequests < 0 {
		bad(q+".max_inflight_requests", "must not be negative")
	}
	if e.MaxInflightTokens < 0 {
		bad(q+".max_inflight_tokens", "must not be negative")
	}
	switch e.ChatTokenIDs {
	case "", ChatTokenIDsKVTransfer, ChatTokenIDsPromptTokenIDs, ChatTokenIDsInputIDs, ChatTokenIDsOff:
	default:
		bad(q+".chat_token_ids", "want kv_transfer_params, prompt_token_ids, input_ids or off, got %q", e.ChatTokenIDs)
	}
	if e.DataParallelSize < 0 || e.DataParallelSize > 64 {
		// 0 is unset (a Config built by a program): one rank, as 1.
		bad(q+".data_parallel_size", "want 1..64, got %d", e.DataParallelSize)
	} else if e.DataParallelSize > 1 && e.KVEvents != "" && !strings.HasPrefix(e.KVEvents, "tcp://") {
		bad(q+".kv_events", "data-parallel ranks publish on port + rank: want tcp://host:port, got %q", e.KVEvents)
	}
	if strings.Contains(e.ID, "/dp") {
		bad(q+".id", "%q must not contain \"/dp\" (data-parallel ranks are named <id>/dp<r>)", e.ID)
	}
}

// ParseEndpoint decodes one endpoint from a JSON (or YAML) object with the config file's endpoint keys,
// strictly (an unknown key is an error), applies its defaults and validates it. Errors are *Error values.
func ParseEndpoint(data []byte) (Endpoint, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var e Endpoint
	if err := dec.Decode(&e); err != nil {
		if errors.Is(err, io.EOF) {
			return Endpoint{}, &Error{Key: "endpoint", Msg: "empty"}
		}
		msg := err.Error()
		if g := unknownField.FindStringSubmatch(strings.TrimPrefix(msg, "yaml: unmarshal errors:\n  ")); g != nil {
			return Endpoint{}, &Error{Key: "endpoint." + g[2], Msg: "unknown key"}
		}
		return Endpoint{}, &Error{Key: "endpoint", Msg: msg}
	}
	e.ApplyDefaults()
	if err := e.Check(); err != nil {
		return Endpoint{}, err
	}
	return e, nil
}

// EndpointJSON returns e as a JSON object with the config file's keys (zero values left out), what
// ParseEndpoint reads back: the spec of a run-time endpoint in the store.
func EndpointJSON(e Endpoint) json.RawMessage {
	y, err := yaml.Marshal(e)
	if err != nil {
		return json.RawMessage("{}")
	}
	var m map[string]any
	if yaml.Unmarshal(y, &m) != nil {
		return json.RawMessage("{}")
	}
	for k, v := range m {
		switch x := v.(type) {
		case string:
			if x == "" {
				delete(m, k)
			}
		case int:
			if x == 0 {
				delete(m, k)
			}
		case bool:
			if !x {
				delete(m, k)
			}
		case nil:
			delete(m, k)
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return json.RawMessage("{}")
	}
	return b
}
