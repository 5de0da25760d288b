// Package config is kvgate's one YAML configuration file: its schema, strict decoding (an unknown or
// misspelt key is an error naming the key and its line), defaults, and validation (errors name the key path,
// e.g. "models[0].endpoints[1].engine"). Secrets never appear in the file: it names environment variables
// (admin_token_env, client_api_keys_env, store.password_env) and Secrets reads them.
//
// Stages: Parse (decode strictly) → defaults → Validate. A Config is immutable once returned.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Engine kinds an endpoint may declare. They decide how token IDs travel to the engine (see gateway/internal/upstream).
const (
	// EngineSim is kvgate's simulator (cmd/enginesim): token IDs go out of band on chat
	// (prompt_token_ids) and completions (token-ID prompt).
	EngineSim = "enginesim"
	// EngineVLLM is vLLM: token-ID prompt on completions; chat carries them in kv_transfer_params
	// (chat_token_ids).
	EngineVLLM = "vllm"
	// EngineSGLang is SGLang: chat carries them in input_ids (chat_token_ids); completions keep their body.
	EngineSGLang = "sglang"
)

// Chat token-ID fields (Endpoint.ChatTokenIDs): where a chat request's token IDs travel to the engine, with
// messages kept in the body (gateway/internal/upstream/tokenids.go).
const (
	// ChatTokenIDsKVTransfer is vLLM's kv_transfer_params.prompt_token_ids (vLLM #48145; default for vllm).
	ChatTokenIDsKVTransfer = "kv_transfer_params"
	// ChatTokenIDsPromptTokenIDs is a top-level prompt_token_ids (vLLM #55771; default for enginesim).
	ChatTokenIDsPromptTokenIDs = "prompt_token_ids"
	// ChatTokenIDsInputIDs is SGLang's top-level input_ids (default for sglang).
	ChatTokenIDsInputIDs = "input_ids"
	// ChatTokenIDsOff sends chat requests with their original body.
	ChatTokenIDsOff = "off"
)

// DefaultChatTokenIDs is the chat_token_ids default of each engine kind.
var DefaultChatTokenIDs = map[string]string{EngineSim: ChatTokenIDsPromptTokenIDs,
	EngineVLLM: ChatTokenIDsKVTransfer, EngineSGLang: ChatTokenIDsInputIDs}

// Store kinds.
const (
	// StoreMemory is the embedded in-memory store (one gateway).
	StoreMemory = "memory"
	// StoreRedis is Redis standalone or Redis Cluster (many gateways share it).
	StoreRedis = "redis"
)

// Defaults applied by Parse for keys left out.
const (
	DefaultListen              = ":8080"
	DefaultAdminTokenEnv       = "KVGATE_ADMIN_TOKEN"
	DefaultMaxBodyBytes        = 64 << 20 // 64 MiB: long-context bodies of several MB must pass
	DefaultMaxPolicyBytes      = 16 << 20 // 16 MiB of Wasm
	DefaultBlockSize           = 16
	DefaultQueueTimeout        = 5 * time.Second
	DefaultScrapeInterval      = 250 * time.Millisecond
	DefaultSpeculativeTTL      = 2 * time.Second
	DefaultLeaseTTL            = 30 * time.Second
	DefaultClientIdleTimeout   = 120 * time.Second
	DefaultUpstreamIdleTimeout = 10 * time.Minute
	DefaultOutputTokens        = 256
	DefaultPolicyName          = "three-tier"
)

// Defaults of the index-under-faults keys.
const (
	DefaultIndexUnconfirmedTTL        = 5 * time.Minute
	DefaultIndexReplayTimeout         = 2 * time.Second
	DefaultIndexReplayTimeoutPerBatch = 5 * time.Millisecond
	DefaultStoreTimeout               = 200 * time.Millisecond
)

// Drift-guard defaults (the token-ID keys below).
const (
	// DefaultVerifyTokenIDsEvery: one chat request in this many that went with token IDs is checked
	// against the engine's /tokenize.
	DefaultVerifyTokenIDsEvery = 1000
	// DefaultTokenIDsResumeMatches: consecutive matching checks after a mismatch before an endpoint gets
	// token IDs again.
	DefaultTokenIDsResumeMatches = 3
)

