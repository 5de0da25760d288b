package gateway

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// Main runs the kvgate command line on os.Args and exits the process: status 1, after printing
// "kvgate: " and the error to stderr, when the sub-command fails; it returns only after success. version
// and commit are what `kvgate --version` prints ("" for the toolchain's build stamp). cmd/kvgate is this
// call; the sub-commands (serve, tokenize, kv, policy, tpu) live in this package's cli_*.go files.
func Main(version, commit string) {
	setBuild(version, commit)
	root := &cobra.Command{
		Use:           "kvgate",
		Short:         "KV-cache-aware, OpenAI-compatible LLM serving gateway",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       versionText(),
	}
	root.SetVersionTemplate("{{.Version}}")
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
