package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/plugins"
)

// errRejected makes `kvgate policy validate` exit non-zero after printing the report.
var errRejected = errors.New("policy module rejected")

// newPolicyCmd returns `kvgate policy` with the offline sub-commands validate and bench. extra are
// further sub-commands added by their owners (the gateway's upload|activate|rollback, which call the
// admin API).
func newPolicyCmd(extra ...*cobra.Command) *cobra.Command {
	policy := &cobra.Command{
		Use:   "policy",
		Short: "Validate, benchmark and manage Wasm routing policies",
	}
	cacheDir := defaultCacheDir()
	policy.PersistentFlags().StringVar(&cacheDir, "cache-dir", cacheDir,
		"wazero compilation cache directory (\"\" for none); compiled modules load in milliseconds from it")
	var name string
	var timeout time.Duration
	validate := &cobra.Command{
		Use:   "validate FILE.wasm",
		Short: "Load a policy module as the gateway would and print the validation report",
		Long: "Compiles the module, checks its exports and signatures, ABI version and imports, and runs the " +
			"sample snapshots under the per-call deadline, as the gateway does on upload. Prints the report " +
			"and exits non-zero when the module is rejected.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return policyValidate(cmd.Context(), cmd.OutOrStdout(), args[0], name, timeout, cacheDir)
		},
	}
	validate.Flags().StringVar(&name, "name", "", "policy name (default: the file name without .wasm)")
	validate.Flags().DurationVar(&timeout, "timeout", 50*time.Millisecond, "deadline of each sample call")

	var opts benchOptions
	bench := &cobra.Command{
		Use:   "bench FILE.wasm|builtin",
		Short: "Measure a policy's per-call latency through the host",
		Long: "Loads the module (or the embedded three-tier policy with `builtin`), activates it with --config " +
			"and calls it through the host's Rank with random snapshots of each --endpoints size, printing " +
			"latency percentiles per call (encode + Wasm call + decode + checks) and fallbacks. Uploaded " +
			"modules run with interruption on, as in the gateway.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return policyBench(cmd.Context(), cmd.OutOrStdout(), args[0], opts, cacheDir)
		},
	}
	bench.Flags().StringVar(&opts.endpoints, "endpoints", "8,16,64", "comma-separated fleet sizes")
	bench.Flags().IntVar(&opts.calls, "calls", 20000, "timed calls per fleet size")
	bench.Flags().StringVar(&opts.config, "config", "", "the policy's JSON config")
	policy.AddCommand(validate, bench)
	policy.AddCommand(extra...)
	return policy
}

// defaultCacheDir is $XDG_CACHE_HOME/kvgate/wazero (or the platform's equivalent), "" if unknown.
func defaultCacheDir() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "kvgate", "wazero")
}

func newHost(ctx context.Context, timeout time.Duration, cacheDir string) (*plugins.Host, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	return plugins.New(ctx, plugins.Options{
		Logger:            slog.New(slog.NewTextHandler(io.Discard, nil)),
		ValidationTimeout: timeout,
		CacheDir:          cacheDir,
	})
}

func policyValidate(ctx context.Context, w io.Writer, file, name string, timeout time.Duration, cacheDir string) error {
	wasm, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if name == "" {
		name = strings.TrimSuffix(filepath.Base(file), ".wasm")
	}
	h, err := newHost(ctx, timeout, cacheDir)
	if err != nil {
		return err
	}
	defer func() { _ = h.Close(context.Background()) }()
	_, rep, err := h.Load(name, wasm)
	if rep.Version != "" {
		fmt.Fprint(w, rep.String())
	}
	if errors.Is(err, plugins.ErrInvalidModule) {
		return fmt.Errorf("%w: %s", errRejected, rep.Version)
	}
	return err
}

type benchOptions struct {
	endpoints string
	calls     int
	config    string
}

func policyBench(ctx context.Context, w io.Writer, file string, o benchOptions, cacheDir string) error {
	var sizes []int
	for _, f := range strings.Split(o.endpoints, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("bad --endpoints %q", o.endpoints)
		}
		sizes = append(sizes, n)
	}
	if o.calls < 100 {
		return fmt.Errorf("--calls must be at least 100")
	}
	h, err := newHost(ctx, 50*time.Millisecond, cacheDir)
	if err != nil {
		return err
	}
	defer func() { _ = h.Close(context.Background()) }()
	v := h.BuiltinVersion()
	if file != "builtin" {
		wasm, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		v, _, err = h.Load(strings.TrimSuffix(filepath.Base(file), ".wasm"), wasm)
		if err != nil {
			return err
		}
	}
	if err := h.Activate("bench", v, []byte(o.config)); err != nil {
		return err
	}
	fmt.Fprintf(w, "policy %s\n%9s %9s %9s %9s %9s %9s %9s\n", v, "endpoints", "p50", "p90", "p99", "p99.9", "max", "fallbacks")
	for _, n := range sizes {
		snaps := make([]plugins.Snapshot, 64)
		for i := range snaps {
			snaps[i] = plugins.RandomSnapshot(uint64(n*1000+i), n)
		}
		for i := 0; i < 1000; i++ { // warm-up
			h.Rank(ctx, "bench", &snaps[i%len(snaps)])
		}
		lat := make([]time.Duration, o.calls)
		fallbacks := 0
		for i := range lat {
			s := &snaps[i%len(snaps)]
			t0 := time.Now()
			_, info := h.Rank(ctx, "bench", s)
			lat[i] = time.Since(t0)
			if info.Fallback {
				fallbacks++
			}
		}
		slices.Sort(lat)
		q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
		fmt.Fprintf(w, "%9d %9s %9s %9s %9s %9s %9d\n", n, q(0.5), q(0.9), q(0.99), q(0.999), lat[len(lat)-1], fallbacks)
	}
	return nil
}
