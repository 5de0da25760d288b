package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/gateway/internal/admin"
	"github.com/kvgate/kvgate/gateway/internal/route"
	"github.com/kvgate/kvgate/sdk"
)

// adminClient calls a running gateway's admin API.
type adminClient struct {
	url      string
	token    string
	tokenEnv string
}

func (a *adminClient) flags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&a.url, "gateway", "http://localhost:8080", "gateway base URL")
	cmd.Flags().StringVar(&a.tokenEnv, "token-env", "KVGATE_ADMIN_TOKEN", "environment variable holding the admin token")
}

// do sends method path with body and writes the response body (indented JSON) to out; non-2xx statuses
// are errors.
func (a *adminClient) do(ctx context.Context, out io.Writer, method, path, ctype string, body []byte) error {
	b, status, err := a.call(ctx, method, path, ctype, body)
	if err != nil {
		return err
	}
	var pretty bytes.Buffer
	if json.Indent(&pretty, b, "", "  ") == nil {
		b = append(pretty.Bytes(), '\n')
	}
	out.Write(b)
	if status/100 != 2 {
		return fmt.Errorf("%s %s: %d %s", method, path, status, http.StatusText(status))
	}
	return nil
}

// call sends method path with body and returns the response body and status.
func (a *adminClient) call(ctx context.Context, method, path, ctype string, body []byte) ([]byte, int, error) {
	tok := os.Getenv(a.tokenEnv)
	if tok == "" {
		return nil, 0, fmt.Errorf("set %s to the gateway's admin token", a.tokenEnv)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(a.url, "/")+path, bytes.NewReader(body))
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, 0, err
	}
	return b, resp.StatusCode, nil
}

// uploadSummary renders an upload response for humans: the verdict and version, size, ABI and compile time,
// the validation samples, and either the activate command to run next or the problems.
func uploadSummary(w io.Writer, r admin.UploadResponse) {
	rep := r.Report
	verdict := "accepted"
	if !r.Accepted {
		verdict = "rejected"
	}
	abi := "unknown"
	if rep.ABIMinor >= 0 {
		abi = fmt.Sprintf("v%d.%d", sdk.ABIMajor, rep.ABIMinor)
	}
	short := route.ShortVersion(string(r.Version))
	fmt.Fprintf(w, "%s %s\n", verdict, short)
	fmt.Fprintf(w, "  %d bytes, ABI %s, compiled in %.3f s\n", rep.SizeBytes, abi, rep.CompileSeconds)
	bad, slowest := 0, 0.0
	for _, s := range rep.Samples {
		if s.Problem != "" {
			bad++
		}
		slowest = max(slowest, s.DurationSeconds)
	}
	if len(rep.Samples) == 0 {
		fmt.Fprintf(w, "  validation: stopped before the sample snapshots (see the problems)\n")
	} else {
		fmt.Fprintf(w, "  validation: %d of %d sample snapshots answered correctly (slowest %.6f s)\n",
			len(rep.Samples)-bad, len(rep.Samples), slowest)
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "  problem: %s\n", p)
	}
	if r.Accepted {
		fmt.Fprintf(w, "activate it with: kvgate policy activate MODEL %s\n", short)
	}
}