// Config is the whole file. Durations are YAML strings such as "5s" or "250ms".
type Config struct {
	// Listen is the client and admin HTTP address, host:port (default ":8080").
	Listen string `yaml:"listen"`
	// AdminTokenEnv names the environment variable holding the admin bearer token
	// (default KVGATE_ADMIN_TOKEN). When the variable is unset or empty, `kvgate serve` generates a random
	// token at start and prints it; a gateway started as a library (gateway.Start) with an empty
	// Secrets.AdminToken refuses every /admin/ request with 401.
	AdminTokenEnv string `yaml:"admin_token_env"`
	// ClientAPIKeysEnv optionally names an environment variable holding comma-separated client API keys.
	// When set and non-empty, /v1/ routes require "Authorization: Bearer <key>"; otherwise they are open.
	ClientAPIKeysEnv string `yaml:"client_api_keys_env"`
	// Store selects the shared-state backend.
	Store Store `yaml:"store"`
	// BlockKeySeed seeds kvgate's block keys (kvstore.Hasher); every gateway on one store must agree.
	BlockKeySeed uint64 `yaml:"block_key_seed"`
	// StoreDownLimitShare is the share in (0,1] of every endpoint limit this gateway may run while the store
	// is unreachable (e.g. 0.34 for three gateways), counting the requests it already ran on store leases; it
	// also caps it at what it held when the store went down plus this share of the capacity then free
	// (gateway/RATIONALE.md). Default 1.
	StoreDownLimitShare float64 `yaml:"store_down_limit_share"`
	// StoreDownStrict (kvstore.GuardConfig.StrictOnTimeout): while the store's calls time out, run only
	// what the store still counts for this gateway instead of the store_down_limit_share caps. Closes the
	// partial-outage overshoot; a store hung for every gateway then refuses new requests (429). Default
	// false (fail open within the share caps, as Envoy's rate-limit filter does).
	StoreDownStrict bool `yaml:"store_down_strict"`
	// MaxBodyBytes caps a client request body (default 64 MiB); larger bodies get 413.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxPolicyBytes caps an uploaded Wasm policy (default 16 MiB).
	MaxPolicyBytes int64 `yaml:"max_policy_bytes"`
	// ClientIdleTimeout closes idle client keep-alive connections (default 120s).
	ClientIdleTimeout time.Duration `yaml:"client_idle_timeout"`
	// UpstreamIdleTimeout fails an upstream response body that sends no byte for this long (default 10m):
	// silence between bytes. A stream may run as long as it keeps sending; the wait for the response's
	// headers is bounded by upstream_first_byte_timeout (streams) or upstream_total_timeout.
	UpstreamIdleTimeout time.Duration `yaml:"upstream_idle_timeout"`
	// ScrapeInterval is how often each endpoint's /metrics and /health are read (default 250ms).
	ScrapeInterval time.Duration `yaml:"scrape_interval"`
	// SpeculativeTTL is how long a routed prefix counts as held by its endpoint before the engine's events
	// confirm it (default 2s).
	SpeculativeTTL time.Duration `yaml:"speculative_ttl"`
	// LeaseTTL is a reservation's lifetime; long responses renew it every LeaseTTL/3 (default 30s).
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// DefaultOutputTokens is the output-token estimate added to a request's reserved tokens when it sets no
	// max_tokens / max_completion_tokens (default 256).
	DefaultOutputTokens int64 `yaml:"default_output_tokens"`
	// LogLevel is debug, info (default), warn or error.
	LogLevel string `yaml:"log_level"`

	// The index under faults (kvstore/RATIONALE.md, "Index under faults").

	// IndexUnconfirmedTTL is how long index entries the ingester can no longer vouch for (after an
	// ingestion takeover or restart whose replay does not reach the engine's first event, or a sequence gap
	// replay could not close) keep counting unless the engine's events confirm them (default 5m).
	IndexUnconfirmedTTL time.Duration `yaml:"index_unconfirmed_ttl"`
	// IndexReplayTimeout is the base time allowed for one KV-event replay exchange (default 2s);
	// IndexReplayTimeoutPerBatch is added for every batch the replay is expected to bring (default 5ms).
	IndexReplayTimeout         time.Duration `yaml:"index_replay_timeout"`
	IndexReplayTimeoutPerBatch time.Duration `yaml:"index_replay_timeout_per_batch"`
	// StoreTimeout bounds each store call on a request's path (match, in-flight read, reserve, renew,
	// release; default 200ms): a hung Redis switches the gateway to store-down routing after about this long
	// instead of stalling requests.
	StoreTimeout time.Duration `yaml:"store_timeout"`
	// IndexMaxEntries bounds the in-memory index's (model, block key) entries; beyond it the least recently
	// used are evicted (CLOCK, per shard). 0 = kvstore.DefaultMaxKeys (16 Mi, about 1.4 GB). On Redis it is
	// shared evenly by every endpoint and rank as their per-endpoint bound unless
	// index_max_entries_per_endpoint is set (IndexPerEndpointCap; kvstore/RATIONALE.md).
	IndexMaxEntries int `yaml:"index_max_entries"`
	// IndexMaxEntriesPerEndpoint bounds one endpoint's entries per model (0: no bound of its own), in
	// either index: in memory its least recently used entries go (CLOCK per endpoint); on Redis an Add past
	// it drops random ones of the endpoint's confirmed blocks (Redis 7.0 has no per-field expiry; see
	// kvstore/RATIONALE.md). A data-parallel rank is an endpoint of its own here.
	IndexMaxEntriesPerEndpoint int `yaml:"index_max_entries_per_endpoint"`
	// IndexMaxEngineHashesPerEndpoint bounds the ingester's engine-hash map (engine block hash → block key)
	// of one endpoint, or of each data-parallel rank: 0 = kvevents.DefaultMaxHashes (1 Mi; 43 to 85 bytes
	// per hash, at most 64 MiB per endpoint). Set it well above what the engine holds (GPU + CPU blocks);
	// an engine that announces its removals never reaches it. Beyond it the least recently stored hashes are
	// evicted (CLOCK) and their blocks removed from the index (kvgate_event_hash_evictions_total).
	IndexMaxEngineHashesPerEndpoint int `yaml:"index_max_engine_hashes_per_endpoint"`

	// Models are the served models (at least one).
	Models []Model `yaml:"models"`
	// Simulate, when set, starts simulated engines in-process (make run, demos).
	Simulate *Simulate `yaml:"simulate"`

	// Token IDs on chat and their drift guard (gateway/internal/driftguard). An endpoint whose chat_token_ids is not
	// off gets token IDs only while its engine's /tokenize agrees with the gateway on the probe chats.

	// VerifyTokenIDsEvery checks one in this many chat requests sent with token IDs against the engine's
	// /tokenize, off the request path (default 1000; 0 = no sampled checks, probes only). nil = default.
	VerifyTokenIDsEvery *int `yaml:"verify_token_ids_every"`
	// TokenIDsResumeMatches is how many consecutive matching checks (probe rounds or sampled requests) an
	// endpoint needs after a mismatch before it gets token IDs again (default 3).
	TokenIDsResumeMatches int `yaml:"token_ids_resume_matches"`
	// TokenIDsRecheckInterval is how often an endpoint without token IDs (not yet verified, or after a
	// mismatch) is probed again (default 1s).
	TokenIDsRecheckInterval time.Duration `yaml:"token_ids_recheck_interval"`
	// FrontDoor holds the client-connection, upstream-timeout, retry and exposure keys (frontdoor.go).
	FrontDoor `yaml:",inline"`
	// RunTimeEndpoints holds the keys of endpoints at run time (endpoints.go).
	RunTimeEndpoints `yaml:",inline"`
	// Ops holds the access-log, drain, TLS and tracing keys (ops.go).
	Ops `yaml:",inline"`
	// CORS is cross-origin access from browsers, off by default (cors.go).
	CORS CORS `yaml:"cors"`
}

