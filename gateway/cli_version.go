package gateway

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// The build's version and commit, given to Main by cmd/kvgate (set there at link time by `make build`:
// -ldflags "-X main.version=... -X main.commit=..."); when empty, the build information the Go toolchain
// embedded is used (module version, vcs.revision).
var (
	buildVersion = ""
	buildCommit  = ""
)

// setBuild records Main's version and commit for versionText.
func setBuild(v, c string) { buildVersion, buildCommit = v, c }

// versionText is what `kvgate --version` prints: the module version ("(devel)" for a build from a
// checkout without -ldflags), the commit ("unknown" when neither -ldflags nor the toolchain's VCS stamp
// gave one; "(modified)" when the stamp says the tree had changes) and the Go version and platform.
func versionText() string {
	v, c, modified := buildVersion, buildCommit, false
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
				modified = s.Value == "true" && buildCommit == ""
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
