package plugins

import _ "embed"

// BuiltinName is the policy name of the embedded default module.
const BuiltinName = "three-tier"

// BuiltinWasm is the embedded default policy: plugins/builtin/threetier built for wasip1 (see
// plugins/builtin/threetier/main.go for the exact command; a test checks a rebuild gives these bytes).
//
//go:embed builtin/threetier.wasm
var BuiltinWasm []byte