// Store selects and addresses the shared-state backend.
type Store struct {
	// Kind is "memory" (default) or "redis".
	Kind string `yaml:"kind"`
	// Addrs are Redis host:port addresses (redis only; one for standalone, seeds for a cluster).
	Addrs []string `yaml:"addrs"`
	// Cluster selects the Redis Cluster client.
	Cluster bool `yaml:"cluster"`
	// DB is the Redis database number (standalone only).
	DB int `yaml:"db"`
	// PasswordEnv names the environment variable holding the Redis password, if any.
	PasswordEnv string `yaml:"password_env"`
	// Username is the Redis ACL user (Redis 6+; empty: the default user).
	Username string `yaml:"username"`
	// TLS, when set, connects to Redis over TLS (redis-server --tls-port), verified with ca_file and
	// presenting cert_file/key_file when Redis asks for client certificates (tls-auth-clients).
	TLS *ClientTLS `yaml:"tls"`
	// IndexLayout is the Redis index's key layout (kvstore.RedisConfig.IndexLayout): 0 (default) follows
	// the store's marker — layout 1 read and both written until the marker says 2, then layout 2 — 1 is
	// the layout of releases before layout 2, 2 is layout 2 only (a fleet with no older gateway).
	IndexLayout int `yaml:"index_layout"`
	// ReservationLayout is the Redis reservations' key layout (kvstore.StoreConfig.ReservationLayout): 0
	// (default) follows the store's marker — the single {res} tag until the marker is raised, then one tag
	// per endpoint, switched at one instant on Redis's clock — 1 is the single tag of older releases, 2
	// the sharded layout only (a fleet with no older gateway).
	ReservationLayout int `yaml:"reservation_layout"`
	// Prefix starts every key the gateway writes (index, reservations, fleet state, leases, epoch, TPU
	// slices, pub/sub channels): fleets with different prefixes share one Redis without seeing each other.
	// Redis only; letters, digits and "_-.:" (no hash-tag braces), at most 64 bytes (empty:
	// kvstore.DefaultRedisPrefix, "kvg").
	Prefix string `yaml:"prefix"`
}

