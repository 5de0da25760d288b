package gateway

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/kvstore/kvevents"
)

// newKVCmd returns `kvgate kv`, tools for engine KV-cache events.
func newKVCmd() *cobra.Command {
	kv := &cobra.Command{
		Use:   "kv",
		Short: "Inspect engine KV-cache events",
	}
	var indent bool
	decode := &cobra.Command{
		Use:   "decode",
		Short: "Decode one KV event batch payload (hex on stdin) and print it as JSON",
		Long: "Reads one raw msgpack payload (the third ZMQ frame vLLM/SGLang publish) as hex on stdin " +
			"(whitespace and a 0x prefix are ignored), decodes it in whatever layout it is, and prints the batch " +
			"as JSON: event types as on the wire, block hashes as decimal unsigned 64-bit numbers (byte-string " +
			"hashes reduced to their last 8 bytes, big-endian; the digests also as hex), token IDs, block size, " +
			"medium, LoRA name. Exits non-zero on input that does not decode.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return kvDecode(cmd.InOrStdin(), cmd.OutOrStdout(), indent)
		},
	}
	decode.Flags().BoolVar(&indent, "indent", false, "indent the JSON output")
	kv.AddCommand(decode, newKVTailCmd()) // tail: kvtail.go
	return kv
}

// kvDecode implements `kvgate kv decode`.
func kvDecode(in io.Reader, out io.Writer, indent bool) error {
	raw, err := io.ReadAll(io.LimitReader(in, 256<<20))
	if err != nil {
		return err
	}
	text := strings.Join(strings.Fields(string(raw)), "")
	text = strings.TrimPrefix(strings.TrimPrefix(text, "0x"), "0X")
	payload, err := hex.DecodeString(text)
	if err != nil {
		return fmt.Errorf("kv decode: input is not hex: %w", err)
	}
	b, err := kvevents.Decode(payload)
	if err != nil {
		return fmt.Errorf("kv decode: %w", err)
	}
	return writeJSONLine(out, b, indent)
}

// writeJSONLine writes v as one JSON line (indented over several lines when indent is set).
func writeJSONLine(out io.Writer, v any, indent bool) error {
	js, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if indent {
		_ = json.Indent(&buf, js, "", "  ")
	} else {
		buf.Write(js)
	}
	buf.WriteByte('\n')
	_, err = out.Write(buf.Bytes())
	return err
}