// policyAdminCmds returns `kvgate policy upload|activate|rollback|list|unload`, which call a gateway's admin
// API.
func policyAdminCmds() []*cobra.Command {
	var up, act, rb, ls, ul adminClient
	var fullJSON bool
	upload := &cobra.Command{
		Use:   "upload NAME FILE.wasm",
		Short: "Upload a policy module to a gateway (stored for every gateway on its store); prints a validation summary",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			wasm, err := os.ReadFile(args[1])
			if err != nil {
				return err
			}
			path := "/admin/v1/policies/" + args[0]
			if fullJSON {
				return up.do(cmd.Context(), cmd.OutOrStdout(), http.MethodPut, path, "application/wasm", wasm)
			}
			b, status, err := up.call(cmd.Context(), http.MethodPut, path, "application/wasm", wasm)
			if err != nil {
				return err
			}
			var r admin.UploadResponse
			if (status == http.StatusCreated || status == http.StatusUnprocessableEntity) && json.Unmarshal(b, &r) == nil {
				uploadSummary(cmd.OutOrStdout(), r)
				if !r.Accepted {
					return fmt.Errorf("%w: %s", errRejected, r.Version)
				}
				return nil
			}
			var e struct {
				Error struct {
					Message string `json:"message"`
				} `json:"error"`
			}
			if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
				return fmt.Errorf("upload: %d %s: %s", status, http.StatusText(status), e.Error.Message)
			}
			return fmt.Errorf("upload: %d %s: %s", status, http.StatusText(status), bytes.TrimSpace(b))
		},
	}
	upload.Flags().BoolVar(&fullJSON, "json", false, "print the gateway's full JSON response (validation report included)")
	up.flags(upload)
	var cfg string
	activate := &cobra.Command{
		Use:   "activate MODEL NAME@SHA256",
		Short: "Activate an uploaded policy version (a unique prefix of ≥ 8 hex digits will do) for a model",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !json.Valid([]byte(cfg)) {
				return fmt.Errorf("--config is not JSON: %s", cfg)
			}
			body, _ := json.Marshal(map[string]any{"model": args[0], "version": args[1], "config": json.RawMessage(cfg)})
			return act.do(cmd.Context(), cmd.OutOrStdout(), http.MethodPost, "/admin/v1/policies/activate", "application/json", body)
		},
	}
	activate.Flags().StringVar(&cfg, "config", "{}", "the policy's JSON config")
	act.flags(activate)
	rollback := &cobra.Command{
		Use:   "rollback MODEL",
		Short: "Make a model's previous policy activation active again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			body, _ := json.Marshal(map[string]string{"model": args[0]})
			return rb.do(cmd.Context(), cmd.OutOrStdout(), http.MethodPost, "/admin/v1/policies/rollback", "application/json", body)
		},
	}
	rb.flags(rollback)
	var listJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List a gateway's loaded policy versions, what it serves per model, and the fleet's view (each model's history and the gateways that disagree, with why)",
		Long: "Prints tables: what the gateway serves per model and the versions it has loaded, then per model the\n" +
			"fleet's activation stack (oldest first; the configured policy at the bottom, the active one on top),\n" +
			"every gateway with a live report and the version it serves, and the gateways that disagree with the\n" +
			"cause (a failed load, its attempts and the next one). --json prints the gateway's JSON instead.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if listJSON {
				return ls.do(cmd.Context(), cmd.OutOrStdout(), http.MethodGet, "/admin/v1/policies", "", nil)
			}
			b, status, err := ls.call(cmd.Context(), http.MethodGet, "/admin/v1/policies", "", nil)
			if err != nil {
				return err
			}
			var r admin.ListResponse
			if status != http.StatusOK || json.Unmarshal(b, &r) != nil {
				return fmt.Errorf("list: %d %s: %s", status, http.StatusText(status), bytes.TrimSpace(b))
			}
			policyListTable(cmd.OutOrStdout(), r)
			return nil
		},
	}
	list.Flags().BoolVar(&listJSON, "json", false, "print the gateway's JSON response (GET /admin/v1/policies)")
	ls.flags(list)
	unload := &cobra.Command{
		Use:   "unload NAME@SHA256",
		Short: "Unload a policy version from a gateway and remove it from the store (every gateway on the store drops it); refused while in use",
		Long: "Unload a policy version (a unique prefix of ≥ 8 hex digits will do): the gateway forgets it and removes\n" +
			"its stored module, so the other gateways on the same store unload it too. Refused (409 policy_in_use)\n" +
			"while it is active for a model, its previous activation (what rollback returns to), a model's configured\n" +
			"policy, named by an older gateway's active value, or the built-in default.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return ul.do(cmd.Context(), cmd.OutOrStdout(), http.MethodDelete, "/admin/v1/policies/"+url.PathEscape(args[0]), "", nil)
		},
	}
	ul.flags(unload)
	return []*cobra.Command{upload, activate, rollback, list, unload}
}