// Model is one served model.
type Model struct {
	// Name is the model name clients send in "model".
	Name string `yaml:"name"`
	// Tokenizer is an HF model directory (tokenizer.json[.gz], tokenizer_config.json), relative to the
	// working directory.
	Tokenizer string `yaml:"tokenizer"`
	// BlockSize is the engines' KV block size in tokens (default 16).
	BlockSize int `yaml:"block_size"`
	// LoRAAdapters are adapter names clients may send as "model"; the request is routed for this model
	// with the adapter folded into its block keys.
	LoRAAdapters []string `yaml:"lora_adapters"`
	// Policy is the routing policy and its JSON config (default three-tier with its defaults).
	Policy Policy `yaml:"policy"`
	// QueueTimeout is how long a request waits for capacity before 429 (default 5s).
	QueueTimeout time.Duration `yaml:"queue_timeout"`
	// MaxPromptTokens rejects, with 400 before routing, a request whose prompt renders to more tokens than
	// this (0, the default: no limit of the gateway's own; the engine still enforces its context length).
	MaxPromptTokens int `yaml:"max_prompt_tokens"`
	// Endpoints serve this model (may be empty when simulate or endpoints_from is set). At run time the
	// fleet's endpoints live in the store; a change of this list in the watched file is applied there
	// (README "Endpoints at run time").
	Endpoints []Endpoint `yaml:"endpoints"`
	// EndpointsFrom discovers more endpoints from DNS (endpoints.go).
	EndpointsFrom *EndpointsFrom `yaml:"endpoints_from"`
}

// Policy names a policy and its config.
type Policy struct {
	// Name is the policy name: "three-tier" (built in) or an uploaded policy's name (its only stored
	// version); "name@" plus at least 8 hex digits of the sha256 (any case) pins a version
	// (plugins.ResolveVersion).
	Name string `yaml:"name"`
	// Config is passed to the policy's init as JSON.
	Config map[string]any `yaml:"config"`
}

// ConfigJSON returns the policy config as JSON ("{}" when empty).
func (p Policy) ConfigJSON() []byte {
	if len(p.Config) == 0 {
		return []byte("{}")
	}
	b, err := json.Marshal(p.Config)
	if err != nil { // validated by Parse; unreachable for decoded YAML
		return []byte("{}")
	}
	return b
}

