//go:build !chattemplate_wired

package model

import "errors"

// errTemplatePending is returned while gateway/chattemplate has no Load yet (it is being written in
// parallel); template.go holds the real wiring.
var errTemplatePending = errors.New("gateway/chattemplate is not available in this build yet")

func loadTemplate(dir string) (Renderer, error) { return nil, errTemplatePending }
