// Command kvgate is the KV-cache-aware LLM gateway: `kvgate serve` runs it; the other sub-commands call its
// libraries or its admin API (tokenize, kv decode, policy).
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	root := &cobra.Command{
		Use:           "kvgate",
		Short:         "KV-cache-aware, OpenAI-compatible LLM serving gateway",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       versionText(),
	}
	root.SetVersionTemplate("{{.Version}}")
	// Each sub-command lives in its own file of this package.
	root.AddCommand(subcommands()...)
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kvgate:", err)
		os.Exit(1)
	}
}

// subcommands lists every sub-command; add yours here.
func subcommands() []*cobra.Command {
	return []*cobra.Command{
		newKVCmd(),
		newPolicyCmd(policyAdminCmds()...),
		newServeCmd(),
		newTokenizeCmd(),
		newTPUCmd(),
	}
}