// Endpoint is one engine replica.
type Endpoint struct {
	// ID names the endpoint, unique across the file.
	ID string `yaml:"id"`
	// Engine is enginesim, vllm or sglang.
	Engine string `yaml:"engine"`
	// URL is the engine's HTTP base URL, e.g. http://10.0.0.5:8000.
	URL string `yaml:"url"`
	// KVEvents is the engine's ZMQ PUB address (tcp://host:port); empty: no events, load-only for it.
	KVEvents string `yaml:"kv_events"`
	// KVReplay is the engine's ZMQ ROUTER replay address, optional.
	KVReplay string `yaml:"kv_replay"`
	// MaxInflightRequests caps requests leased on this endpoint by all gateways (0: unlimited).
	MaxInflightRequests int64 `yaml:"max_inflight_requests"`
	// MaxInflightTokens caps prompt+output tokens leased on it (0: unlimited).
	MaxInflightTokens int64 `yaml:"max_inflight_tokens"`

	// ChatTokenIDs is where chat token IDs go: kv_transfer_params (vLLM #48145; default for vllm),
	// prompt_token_ids (vLLM #55771; default for enginesim), input_ids (SGLang; default for sglang) or off.
	ChatTokenIDs string `yaml:"chat_token_ids"`
	// DataParallelSize is the engine's data-parallel ranks (vLLM --data-parallel-size; 1..64, default 1).
	// With N ≥ 2 each rank is a routing candidate of its own, "<id>/dp<r>": its own prefix match (its KV
	// events come from kv_events' and kv_replay's TCP port + r), its own lease, a 1/N share of the
	// endpoint's limits, and its own load from the engine's engine="<r>" metric series (vLLM; without them
	// a 1/N share of the scraped load); the request carries X-data-parallel-rank: <r>.
	DataParallelSize int `yaml:"data_parallel_size"`
	// APIKeyEnv names an environment variable holding the engine's API key (vLLM --api-key): requests to
	// this endpoint carry "Authorization: Bearer <key>" instead of anything the client sent.
	APIKeyEnv string `yaml:"api_key_env"`
}

// IndexPerEndpointCap returns the per-endpoint index bound the store gets: index_max_entries_per_endpoint
// when set; else, on Redis, index_max_entries (DefaultMaxKeys when 0) shared evenly by every endpoint and
// data-parallel rank of every model (at least 1), so the Redis index's confirmed entries stay within
// index_max_entries as the memory index's do; else 0 (memory: the global bound suffices).
func (c *Config) IndexPerEndpointCap() int {
	if c.IndexMaxEntriesPerEndpoint > 0 || c.Store.Kind != StoreRedis {
		return c.IndexMaxEntriesPerEndpoint
	}
	total := c.IndexMaxEntries
	if total <= 0 {
		total = kvstoreDefaultMaxKeys
	}
	n := 0
	for _, m := range c.Models {
		for _, e := range m.Endpoints {
			n += e.Ranks()
		}
	}
	if n == 0 {
		return 0
	}
	return max(total/n, 1)
}

// kvstoreDefaultMaxKeys is kvstore.DefaultMaxKeys (config does not import kvstore).
const kvstoreDefaultMaxKeys = 16 << 20

// Ranks returns the endpoint's data-parallel size (1 when unset).
func (e Endpoint) Ranks() int { return max(e.DataParallelSize, 1) }

// Simulate starts simulated engines in-process; their endpoints are added to every model that lists none.
type Simulate struct {
	// Engines is how many simulated engines to start (1..64).
	Engines int `yaml:"engines"`
	// MaxInflightRequests per simulated endpoint (default 64).
	MaxInflightRequests int64 `yaml:"max_inflight_requests"`
	// MaxInflightTokens per simulated endpoint (default 262144).
	MaxInflightTokens int64 `yaml:"max_inflight_tokens"`
	// Engines' kinds, cycled over the simulated engines (default [enginesim]): vllm and sglang start the
	// simulator in that engine's dialect (enginesim --api) and declare the endpoint with that engine kind,
	// so it gets that engine's chat token-ID field.
	EngineKinds []string `yaml:"engine_kinds"`
}

// Error is a configuration error; Key is the offending key path ("models[0].block_size") or, for decoding
// errors, the key name as written.
type Error struct {
	Key  string // see above
	Line int    // 0 when unknown
	Msg  string // what is wrong with the value
}

// Error formats "config: [line N: ]key: message".
func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("config: line %d: %s: %s", e.Line, e.Key, e.Msg)
	}
	return fmt.Sprintf("config: %s: %s", e.Key, e.Msg)
}

// ErrEmpty is returned for an empty file.
var ErrEmpty = errors.New("config: empty file")

// Load reads and parses the file at path.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(b)
}

var unknownField = regexp.MustCompile(`^line (\d+): field (\S+) not found in type (\S+)$`)

// Parse decodes data strictly, applies defaults and validates. Every error is an *Error (or ErrEmpty) naming
// the key; several unknown keys are joined with errors.Join.
func Parse(data []byte) (*Config, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var c Config
	if err := dec.Decode(&c); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, ErrEmpty
		}
		var te *yaml.TypeError
		if errors.As(err, &te) {
			var errs []error
			for _, m := range te.Errors {
				if g := unknownField.FindStringSubmatch(m); g != nil {
					var line int
					fmt.Sscan(g[1], &line)
					errs = append(errs, &Error{Key: g[2], Line: line, Msg: "unknown key (in " + strings.TrimPrefix(g[3], "config.") + ")"})
				} else {
					errs = append(errs, &Error{Key: "?", Msg: m})
				}
			}
			return nil, errors.Join(errs...)
		}
		return nil, &Error{Key: "?", Msg: err.Error()}
	}
	c.applyDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

