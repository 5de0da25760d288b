//go:build chattemplate_wired

package model

import "github.com/kvgate/kvgate/gateway/chattemplate"

// loadTemplate loads the chat template of dir with gateway/chattemplate.
func loadTemplate(dir string) (Renderer, error) {
	t, err := chattemplate.Load(dir)
	if err != nil {
		return nil, err
	}
	return t, nil
}
