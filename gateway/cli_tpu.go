package gateway

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/gateway/internal/admin"
	"github.com/kvgate/kvgate/tpu"
)

// newTPUCmd is `kvgate tpu`: the TPU slice allocator through a running gateway's admin API. Every
// sub-command prints the response JSON; a refusal prints {"error":{"code":"no_capacity",...}} and exits 1.
func newTPUCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "tpu", Short: "Reserve TPU slices and sub-slices on the gateway's store", SilenceUsage: true, SilenceErrors: true}
	var ac adminClient
	ac.flags(cmd)
	// flags on the parent apply to every sub-command
	cmd.PersistentFlags().AddFlagSet(cmd.Flags())
	var pool string
	cmd.PersistentFlags().StringVar(&pool, "pool", "", "pool name (required)")
	base := func() string { return "/admin/v1/tpu/pools/" + url.PathEscape(pool) }
	send := func(c *cobra.Command, method, path string, body any) error {
		if pool == "" && !strings.HasSuffix(path, "/pools") {
			return fmt.Errorf("--pool is required")
		}
		var b []byte
		ctype := ""
		if body != nil {
			var err error
			if b, err = json.Marshal(body); err != nil {
				return err
			}
			ctype = "application/json"
		}
		return ac.do(c.Context(), c.OutOrStdout(), method, path, ctype, b)
	}

	var sliceID, gen, topo, hosts string
	var devices int
	register := &cobra.Command{Use: "register", Short: "Register a slice (idempotent)", Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			spec := tpu.SliceSpec{ID: sliceID, Generation: gen, Topology: topo, DevicesPerChip: devices}
			for i, h := range strings.Split(hosts, ",") {
				if h = strings.TrimSpace(h); h != "" {
					spec.Hosts = append(spec.Hosts, tpu.Host{Name: h, WorkerID: i})
				}
			}
			return send(c, "POST", base()+"/slices", spec)
		}}
	register.Flags().StringVar(&sliceID, "slice", "", "slice ID")
	register.Flags().StringVar(&gen, "gen", "", "generation: v4, v5e (v5litepod), v5p, v6e, tpu7x (v7x)")
	register.Flags().StringVar(&topo, "topology", "", "topology, e.g. 4x4 or 4x4x4")
	register.Flags().StringVar(&hosts, "hosts", "", "host names in worker-ID order, comma-separated")
	register.Flags().IntVar(&devices, "devices-per-chip", 0, "devices per chip (tpu7x: 1 or 2; 0 = default)")

	var shape, holder, ttl, strategy string
	var index int
	var whole, subHost bool
	reserve := &cobra.Command{Use: "reserve", Short: "Reserve a sub-slice (--shape) or a whole slice (--whole --topology)", Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			r := admin.LeaseRequest{Request: tpu.Request{Shape: shape, Whole: whole, Holder: holder, Slice: sliceID,
				Strategy: tpu.Strategy(strategy), AllowSubHost: subHost}, TTL: ttl}
			if whole {
				r.Shape = topo
			}
			if c.Flags().Changed("index") {
				r.Index = &index
			}
			return send(c, "POST", base()+"/leases", r)
		}}
	reserve.Flags().StringVar(&shape, "shape", "", "sub-slice shape, e.g. 2x2")
	reserve.Flags().BoolVar(&whole, "whole", false, "reserve a whole idle slice of --topology (or --slice)")
	reserve.Flags().StringVar(&topo, "topology", "", "with --whole: the slice topology")
	reserve.Flags().StringVar(&holder, "holder", "", "lease holder name")
	reserve.Flags().StringVar(&ttl, "ttl", "30s", "lease TTL (renew before it ends)")
	reserve.Flags().StringVar(&sliceID, "slice", "", "only this slice")
	reserve.Flags().IntVar(&index, "index", 0, "only this tile index (X-minor over the slice's tile grid)")
	reserve.Flags().StringVar(&strategy, "strategy", "", "best-fit (default) or first-fit")
	reserve.Flags().BoolVar(&subHost, "allow-sub-host", false, "allow shapes below the host block on a single-host slice")

	var leaseID string
	var token int64
	renew := &cobra.Command{Use: "renew", Short: "Renew a lease", Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return send(c, "POST", base()+"/leases/"+url.PathEscape(leaseID)+"/renew", map[string]any{"token": token, "ttl": ttl})
		}}
	release := &cobra.Command{Use: "release", Short: "Release a lease (idempotent)", Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return send(c, "POST", base()+"/leases/"+url.PathEscape(leaseID)+"/release", map[string]any{"token": token})
		}}
	for _, sc := range []*cobra.Command{renew, release} {
		sc.Flags().StringVar(&leaseID, "lease", "", "lease ID")
		sc.Flags().Int64Var(&token, "token", 0, "the lease's fencing token")
	}
	renew.Flags().StringVar(&ttl, "ttl", "30s", "new TTL from now")

	list := &cobra.Command{Use: "list", Short: "List a pool's slices and leases", Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error { return send(c, "GET", base(), nil) }}
	pools := &cobra.Command{Use: "pools", Short: "List the pools", Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error { return send(c, "GET", "/admin/v1/tpu/pools", nil) }}
	inspect := &cobra.Command{Use: "inspect", Short: "Inspect a slice: per-chip owners, free blocks per shape", Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return send(c, "GET", base()+"/slices/"+url.PathEscape(sliceID), nil)
		}}
	inspect.Flags().StringVar(&sliceID, "slice", "", "slice ID")

	var host string
	var healthy bool
	health := &cobra.Command{Use: "health", Short: "Mark a host healthy or unhealthy", Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return send(c, "POST", base()+"/slices/"+url.PathEscape(sliceID)+"/health", map[string]any{"host": host, "healthy": healthy})
		}}
	health.Flags().StringVar(&sliceID, "slice", "", "slice ID")
	health.Flags().StringVar(&host, "host", "", "host name")
	health.Flags().BoolVar(&healthy, "healthy", true, "healthy (--healthy=false marks it unhealthy)")

	cmd.AddCommand(register, reserve, renew, release, list, pools, inspect, health)
	return cmd
}
