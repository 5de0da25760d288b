package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/gateway/internal/model"
	"github.com/kvgate/kvgate/gateway/internal/openai"
	"github.com/kvgate/kvgate/gateway/internal/tokenizer"
)

// errReported is returned after the failure was already written to stdout as {"error": ...}; it makes the
// process exit non-zero.
var errReported = errors.New("tokenize: request failed (error written to stdout)")

// newTokenizeCmd is `kvgate tokenize`: token IDs exactly as the engine computes them, for checking by hand
// or over a whole corpus.
func newTokenizeCmd() *cobra.Command {
	var dir string
	var special, chat, jsonl bool
	cmd := &cobra.Command{
		Use:   "tokenize --model DIR [--special] [--chat] [--jsonl]",
		Short: "Print the token IDs of stdin (text, an OpenAI chat request, or JSON lines)",
		Long: `tokenize encodes stdin with the tokenizer (and chat template) of an HF model directory.

  default   stdin is text, taken byte for byte (a trailing newline counts); prints a JSON array of IDs.
            Without --special no special tokens are added (add_special_tokens=false); with it, as HF does
            with add_special_tokens=true (e.g. Llama's BOS).
  --chat    stdin is an OpenAI chat request (vLLM's add_generation_prompt and chat_template_kwargs
            understood); prints {"prompt": "...", "ids": [...]} (no special tokens added, as vLLM does). A
            request the template rejects prints {"error": "..."} and exits 1.
  --jsonl   one JSON object per line, {"text": ...} or a chat request; one result per line in input order:
            {"ids": [...]}, {"prompt": ..., "ids": [...]} or {"error": ...}. Exits 1 if any line failed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return errors.New("tokenize: --model DIR is required")
			}
			if chat && jsonl {
				return errors.New("tokenize: --chat and --jsonl are exclusive (--jsonl handles chat lines)")
			}
			r := &tokenizeRun{dir: dir, special: special, out: bufio.NewWriter(cmd.OutOrStdout())}
			defer r.out.Flush()
			switch {
			case jsonl:
				return r.jsonLines(cmd.InOrStdin())
			case chat:
				return r.chat(cmd.InOrStdin())
			}
			return r.text(cmd.InOrStdin())
		},
	}
	cmd.Flags().StringVar(&dir, "model", "", "HF model directory (tokenizer.json or tokenizer.json.gz, tokenizer_config.json)")
	cmd.Flags().BoolVar(&special, "special", false, "add special tokens to text (add_special_tokens=true)")
	cmd.Flags().BoolVar(&chat, "chat", false, "stdin is an OpenAI chat request")
	cmd.Flags().BoolVar(&jsonl, "jsonl", false, "stdin holds one JSON object per line")
	return cmd
}

type tokenizeRun struct {
	dir     string
	special bool
	out     *bufio.Writer

	model   *model.Model
	tok     *tokenizer.Tokenizer
	chatErr error // why chat requests cannot be served (model without usable chat template)
}

// loadTokenizer loads only the tokenizer (text mode needs no chat template).
func (r *tokenizeRun) loadTokenizer() error {
	if r.tok != nil {
		return nil
	}
	t, err := tokenizer.Load(r.dir)
	if err != nil {
		return err
	}
	r.tok = t
	return nil
}

// loadModel loads tokenizer and chat template; when only the template fails, text still works and chat
// requests report chatErr.
func (r *tokenizeRun) loadModel() error {
	m, err := model.Load(r.dir)
	if err == nil {
		r.model, r.tok = m, m.Tokenizer()
		return nil
	}
	if terr := r.loadTokenizer(); terr != nil {
		return terr
	}
	r.chatErr = err
	return nil
}

func (r *tokenizeRun) text(in io.Reader) error {
	b, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	if err := r.loadTokenizer(); err != nil {
		return err
	}
	r.out.Write(openai.AppendIDs(nil, r.tok.Encode(string(b), r.special)))
	r.out.WriteByte('\n')
	return nil
}

func (r *tokenizeRun) chat(in io.Reader) error {
	b, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	if err := r.loadModel(); err != nil {
		return err
	}
	line, ok := r.chatLine(b)
	r.out.Write(line)
	r.out.WriteByte('\n')
	if !ok {
		return errReported
	}
	return nil
}

func (r *tokenizeRun) jsonLines(in io.Reader) error {
	if err := r.loadModel(); err != nil {
		return err
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	failed := 0
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var probe struct {
			Text *string `json:"text"`
		}
		var out []byte
		ok := true
		if err := json.Unmarshal(line, &probe); err != nil {
			out, ok = errorLine(fmt.Errorf("invalid JSON: %w", err)), false
		} else if probe.Text != nil {
			out = append(openai.AppendIDs([]byte(`{"ids":`), r.tok.Encode(*probe.Text, r.special)), '}')
		} else {
			out, ok = r.chatLine(line)
		}
		if !ok {
			failed++
		}
		r.out.Write(out)
		r.out.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if failed > 0 {
		r.out.Flush()
		return fmt.Errorf("tokenize: %d line(s) failed", failed)
	}
	return nil
}

// chatLine renders and encodes one chat request: {"prompt","ids"} or {"error"} with ok false.
func (r *tokenizeRun) chatLine(body []byte) ([]byte, bool) {
	if r.model == nil {
		return errorLine(r.chatErr), false
	}
	prompt, ids, err := r.model.EncodeChat(body)
	if err != nil {
		return errorLine(err), false
	}
	out := []byte(`{"prompt":`)
	out = appendJSONString(out, prompt)
	out = append(out, `,"ids":`...)
	out = openai.AppendIDs(out, ids)
	return append(out, '}'), true
}

func errorLine(err error) []byte {
	return append(appendJSONString([]byte(`{"error":`), err.Error()), '}')
}

// appendJSONString appends s as a JSON string without HTML escaping (prompts are full of '<' and '>').
func appendJSONString(dst []byte, s string) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return append(dst, bytes.TrimRight(buf.Bytes(), "\n")...)
}
