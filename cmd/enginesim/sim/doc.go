// Package sim is enginesim's engine: a simulated vLLM server that behaves like vLLM wherever kvgate can
// see it, without a GPU. Start one (or several, in one process) with Start; each has its own HTTP server,
// Prometheus registry, KV cache and optional ZMQ KV-event publisher.
//
// # What it simulates
//
//   - HTTP (net/http): POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
//     GET /metrics, POST /tokenize, POST /reset_prefix_cache, plus GET/POST /sim/faults. Responses, SSE
//     chunks and errors have vLLM's JSON shapes. A chat request may carry prompt_token_ids and a
//     completions request token-ID prompts; otherwise text is tokenized with the model directory's own
//     tokenizer and chat template (gateway/textmodel), or a byte-level fallback when there are no tokenizer
//     files. Every request generates exactly max_tokens tokens (default Config.DefaultMaxTokens) of a fixed
//     English sentence, finish_reason "length".
//   - A paged KV cache: Config.NumGPUBlocks blocks of Config.BlockSize tokens, prefix lookup by vLLM's
//     sha256_cbor block hashes (cmd/enginesim/vllmhash, rooted at Config.HashSeed, LoRA name and cache_salt
//     folded in), LRU eviction of unreferenced blocks from GPU to an optional CPU tier
//     (Config.NumCPUBlocks) and from there out; blocks of running requests are pinned.
//   - A scheduler stepping like vLLM's: at most Config.MaxNumSeqs running requests (FCFS waiting queue), a
//     token budget per step (chunked prefill), and a step duration of StepOverhead + DecodePerSeq × batch +
//     PrefillPerToken × computed prompt tokens + CPUReloadPerToken × CPU-tier hit tokens. Durations are
//     simulated model time; the engine sleeps them × Config.TimeScale.
//   - KV events (kvstore/kvevents encoder) on a ZMQ PUB socket, once per step that changed the cache, with a
//     replay ROUTER socket; metrics with vLLM's names; fault injection (Faults).
//
// All durations in metrics, usage headers and Stats are simulated model time, so tests that run with a
// small TimeScale see the numbers an H100 would produce.
//
// # Concurrency
//
// An Engine is safe for concurrent use. One scheduler goroutine owns the cache; HTTP handlers hand it
// requests and read their tokens back. A client that disconnects cancels its request at the next step.
//
// # Errors
//
// Start returns *ConfigError for invalid configuration. Bad requests are answered with vLLM's error JSON
// (400 BadRequestError, 404 NotFoundError), built from *RequestError. Engine methods return ErrClosed
// after Close.
package sim
