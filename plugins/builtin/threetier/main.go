// Command threetier is the built-in default routing policy as a Wasm module: the three-tier algorithm of
// package plugins/internal/threetier registered with the SDK. Build (as `make policies` does):
//
//	GOOS=wasip1 GOARCH=wasm go build -trimpath -buildvcs=false -buildmode=c-shared -o plugins/builtin/threetier.wasm ./plugins/builtin/threetier
//
// The result is committed and embedded in the host (plugins/embed.go); TestBuiltinReproducible checks that
// a rebuild gives the same bytes.
package main

import (
	"github.com/kvgate/kvgate/plugins/internal/threetier"
	"github.com/kvgate/kvgate/sdk"
)

func init() { sdk.Register(&threetier.Policy{}) }

func main() {}
