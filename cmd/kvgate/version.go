package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set at link time by `make build` (-ldflags "-X main.version=... -X main.commit=..."); when empty, the
// build information the Go toolchain embedded is used (module version, vcs.revision).
var (
	version = ""
	commit  = ""
)

// versionText is what `kvgate --version` prints: the module version ("(devel)" for a build from a
// checkout without -ldflags), the commit ("unknown" when neither -ldflags nor the toolchain's VCS stamp
// gave one; "(modified)" when the stamp says the tree had changes) and the Go version and platform.
func versionText() string {
	v, c, modified := version, commit, false
	goVersion := runtime.Version()
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if c == "" {
					c = s.Value
				}
			case "vcs.modified":
				modified = s.Value == "true" && commit == ""
			}
		}
		if bi.GoVersion != "" {
			goVersion = bi.GoVersion
		}
	}
	if v == "" {
		v = "(devel)"
	}
	if c == "" {
		c = "unknown"
	}
	if modified {
		c += " (modified)"
	}
	return fmt.Sprintf("kvgate %s\ncommit: %s\ngo: %s %s/%s\n", v, c, goVersion, runtime.GOOS, runtime.GOARCH)
}
