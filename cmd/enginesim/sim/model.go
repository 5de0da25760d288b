package sim

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/kvgate/kvgate/gateway/textmodel"
)

// hasTokenizerFiles reports whether dir holds a tokenizer.json or tokenizer.json.gz.
func hasTokenizerFiles(dir string) bool {
	for _, f := range []string{"tokenizer.json", "tokenizer.json.gz"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err == nil && !st.IsDir() {
			return true
		}
	}
	return false
}

// loadTextModel returns the model's text pipeline: gateway/textmodel (its own tokenizer and chat
// template, the same code the gateway tokenizes with) when dir holds tokenizer files, else the byte-level
// fallback. A directory whose chat template cannot be loaded still serves completions and pre-tokenized
// chat; text chat requests then get a 400.
func loadTextModel(dir string, log *slog.Logger) (textModel, error) {
	if !hasTokenizerFiles(dir) {
		return byteModel{}, nil
	}
	m, err := textmodel.Load(dir)
	if err != nil {
		var terr error
		if m, terr = textmodel.LoadTokenizer(dir); terr != nil {
			return nil, fmt.Errorf("sim: load tokenizer from %s: %w", dir, terr)
		}
		log.Warn("chat template unavailable: text chat requests will be rejected", slog.String("model", dir),
			slog.String("error", err.Error()))
	}
	return &hfModel{m: m}, nil
}

// hfModel is the pipeline of a model directory (gateway/textmodel).
type hfModel struct {
	m *textmodel.Model
}

func (h *hfModel) Kind() string { return "tokenizer" }

func (h *hfModel) EncodeChat(body []byte) (string, []uint32, error) { return h.m.EncodeChat(body) }

func (h *hfModel) EncodeCompletion(prompt string) []uint32 { return h.m.EncodeCompletion(prompt) }

func (h *hfModel) EncodeText(text string) []uint32 { return h.m.EncodeText(text) }

func (h *hfModel) Decode(ids []uint32) string { return h.m.Decode(ids) }
