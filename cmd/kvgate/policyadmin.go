package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
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

// do sends method path with body and writes the response body to out; non-2xx statuses are errors.
func (a *adminClient) do(ctx context.Context, out io.Writer, method, path, ctype string, body []byte) error {
	tok := os.Getenv(a.tokenEnv)
	if tok == "" {
		return fmt.Errorf("set %s to the gateway's admin token", a.tokenEnv)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(a.url, "/")+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var pretty bytes.Buffer
	if json.Indent(&pretty, b, "", "  ") == nil {
		b = append(pretty.Bytes(), '\n')
	}
	out.Write(b)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	return nil
}

// policyAdminCmds returns `kvgate policy upload|activate|rollback|list`, which call a gateway's admin API.
func policyAdminCmds() []*cobra.Command {
	var up, act, rb, ls adminClient
	upload := &cobra.Command{
		Use:   "upload NAME FILE.wasm",
		Short: "Upload a policy module to a gateway (stored for every gateway on its store); prints the validation report",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			wasm, err := os.ReadFile(args[1])
			if err != nil {
				return err
			}
			return up.do(cmd.Context(), cmd.OutOrStdout(), http.MethodPut, "/admin/v1/policies/"+args[0], "application/wasm", wasm)
		},
	}
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
	list := &cobra.Command{
		Use:   "list",
		Short: "List a gateway's loaded policy versions and each model's active one",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return ls.do(cmd.Context(), cmd.OutOrStdout(), http.MethodGet, "/admin/v1/policies", "", nil)
		},
	}
	ls.flags(list)
	return []*cobra.Command{upload, activate, rollback, list}
}
