// Command enginesim is a vLLM-compatible engine simulator: vLLM's OpenAI API and SSE framing, its metric
// names, its KV-event wire format, and a paged prefix cache whose hits shorten prefill as on a real GPU,
// without a GPU. Flags are named as vLLM names them; the simulator's own flags say so in --help. See
// README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvgate/kvgate/cmd/enginesim/sim"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "enginesim:", err)
		os.Exit(2)
	}
}

// parseFlags turns the command line (and PYTHONHASHSEED) into a sim.Config.
func parseFlags(args []string, getenv func(string) string) (sim.Config, error) {
	cfg := sim.DefaultConfig()
	fs := pflag.NewFlagSet("enginesim", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: enginesim [--model] DIR|NAME [flags]\n\n"+
			"A vLLM-compatible engine simulator. Flags marked (vLLM) mean what they mean to `vllm serve`;\n"+
			"the others are the simulator's own. Durations take Go syntax (7ms, 50us).\n\n%s", fs.FlagUsages())
	}
	fs.StringVar(&cfg.Model, "model", "", "(vLLM) model directory with tokenizer.json[.gz] + tokenizer_config.json, or any name (then a byte-level tokenizer is used); may also be given as the first argument")
	fs.StringSliceVar(&cfg.ServedModelNames, "served-model-name", nil, "(vLLM) model name(s) clients use; the first labels metrics (default: --model)")
	loraModules := fs.StringSlice("lora-modules", nil, "(vLLM) LoRA adapters as name=path or name; requests select one with model \"<name>\" or \"<served>:<name>\" (with none listed, any adapter name is accepted)")
	fs.Bool("enable-lora", false, "(vLLM) accepted for compatibility; LoRA selection is always on")
	fs.StringVar(&cfg.Host, "host", "", "(vLLM) HTTP listen host (default all interfaces)")
	fs.IntVar(&cfg.Port, "port", 8000, "(vLLM) HTTP port; 0 picks a free port")
	fs.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "(vLLM) tokens per KV-cache block")
	fs.IntVar(&cfg.NumGPUBlocks, "num-gpu-blocks-override", cfg.NumGPUBlocks, "(vLLM) GPU KV-cache capacity in blocks (default: an 8B model on one 80 GB H100)")
	fs.IntVar(&cfg.NumCPUBlocks, "num-cpu-blocks", 0, "CPU offload tier capacity in blocks (GPU evictions go there, LRU); 0 disables it")
	fs.BoolVar(&cfg.EnablePrefixCaching, "enable-prefix-caching", true, "(vLLM) reuse cached prompt blocks")
	noPrefix := fs.Bool("no-enable-prefix-caching", false, "(vLLM) disable prefix caching")
	hashAlgo := fs.String("prefix-caching-hash-algo", "sha256_cbor", "(vLLM) block hash algorithm; only sha256_cbor is simulated")
	hashSeed := fs.String("hash-seed", "", "PYTHONHASHSEED the block hashes are rooted at (default: $PYTHONHASHSEED, else \"0\")")
	fs.IntVar(&cfg.MaxModelLen, "max-model-len", cfg.MaxModelLen, "(vLLM) maximum prompt + output tokens per request")
	fs.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", cfg.MaxNumSeqs, "(vLLM) maximum running requests; others wait (FCFS)")
	fs.IntVar(&cfg.MaxNumBatchedTokens, "max-num-batched-tokens", cfg.MaxNumBatchedTokens, "(vLLM) token budget of one scheduler step (longer prefills are chunked)")
	fs.IntVar(&cfg.DefaultMaxTokens, "default-max-tokens", cfg.DefaultMaxTokens, "tokens generated when a request sets no max_tokens (every request generates exactly max_tokens)")
	kvEvents := fs.String("kv-events-config", "", "(vLLM) KV-event publisher JSON: enable_kv_cache_events, publisher (zmq|null), endpoint, replay_endpoint, topic, buffer_steps, hwm")
	fs.StringVar(&cfg.EventsEncoding, "kv-events-encoding", cfg.EventsEncoding, "event encoding: array (vLLM <= 0.23 tagged arrays), map (vLLM >= 0.24 tagged maps), or a kvevents layout name")
	fs.StringVar(&cfg.EventsHashForm, "kv-events-hash-form", cfg.EventsHashForm, "block hashes in events: int (uint64, vLLM default) or bytes (32-byte digests, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)")
	offloadEvents := fs.String("kv-offload-events", "self-describing", "CPU-tier BlockStored events: self-describing (parent, token IDs, block size) or placeholder (token-less, vLLM's default)")
	fs.Float64Var(&cfg.TimeScale, "time-scale", cfg.TimeScale, "wall time per simulated second (0.01 runs 100x faster; 0 never sleeps); metrics report simulated time")
	fs.DurationVar(&cfg.StepOverhead, "step-overhead", cfg.StepOverhead, "fixed time of one scheduler step (batch-1 inter-token latency)")
	fs.DurationVar(&cfg.DecodePerSeq, "decode-per-seq", cfg.DecodePerSeq, "extra step time per request in the batch")
	fs.DurationVar(&cfg.PrefillPerToken, "prefill-per-token", cfg.PrefillPerToken, "compute time of one uncached prompt token")
	fs.DurationVar(&cfg.CPUReloadPerToken, "cpu-reload-per-token", cfg.CPUReloadPerToken, "time to reload one token's KV from the CPU tier")
	fs.IntVar(&cfg.KVBytesPerToken, "kv-bytes-per-token", cfg.KVBytesPerToken, "KV bytes of one token (offload byte counters)")
	fs.IntVar(&cfg.Faults.FailStatus, "fault-fail-status", 0, "fault: answer completion requests with this status (500 or 503)")
	fs.IntVar(&cfg.Faults.FailCount, "fault-fail-count", 0, "fault: how many requests --fault-fail-status hits (-1 = all; default 1)")
	fs.IntVar(&cfg.Faults.CloseAfterChunks, "fault-close-after-chunks", 0, "fault: close streaming connections after this many SSE chunks")
	fs.IntVar(&cfg.Faults.CloseCount, "fault-close-count", 0, "fault: how many requests --fault-close-after-chunks hits (-1 = all; default 1)")
	stall := fs.Duration("fault-stall-before-headers", 0, "fault: delay response headers by this long")
	fs.IntVar(&cfg.Faults.StallCount, "fault-stall-count", 0, "fault: how many requests the stall hits (-1 = all; default 1)")
	fs.IntVar(&cfg.Faults.DropEventBatches, "fault-drop-event-batches", 0, "fault: drop this many upcoming KV-event batches (sequence gap; they stay replayable)")
	fs.StringVar(&cfg.API, "api", sim.APIVLLM, "engine dialect: vllm (chat takes kv_transfer_params.prompt_token_ids or prompt_token_ids; POST /tokenize) or sglang (chat takes input_ids; POST /v1/tokenize)")
	fs.DurationVar(&cfg.RenderTokenizePerToken, "render-tokenize-per-token", 0, "time per prompt token the engine spends on chat-template render + tokenize when it tokenizes a prompt itself (x --time-scale; 0 = only the simulator's own tokenizer)")
	fs.BoolVar(&cfg.Faults.TemplateDrift, "fault-template-drift", false, "fault: render chat prompts with a changed template (generation and /tokenize) until disarmed")
	fs.IntVar(&cfg.DataParallelSize, "data-parallel-size", 1, "(vLLM) data-parallel ranks, each with its own scheduler, KV cache and KV-event publisher (event and replay ports + rank); X-data-parallel-rank picks a request's rank")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 1 || (fs.NArg() == 1 && cfg.Model != "") {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if fs.NArg() == 1 {
		cfg.Model = fs.Arg(0)
	}
	if *noPrefix {
		cfg.EnablePrefixCaching = false
	}
	if *hashAlgo != "sha256_cbor" {
		return cfg, fmt.Errorf("--prefix-caching-hash-algo %q: only sha256_cbor is simulated", *hashAlgo)
	}
	switch {
	case *hashSeed != "":
		cfg.HashSeed = *hashSeed
	case getenv("PYTHONHASHSEED") != "":
		cfg.HashSeed = getenv("PYTHONHASHSEED")
	}
	for _, m := range *loraModules {
		name, _, _ := strings.Cut(m, "=")
		cfg.LoRAModules = append(cfg.LoRAModules, name)
	}
	if *kvEvents != "" {
		kc, err := sim.ParseKVEventsConfig(*kvEvents)
		if err != nil {
			return cfg, err
		}
		cfg.KVEvents = kc
	}
	switch *offloadEvents {
	case "self-describing":
		cfg.CPUEventsSelfDescribing = true
	case "placeholder":
		cfg.CPUEventsSelfDescribing = false
	default:
		return cfg, fmt.Errorf("--kv-offload-events %q: want self-describing or placeholder", *offloadEvents)
	}
	cfg.Faults.StallBeforeHeaders = sim.Duration(*stall)
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		return cfg, fmt.Errorf("--log-level: %w", err)
	}
	logLevelVar.Set(lvl)
	return cfg, cfg.Validate()
}

var logLevelVar slog.LevelVar

func run(args []string) error {
	cfg, err := parseFlags(args, os.Getenv)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: &logLevelVar}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	e, err := sim.StartWithLogger(startCtx, cfg, log)
	cancel()
	if err != nil {
		return err
	}
	<-ctx.Done()
	log.Info("enginesim stopping")
	return e.Close()
}
