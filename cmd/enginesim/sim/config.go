package sim

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Config is one simulated engine's configuration. Build it with DefaultConfig and override fields; Start
// validates it. Durations are model time (what the simulated GPU would take); the wall-clock sleep is the
// model duration multiplied by TimeScale.
type Config struct {
	// Model is vLLM's --model: a directory holding tokenizer.json (or .json.gz) and tokenizer_config.json,
	// or any name when no tokenizer files are available (then the byte-level fallback tokenizer is used).
	Model string
	// ServedModelNames are the names clients use (vLLM --served-model-name); the first one labels metrics.
	// Empty means [Model].
	ServedModelNames []string
	// LoRAModules are LoRA adapter names served on top of the base model (vLLM --lora-modules name=path;
	// only the names matter here). A request selects one by model name "<lora>" or "<base>:<lora>", or by a
	// "lora" field.
	LoRAModules []string
	// Host is the HTTP listen host ("" = all interfaces).
	Host string
	// Port is the HTTP port; 0 picks a free port (see Engine.HTTPAddr).
	Port int

	// BlockSize is tokens per KV block (vLLM --block-size, default 16).
	BlockSize int
	// NumGPUBlocks is the GPU KV-cache capacity in blocks (vLLM --num-gpu-blocks-override).
	NumGPUBlocks int
	// NumCPUBlocks is the CPU offload tier's capacity in blocks; 0 disables the tier.
	NumCPUBlocks int
	// EnablePrefixCaching turns prefix-cache lookups on (vLLM --enable-prefix-caching, default on).
	EnablePrefixCaching bool
	// HashSeed is the PYTHONHASHSEED string vLLM hashes into NONE_HASH, the root of the sha256_cbor chain.
	HashSeed string
	// MaxModelLen caps prompt + output tokens per request (vLLM --max-model-len).
	MaxModelLen int
	// DefaultMaxTokens is the number of tokens generated when a request sets no max_tokens.
	DefaultMaxTokens int

	// MaxNumSeqs caps running requests (vLLM --max-num-seqs); the rest wait in FCFS order.
	MaxNumSeqs int
	// MaxNumBatchedTokens is the token budget of one scheduler step (vLLM --max-num-batched-tokens); longer
	// prefills are chunked over several steps.
	MaxNumBatchedTokens int
	// StepOverhead is the fixed cost of one scheduler step (the batch-1 decode inter-token latency).
	StepOverhead time.Duration
	// DecodePerSeq is the extra step time per request in the batch, so inter-token latency grows with it.
	DecodePerSeq time.Duration
	// PrefillPerToken is the compute time of one uncached prompt token.
	PrefillPerToken time.Duration
	// CPUReloadPerToken is the time to copy one token's KV from the CPU tier back to GPU (a CPU-tier hit).
	CPUReloadPerToken time.Duration
	// KVBytesPerToken is the KV-cache size of one token in bytes (offload transfer counters).
	KVBytesPerToken int
	// TimeScale multiplies every simulated duration into wall time (1 = real time, 0.01 = 100× faster,
	// 0 = no sleeping at all).
	TimeScale float64

	// KVEvents configures the KV-event publisher (vLLM --kv-events-config).
	KVEvents KVEventsConfig
	// EventsEncoding is "array" (vLLM ≤ 0.23 tagged arrays, lora_name layout) or "map" (vLLM ≥ 0.24).
	EventsEncoding string
	// EventsHashForm is "int" (vLLM's default, last 8 digest bytes as uint64) or "bytes" (32-byte digests).
	EventsHashForm string
	// CPUEventsSelfDescribing makes CPU-tier BlockStored events carry parent, token IDs and block size
	// (vLLM's self_describing_kv_events); false sends vLLM's token-less placeholders.
	CPUEventsSelfDescribing bool

	// API is the engine dialect: APIVLLM (default, "") or APISGLang (dialect.go): which chat field carries
	// pre-tokenized prompts and how /tokenize is served.
	API string
	// RenderTokenizePerToken is the time the engine spends rendering the chat template and tokenizing, per
	// prompt token, when it tokenizes a prompt itself (× TimeScale, wall time; 0 = only the simulator's own
	// Go tokenizer). Calibrated from HF's Rust tokenizer and a Jinja render: gateway/RATIONALE.md "Token
	// IDs on chat".
	RenderTokenizePerToken time.Duration

	// DataParallelSize is vLLM's --data-parallel-size: that many ranks, each with its own scheduler
	// (MaxNumSeqs each), KV cache (NumGPUBlocks, NumCPUBlocks each) and KV-event publisher at the
	// configured event and replay ports + rank, its batches carrying data_parallel_rank. A request's
	// X-data-parallel-rank header picks its rank; without one the least-loaded rank serves it. 0 or 1: one
	// engine, no rank in the events beyond rank 0.
	DataParallelSize int

	// Faults are the faults armed at start (see Faults); POST /sim/faults changes them at run time.
	Faults Faults
}

