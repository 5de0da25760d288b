// Command kvgate is the KV-cache-aware LLM gateway: `kvgate serve` runs it; the other sub-commands call its
// libraries or its admin API (tokenize, kv decode, policy). The commands are gateway.Main's; this file
// only carries the version and commit that `make build` sets at link time.
package main

import "github.com/kvgate/kvgate/gateway"

// Set at link time by `make build` (-ldflags "-X main.version=... -X main.commit=...").
var (
	version = ""
	commit  = ""
)

func main() { gateway.Main(version, commit) }