func (c *Config) applyDefaults() {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.AdminTokenEnv == "" {
		c.AdminTokenEnv = DefaultAdminTokenEnv
	}
	if c.Store.Kind == "" {
		c.Store.Kind = StoreMemory
	}
	if c.StoreDownLimitShare == 0 {
		c.StoreDownLimitShare = 1
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxPolicyBytes == 0 {
		c.MaxPolicyBytes = DefaultMaxPolicyBytes
	}
	if c.ClientIdleTimeout == 0 {
		c.ClientIdleTimeout = DefaultClientIdleTimeout
	}
	if c.UpstreamIdleTimeout == 0 {
		c.UpstreamIdleTimeout = DefaultUpstreamIdleTimeout
	}
	if c.ScrapeInterval == 0 {
		c.ScrapeInterval = DefaultScrapeInterval
	}
	if c.SpeculativeTTL == 0 {
		c.SpeculativeTTL = DefaultSpeculativeTTL
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.DefaultOutputTokens == 0 {
		c.DefaultOutputTokens = DefaultOutputTokens
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.IndexUnconfirmedTTL == 0 {
		c.IndexUnconfirmedTTL = DefaultIndexUnconfirmedTTL
	}
	if c.IndexReplayTimeout == 0 {
		c.IndexReplayTimeout = DefaultIndexReplayTimeout
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = DefaultStoreTimeout
	}
	if c.IndexReplayTimeoutPerBatch == 0 {
		c.IndexReplayTimeoutPerBatch = DefaultIndexReplayTimeoutPerBatch
	}
	if c.VerifyTokenIDsEvery == nil {
		n := DefaultVerifyTokenIDsEvery
		c.VerifyTokenIDsEvery = &n
	}
	if c.TokenIDsResumeMatches == 0 {
		c.TokenIDsResumeMatches = DefaultTokenIDsResumeMatches
	}
	if c.TokenIDsRecheckInterval == 0 {
		c.TokenIDsRecheckInterval = time.Second
	}
	c.FrontDoor.applyDefaults()
	c.RunTimeEndpoints.applyDefaults()
	c.Ops.applyDefaults()
	if c.Simulate != nil {
		if c.Simulate.MaxInflightRequests == 0 {
			c.Simulate.MaxInflightRequests = 64
		}
		if c.Simulate.MaxInflightTokens == 0 {
			c.Simulate.MaxInflightTokens = 262144
		}
	}
	for i := range c.Models {
		m := &c.Models[i]
		if m.BlockSize == 0 {
			m.BlockSize = DefaultBlockSize
		}
		if m.QueueTimeout == 0 {
			m.QueueTimeout = DefaultQueueTimeout
		}
		if m.Policy.Name == "" {
			m.Policy.Name = DefaultPolicyName
		}
		for j := range m.Endpoints {
			e := &m.Endpoints[j]
			if e.ChatTokenIDs == "" {
				e.ChatTokenIDs = DefaultChatTokenIDs[e.Engine]
			}
			if e.DataParallelSize == 0 {
				e.DataParallelSize = 1
			}
		}
	}
}

// Validate checks every value; it is called by Parse and again after a program edits a Config.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, a ...any) {
		errs = append(errs, &Error{Key: key, Msg: fmt.Sprintf(format, a...)})
	}
	if c.Listen == "" || !strings.Contains(c.Listen, ":") {
		bad("listen", "want host:port, got %q", c.Listen)
	}
	switch c.Store.Kind {
	case StoreMemory:
		if len(c.Store.Addrs) > 0 {
			bad("store.addrs", "only for kind redis")
		}
		if c.Store.Prefix != "" {
			bad("store.prefix", "only for kind redis")
		}
	case StoreRedis:
		if len(c.Store.Addrs) == 0 {
			bad("store.addrs", "redis needs at least one host:port")
		}
		if c.Store.Cluster && c.Store.DB != 0 {
			bad("store.db", "Redis Cluster has only database 0")
		}
		c.Store.TLS.validate("store.tls", bad)
		if p := c.Store.Prefix; len(p) > 64 || strings.Trim(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:") != "" {
			bad("store.prefix", "want at most 64 letters, digits or _-.: (no hash-tag braces), got %q", p)
		}
	default:
		bad("store.kind", "want memory or redis, got %q", c.Store.Kind)
	}
	if c.StoreDownLimitShare <= 0 || c.StoreDownLimitShare > 1 {
		bad("store_down_limit_share", "want a share in (0,1], got %v", c.StoreDownLimitShare)
	}
	if c.MaxBodyBytes < 1024 {
		bad("max_body_bytes", "want at least 1024, got %d", c.MaxBodyBytes)
	}
	if c.MaxPolicyBytes < 1024 {
		bad("max_policy_bytes", "want at least 1024, got %d", c.MaxPolicyBytes)
	}
	for key, d := range map[string]time.Duration{"client_idle_timeout": c.ClientIdleTimeout,
		"upstream_idle_timeout": c.UpstreamIdleTimeout, "scrape_interval": c.ScrapeInterval,
		"speculative_ttl": c.SpeculativeTTL, "lease_ttl": c.LeaseTTL, "index_unconfirmed_ttl": c.IndexUnconfirmedTTL,
		"index_replay_timeout": c.IndexReplayTimeout, "index_replay_timeout_per_batch": c.IndexReplayTimeoutPerBatch,
		"store_timeout": c.StoreTimeout} {
		if d < 0 {
			bad(key, "must be positive, got %v", d)
		}
	}
	if c.IndexMaxEngineHashesPerEndpoint < 0 {
		bad("index_max_engine_hashes_per_endpoint", "must not be negative, got %d", c.IndexMaxEngineHashesPerEndpoint)
	}
	if c.IndexMaxEntriesPerEndpoint < 0 {
		bad("index_max_entries_per_endpoint", "must not be negative, got %d", c.IndexMaxEntriesPerEndpoint)
	}
	if c.Store.IndexLayout < 0 || c.Store.IndexLayout > 2 {
		bad("store.index_layout", "must be 0 (follow the store), 1 or 2, got %d", c.Store.IndexLayout)
	}
	if c.Store.ReservationLayout < 0 || c.Store.ReservationLayout > 2 {
		bad("store.reservation_layout", "must be 0 (follow the store), 1 or 2, got %d", c.Store.ReservationLayout)
	}
	if c.IndexMaxEntries < 0 {
		bad("index_max_entries", "must not be negative, got %d", c.IndexMaxEntries)
	}
	if c.LeaseTTL > 0 && c.LeaseTTL < time.Second {
		bad("lease_ttl", "want at least 1s, got %v", c.LeaseTTL)
	}
	if c.DefaultOutputTokens < 0 {
		bad("default_output_tokens", "must not be negative")
	}
	c.FrontDoor.validate(bad)
	c.Ops.validate(bad)
	c.CORS.validate(bad)
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("log_level", "want debug, info, warn or error, got %q", c.LogLevel)
	}
	if c.VerifyTokenIDsEvery != nil && *c.VerifyTokenIDsEvery < 0 {
		bad("verify_token_ids_every", "must not be negative (0 = no sampled checks), got %d", *c.VerifyTokenIDsEvery)
	}
	if c.TokenIDsResumeMatches < 0 {
		bad("token_ids_resume_matches", "must not be negative, got %d", c.TokenIDsResumeMatches)
	}
	if c.TokenIDsRecheckInterval < 0 {
		bad("token_ids_recheck_interval", "must be positive, got %v", c.TokenIDsRecheckInterval)
	}
	if c.Simulate != nil && (c.Simulate.Engines < 1 || c.Simulate.Engines > 64) {
		bad("simulate.engines", "want 1..64, got %d", c.Simulate.Engines)
	}
	if c.Simulate != nil {
		for i, k := range c.Simulate.EngineKinds {
			if k != EngineSim && k != EngineVLLM && k != EngineSGLang {
				bad(fmt.Sprintf("simulate.engine_kinds[%d]", i), "want enginesim, vllm or sglang, got %q", k)
			}
		}
	}
	if len(c.Models) == 0 {
		bad("models", "at least one model is required")
	}
	names := map[string]string{}
	ids := map[string]string{}
	for i, m := range c.Models {
		p := fmt.Sprintf("models[%d]", i)
		if m.Name == "" {
			bad(p+".name", "required")
		} else if prev, dup := names[m.Name]; dup {
			bad(p+".name", "%q already used by %s", m.Name, prev)
		} else {
			names[m.Name] = p + ".name"
		}
		for j, l := range m.LoRAAdapters {
			k := fmt.Sprintf("%s.lora_adapters[%d]", p, j)
			if l == "" {
				bad(k, "empty adapter name")
			} else if prev, dup := names[l]; dup {
				bad(k, "%q already used by %s", l, prev)
			} else {
				names[l] = k
			}
		}
		if m.Tokenizer == "" {
			bad(p+".tokenizer", "required (an HF model directory)")
		}
		if m.BlockSize < 1 || m.BlockSize > 1024 {
			bad(p+".block_size", "want 1..1024, got %d", m.BlockSize)
		}
		if m.MaxPromptTokens < 0 {
			bad(p+".max_prompt_tokens", "must not be negative (0 = no limit), got %d", m.MaxPromptTokens)
		}
		if m.QueueTimeout < 0 {
			bad(p+".queue_timeout", "must not be negative")
		}
		if _, err := json.Marshal(m.Policy.Config); err != nil {
			bad(p+".policy.config", "not representable as JSON: %v", err)
		}
		if len(m.Endpoints) == 0 && c.Simulate == nil && m.EndpointsFrom == nil {
			bad(p+".endpoints", "at least one endpoint is required (or set simulate or endpoints_from)")
		}
		if m.EndpointsFrom != nil {
			m.EndpointsFrom.check(p+".endpoints_from", bad)
		}
		for j, e := range m.Endpoints {
			q := fmt.Sprintf("%s.endpoints[%d]", p, j)
			if prev, dup := ids[e.ID]; dup && e.ID != "" {
				bad(q+".id", "%q already used by %s", e.ID, prev)
			} else if e.ID != "" {
				ids[e.ID] = q + ".id"
			}
			e.check(q, bad)
		}
	}
	c.RunTimeEndpoints.check(bad)
	return errors.Join(errs...)
}