// KVEventsConfig mirrors vLLM's KVEventsConfig (vllm/config/kv_events.py), parsed from the JSON given to
// --kv-events-config. Unknown fields are rejected.
type KVEventsConfig struct {
	// EnableKVCacheEvents turns publishing on.
	EnableKVCacheEvents bool `json:"enable_kv_cache_events"`
	// Publisher is "zmq" or "null" (default "zmq" when enabled, like vLLM).
	Publisher string `json:"publisher"`
	// Endpoint is the PUB socket's address; it binds when it contains "*" or "::" (vLLM's rule), else it
	// connects. Default "tcp://*:5557"; port 0 picks a free port.
	Endpoint string `json:"endpoint"`
	// ReplayEndpoint is the ROUTER socket's bind address; empty disables replay.
	ReplayEndpoint string `json:"replay_endpoint"`
	// BufferSteps is how many batches replay keeps (default 10000).
	BufferSteps int `json:"buffer_steps"`
	// HWM is the PUB high-water mark in messages (default 100000).
	HWM int `json:"hwm"`
	// MaxQueueSize is vLLM's publisher queue size (accepted, default 100000).
	MaxQueueSize int `json:"max_queue_size"`
	// Topic is the first frame of every message (default "").
	Topic string `json:"topic"`
}

// ParseKVEventsConfig decodes vLLM's --kv-events-config JSON strictly and fills vLLM's defaults.
func ParseKVEventsConfig(s string) (KVEventsConfig, error) {
	var c KVEventsConfig
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, &ConfigError{Field: "kv-events-config", Reason: err.Error()}
	}
	c.fillDefaults()
	return c, nil
}

func (c *KVEventsConfig) fillDefaults() {
	if c.Publisher == "" {
		if c.EnableKVCacheEvents {
			c.Publisher = "zmq"
		} else {
			c.Publisher = "null"
		}
	}
	if c.Endpoint == "" {
		c.Endpoint = "tcp://*:5557"
	}
	if c.BufferSteps == 0 {
		c.BufferSteps = 10000
	}
	if c.HWM == 0 {
		c.HWM = 100000
	}
	if c.MaxQueueSize == 0 {
		c.MaxQueueSize = 100000
	}
}

// Default timing and capacity of an 8B model (Llama-3.1-8B class, bf16) on one H100 SXM; README.md shows
// where each number comes from.
const (
	// DefaultBlockSize is vLLM's default block size in tokens.
	DefaultBlockSize = 16
	// DefaultNumGPUBlocks is the KV capacity of an 8B bf16 model on one 80 GB H100 at vLLM's
	// gpu_memory_utilization 0.9 (~59 GB for KV / 2 MiB per block).
	DefaultNumGPUBlocks = 28000
	// DefaultMaxNumSeqs is vLLM's long-standing default --max-num-seqs (newer releases pick larger values
	// on large GPUs; set the flag to match a deployment).
	DefaultMaxNumSeqs = 256
	// DefaultMaxNumBatchedTokens is the token budget per step (vLLM V1's API-server default on large GPUs).
	DefaultMaxNumBatchedTokens = 8192
	// DefaultMaxModelLen is Llama-3.1-8B's context length.
	DefaultMaxModelLen = 131072
	// DefaultMaxTokens is the output length of requests without max_tokens.
	DefaultMaxTokens = 16
	// DefaultStepOverhead is the batch-1 decode step: 16 GB of weights read at ~70% of 3.35 TB/s.
	DefaultStepOverhead = 7 * time.Millisecond
	// DefaultDecodePerSeq is one more sequence's KV read per step (~1.5k tokens × 128 KiB at 3.35 TB/s).
	DefaultDecodePerSeq = 60 * time.Microsecond
	// DefaultPrefillPerToken is 16 GFLOP per token at ~33% of 989 dense bf16 TFLOPS.
	DefaultPrefillPerToken = 50 * time.Microsecond
	// DefaultCPUReloadPerToken is 128 KiB per token over PCIe Gen5 at ~25 GB/s effective.
	DefaultCPUReloadPerToken = 5 * time.Microsecond
	// DefaultKVBytesPerToken is Llama-3.1-8B's KV size per token: 32 layers × 8 KV heads × 128 dims × 2
	// (K and V) × 2 bytes.
	DefaultKVBytesPerToken = 131072
)

