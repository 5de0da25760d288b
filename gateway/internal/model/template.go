package model

import (
	"errors"

	"github.com/kvgate/kvgate/gateway/internal/chattemplate"
)

// loadTemplate loads the chat template of dir with gateway/internal/chattemplate; a directory without one gives a
// nil Renderer (the model then serves completions only).
func loadTemplate(dir string) (Renderer, error) {
	t, err := chattemplate.Load(dir)
	if errors.Is(err, chattemplate.ErrNoTemplate) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return t, nil
}