// Secrets are the values read from the environment variables the file names.
type Secrets struct {
	// AdminToken is the admin bearer token; empty disables the admin API (`kvgate serve` generates one instead).
	AdminToken string
	// ClientAPIKeys are accepted client bearer keys; empty leaves /v1/ open.
	ClientAPIKeys []string
	// StorePassword is the Redis password, if any.
	StorePassword string
	// MetricsToken is the bearer token for /metrics on listen (metrics_token_env), if any.
	MetricsToken string
	// EndpointKeys are the engines' API keys by endpoint ID (endpoints[].api_key_env; set and non-empty).
	EndpointKeys map[string]string
}

// Secrets reads the environment variables named by c using getenv (os.Getenv in production).
func (c *Config) Secrets(getenv func(string) string) Secrets {
	s := Secrets{AdminToken: strings.TrimSpace(getenv(c.AdminTokenEnv))}
	if c.ClientAPIKeysEnv != "" {
		for k := range strings.SplitSeq(getenv(c.ClientAPIKeysEnv), ",") {
			if k = strings.TrimSpace(k); k != "" {
				s.ClientAPIKeys = append(s.ClientAPIKeys, k)
			}
		}
	}
	if c.Store.PasswordEnv != "" {
		s.StorePassword = getenv(c.Store.PasswordEnv)
	}
	if c.MetricsTokenEnv != "" {
		s.MetricsToken = strings.TrimSpace(getenv(c.MetricsTokenEnv))
	}
	for _, m := range c.Models {
		for _, e := range m.Endpoints {
			if e.APIKeyEnv == "" {
				continue
			}
			if k := strings.TrimSpace(getenv(e.APIKeyEnv)); k != "" {
				if s.EndpointKeys == nil {
					s.EndpointKeys = map[string]string{}
				}
				s.EndpointKeys[e.ID] = k
			}
		}
	}
	return s
}

// ModelByName returns the model serving name (a model name or one of its LoRA adapters) and the adapter
// name ("" for the base model).
func (c *Config) ModelByName(name string) (m *Model, lora string, ok bool) {
	for i := range c.Models {
		if c.Models[i].Name == name {
			return &c.Models[i], "", true
		}
		for _, l := range c.Models[i].LoRAAdapters {
			if l == name {
				return &c.Models[i], l, true
			}
		}
	}
	return nil, "", false
}