// DefaultConfig returns the defaults: an 8B model on one H100, prefix caching on, no CPU tier, events off,
// real time (TimeScale 1), HashSeed "0".
func DefaultConfig() Config {
	return Config{
		BlockSize:               DefaultBlockSize,
		NumGPUBlocks:            DefaultNumGPUBlocks,
		EnablePrefixCaching:     true,
		HashSeed:                "0",
		MaxModelLen:             DefaultMaxModelLen,
		DefaultMaxTokens:        DefaultMaxTokens,
		MaxNumSeqs:              DefaultMaxNumSeqs,
		MaxNumBatchedTokens:     DefaultMaxNumBatchedTokens,
		StepOverhead:            DefaultStepOverhead,
		DecodePerSeq:            DefaultDecodePerSeq,
		PrefillPerToken:         DefaultPrefillPerToken,
		CPUReloadPerToken:       DefaultCPUReloadPerToken,
		KVBytesPerToken:         DefaultKVBytesPerToken,
		TimeScale:               1,
		EventsEncoding:          "array",
		EventsHashForm:          "int",
		CPUEventsSelfDescribing: true,
		KVEvents:                KVEventsConfig{Publisher: "null"},
	}
}

// Validate reports the first invalid field as a *ConfigError.
func (c *Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case c.Model == "":
		return bad("model", "must be set")
	case c.BlockSize < 1:
		return bad("block-size", "%d < 1", c.BlockSize)
	case c.NumGPUBlocks < 1:
		return bad("num-gpu-blocks-override", "%d < 1", c.NumGPUBlocks)
	case c.NumCPUBlocks < 0:
		return bad("num-cpu-blocks", "%d < 0", c.NumCPUBlocks)
	case c.MaxModelLen < 1:
		return bad("max-model-len", "%d < 1", c.MaxModelLen)
	case c.DefaultMaxTokens < 1:
		return bad("default-max-tokens", "%d < 1", c.DefaultMaxTokens)
	case c.MaxNumSeqs < 1:
		return bad("max-num-seqs", "%d < 1", c.MaxNumSeqs)
	case c.MaxNumBatchedTokens < c.MaxNumSeqs:
		return bad("max-num-batched-tokens", "%d is below max-num-seqs %d (as vLLM requires)", c.MaxNumBatchedTokens, c.MaxNumSeqs)
	case c.StepOverhead < 0 || c.DecodePerSeq < 0 || c.PrefillPerToken < 0 || c.CPUReloadPerToken < 0:
		return bad("timing", "durations must not be negative")
	case c.KVBytesPerToken < 0:
		return bad("kv-bytes-per-token", "%d < 0", c.KVBytesPerToken)
	case c.TimeScale < 0:
		return bad("time-scale", "%g < 0", c.TimeScale)
	case c.Port < 0 || c.Port > 65535:
		return bad("port", "%d out of range", c.Port)
	case c.EventsEncoding != "array" && c.EventsEncoding != "map":
		return bad("kv-events-encoding", "%q is not array or map", c.EventsEncoding)
	case c.DataParallelSize < 0 || c.DataParallelSize > 64:
		return bad("data-parallel-size", "want 1..64, got %d", c.DataParallelSize)
	case c.EventsHashForm != "int" && c.EventsHashForm != "bytes":
		return bad("kv-events-hash-form", "%q is not int or bytes", c.EventsHashForm)
	case c.API != "" && c.API != APIVLLM && c.API != APISGLang:
		return bad("api", "%q is not vllm or sglang", c.API)
	case c.RenderTokenizePerToken < 0:
		return bad("render-tokenize-per-token", "must not be negative")
	}
	k := &c.KVEvents
	k.fillDefaults()
	if k.Publisher != "zmq" && k.Publisher != "null" {
		return bad("kv-events-config", "publisher %q is not zmq or null", k.Publisher)
	}
	if k.BufferSteps < 1 {
		return bad("kv-events-config", "buffer_steps %d < 1", k.BufferSteps)
	}
	for _, n := range c.servedNames() {
		if strings.Contains(n, ":") {
			return bad("served-model-name", "%q must not contain ':' (it separates base and LoRA names)", n)
		}
	}
	return c.Faults.validate()
}

// servedNames returns ServedModelNames, or [Model] when empty.
func (c *Config) servedNames() []string {
	if len(c.ServedModelNames) > 0 {
		return c.ServedModelNames
	}
	return []string{c.Model}
}

// eventsEnabled reports whether a ZMQ publisher runs.
func (c *Config) eventsEnabled() bool {
	return c.KVEvents.EnableKVCacheEvents && c.KVEvents.Publisher == "zmq"
}
