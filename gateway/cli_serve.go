package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/cmd/enginesim/sim"
	"github.com/kvgate/kvgate/gateway/config"
	"github.com/kvgate/kvgate/gateway/internal/model"
	"github.com/kvgate/kvgate/gateway/internal/route"
)

// newServeCmd returns `kvgate serve --config FILE`: run the gateway until SIGINT/SIGTERM.
func newServeCmd() *cobra.Command {
	var cfgPath, listen string
	cmd := &cobra.Command{
		Use:   "serve --config FILE [--listen ADDR]",
		Short: "Run the gateway",
		Long: "Runs the OpenAI-compatible gateway described by the YAML config (see README.md, \"Configuration\"). " +
			"With `simulate: {engines: N}` it first starts N simulated engines in-process (the `make run` demo). " +
			"When the admin token variable is empty, a random token is generated and printed.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serveOn(cmd.Context(), cfgPath, listen, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&cfgPath, "config", "", "path of the YAML configuration (required)")
	cmd.Flags().StringVar(&listen, "listen", "", "address to listen on (host:port, :port), instead of the config's listen key")
	cmd.MarkFlagRequired("config")
	return cmd
}

// redisLog routes go-redis's global logger into slog.
type redisLog struct{ l *slog.Logger }

func (r redisLog) Printf(ctx context.Context, format string, v ...any) {
	r.l.WarnContext(ctx, "redis client", slog.String("detail", fmt.Sprintf(format, v...)))
}

func logLevel(s string) slog.Level {
	switch s {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

func serve(ctx context.Context, cfgPath string, out io.Writer) error {
	return serveOn(ctx, cfgPath, "", out)
}

// serveOn is serve with the config's listen address replaced by listen (unless "").
func serveOn(ctx context.Context, cfgPath, listen string, out io.Writer) error {
	if ctx == nil {
		ctx = context.Background()
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return err
	}
	if listen != "" {
		cfg.Listen = listen
	}
	log := slog.New(NewLogHandler(os.Stderr, logLevel(cfg.LogLevel)))
	slog.SetDefault(log)
	redis.SetLogger(redisLog{log})

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	engines, err := startSimulated(ctx, cfg, log)
	defer func() {
		for _, e := range engines {
			e.Close()
		}
	}()
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}

	secrets := cfg.Secrets(os.Getenv)
	generated := false
	if secrets.AdminToken == "" {
		var b [16]byte
		rand.Read(b[:])
		secrets.AdminToken = hex.EncodeToString(b[:])
		generated = true
	}
	cacheDir := ""
	if d, err := os.UserCacheDir(); err == nil {
		cacheDir = filepath.Join(d, "kvgate", "wazero")
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	g, err := Start(ctx, Options{Config: cfg, Secrets: secrets, Log: log, Listener: ln,
		PolicyCacheDir: cacheDir, ConfigPath: cfgPath,
		LoadEncoder: func(dir string) (route.Encoder, error) { return model.Load(dir) }})
	if err != nil {
		ln.Close()
		return err
	}
	printBanner(out, cfg, g.Addr(), secrets.AdminToken, generated, len(engines))
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP) // re-read the config file: endpoint changes apply at run time
	defer func() { signal.Stop(hup); close(hup) }()
	go func() {
		for range hup {
			rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = g.Reload(rctx) // logged by the gateway
			cancel()
		}
	}()

	var stopped error
	select {
	case <-ctx.Done():
		// SIGTERM/SIGINT: drain (README "Operations"). stop() restores the signals' default action, so a
		// second signal ends the process at once.
		stop()
		if err := g.Drain(context.Background(), cfg.Grace(), cfg.Drain()); err != nil &&
			!errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return nil
	case stopped = <-g.Stopped(): // logged by the gateway; exit non-zero so that a supervisor restarts us
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Drain())
	defer cancel()
	g.Close(sctx)
	return stopped
}

// startSimulated starts cfg.Simulate.Engines simulated engines for every model that lists no endpoints and
// adds them to the model as endpoints sim-<model>-<i> with KV events over loopback ZMQ, of the kinds
// simulate.engine_kinds cycles through (enginesim by default; vllm and sglang run the simulator in that
// engine's dialect).
func startSimulated(ctx context.Context, cfg *config.Config, log *slog.Logger) ([]*sim.Engine, error) {
	if cfg.Simulate == nil {
		return nil, nil
	}
	var engines []*sim.Engine
	for mi := range cfg.Models {
		m := &cfg.Models[mi]
		if len(m.Endpoints) > 0 {
			continue
		}
		for i := range cfg.Simulate.Engines {
			kind := config.EngineSim
			if ks := cfg.Simulate.EngineKinds; len(ks) > 0 {
				kind = ks[i%len(ks)]
			}
			sc := sim.DefaultConfig()
			if kind == config.EngineSGLang {
				sc.API = sim.APISGLang
			}
			sc.Model = m.Tokenizer
			sc.ServedModelNames = []string{m.Name}
			sc.LoRAModules = m.LoRAAdapters
			sc.Host = "127.0.0.1"
			sc.BlockSize = m.BlockSize
			// "*" makes the publisher bind (vLLM's rule); port 0 picks a free port, reported by EventsAddr.
			kv, err := sim.ParseKVEventsConfig(`{"enable_kv_cache_events":true,"endpoint":"tcp://*:0","replay_endpoint":"tcp://*:0"}`)
			if err != nil {
				return engines, err
			}
			sc.KVEvents = kv
			e, err := sim.StartWithLogger(ctx, sc, log.With(slog.String("sim", fmt.Sprintf("%s-%d", m.Name, i))))
			if err != nil {
				return engines, fmt.Errorf("simulate: engine %d for %s: %w", i, m.Name, err)
			}
			engines = append(engines, e)
			m.Endpoints = append(m.Endpoints, config.Endpoint{ID: fmt.Sprintf("sim-%s-%d", m.Name, i),
				Engine: kind, ChatTokenIDs: config.DefaultChatTokenIDs[kind], URL: "http://" + e.HTTPAddr(), KVEvents: e.EventsAddr(),
				KVReplay: e.ReplayAddr(), MaxInflightRequests: cfg.Simulate.MaxInflightRequests,
				MaxInflightTokens: cfg.Simulate.MaxInflightTokens})
		}
	}
	return engines, nil
}

// demoRequest is the README's first request (a system prompt of six whole blocks), relative to the
// repository root where `make run` runs.
const demoRequest = "examples/requests/cached-chat.json"

func printBanner(out io.Writer, cfg *config.Config, addr, token string, generated bool, sims int) {
	host := addr
	if strings.HasPrefix(host, "[::]:") || strings.HasPrefix(host, "0.0.0.0:") {
		host = "localhost" + host[strings.LastIndex(host, ":"):]
	}
	model := cfg.Models[0].Name
	fmt.Fprintf(out, "\nkvgate is listening on http://%s", host)
	if sims > 0 {
		fmt.Fprintf(out, " with %d simulated engines", sims)
	}
	fmt.Fprintf(out, " (store: %s).\n\nTry it:\n\n", cfg.Store.Kind)
	if _, err := os.Stat(demoRequest); err == nil && model == "qwen3" {
		// The demo: a system prompt of whole blocks, sent twice; the second answer has cached tokens.
		fmt.Fprintf(out, "  for i in 1 2; do\n    curl -s http://%s/v1/chat/completions -H 'Content-Type: application/json' \\\n", host)
		fmt.Fprintf(out, "      -d @%s -D - | grep -o -i -e 'x-kvgate-endpoint: [^[:space:]]*' -e '\"cached_tokens\":[0-9]*'\n  done\n\n", demoRequest)
	} else {
		fmt.Fprintf(out, "  curl -s http://%s/v1/chat/completions -H 'Content-Type: application/json' \\\n", host)
		fmt.Fprintf(out, "    -d '{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}],\"max_tokens\":16}' -i\n\n", model)
	}
	fmt.Fprintf(out, "Explain a routing decision (admin API):\n\n")
	fmt.Fprintf(out, "  curl -s http://%s/admin/v1/route -H 'Authorization: Bearer %s' \\\n", host, token)
	fmt.Fprintf(out, "    -d '{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}]}'\n\n", model)
	if generated {
		fmt.Fprintf(out, "Admin token (generated for this run; set %s to choose one): %s\n", cfg.AdminTokenEnv, token)
	} else {
		fmt.Fprintf(out, "Admin token: from $%s\n", cfg.AdminTokenEnv)
	}
	fmt.Fprintf(out, "Metrics: http://%s/metrics   Ready: http://%s/readyz   Stop: Ctrl-C\n\n", host, host)
}
