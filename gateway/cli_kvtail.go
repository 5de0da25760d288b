package gateway

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/kvstore/kvevents"
)

// newKVTailCmd returns `kvgate kv tail --events tcp://HOST:PORT`.
func newKVTailCmd() *cobra.Command {
	var addr, topic string
	var count int
	var indent bool
	cmd := &cobra.Command{
		Use:   "tail --events tcp://HOST:PORT",
		Short: "Subscribe to an engine's KV-event publisher and print each batch as JSON",
		Long: "Connects a ZMQ SUB socket to an engine's KV-event publisher (vLLM's --kv-events-config endpoint, " +
			"e.g. tcp://127.0.0.1:5557) and prints every message as one JSON line: {\"topic\", \"seq\", \"batch\"}, " +
			"where batch is exactly what `kvgate kv decode` prints for that payload (the same decoder); a payload " +
			"that does not decode prints {\"topic\", \"seq\", \"error\", \"payload_hex\"} instead, so it can be " +
			"fed to `kv decode` or filed with a bug. Runs until Ctrl-C, or until --count messages were printed. " +
			"A subscriber only gets messages published after it connected (ZMQ PUB/SUB).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			err := kvTail(ctx, addr, topic, count, indent, cmd.OutOrStdout())
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		},
	}
	cmd.Flags().StringVar(&addr, "events", "", "the publisher's address, tcp://HOST:PORT (required)")
	cmd.Flags().StringVar(&topic, "topic", "", "topic prefix to subscribe to (default: every topic)")
	cmd.Flags().IntVar(&count, "count", 0, "exit after printing this many messages (0: run until interrupted)")
	cmd.Flags().BoolVar(&indent, "indent", false, "indent the JSON output")
	cmd.MarkFlagRequired("events")
	return cmd
}

// tailLine is one line `kv tail` prints. Seq is the message's 8-byte big-endian sequence number (-1 when
// the message had no such frame).
type tailLine struct {
	Topic      string               `json:"topic"`
	Seq        int64                `json:"seq"`
	Batch      *kvevents.EventBatch `json:"batch,omitempty"`
	Error      string               `json:"error,omitempty"`
	PayloadHex string               `json:"payload_hex,omitempty"`
}

// kvTail subscribes to addr and prints each message until ctx ends or count messages were printed. A
// message is [topic, seq, payload] as vLLM and SGLang publish it; [seq, payload] and [payload] are read too.
func kvTail(ctx context.Context, addr, topic string, count int, indent bool, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := zmq4.NewSub(ctx, zmq4.WithDialerRetry(250*time.Millisecond))
	defer sub.Close()
	if err := sub.Dial(addr); err != nil {
		return fmt.Errorf("kv tail: connect %s: %w", addr, err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, topic); err != nil {
		return fmt.Errorf("kv tail: subscribe: %w", err)
	}
	for n := 0; count <= 0 || n < count; n++ {
		msg, err := sub.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("kv tail: receive: %w", err)
		}
		line := tailLine{Seq: -1}
		frames := msg.Frames
		if len(frames) == 0 {
			continue
		}
		payload := frames[len(frames)-1]
		if len(frames) >= 2 && len(frames[len(frames)-2]) == 8 {
			line.Seq = int64(binary.BigEndian.Uint64(frames[len(frames)-2]))
		}
		if len(frames) >= 3 {
			line.Topic = string(frames[0])
		}
		if b, err := kvevents.Decode(payload); err != nil {
			line.Error = err.Error()
			line.PayloadHex = fmt.Sprintf("%x", payload)
		} else {
			line.Batch = &b
		}
		if err := writeJSONLine(out, line, indent); err != nil {
			return err
		}
	}
	return nil
}
