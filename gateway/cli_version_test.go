package gateway

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// `kvgate --version` of a binary built as `make build` builds it prints the version and commit given at
// link time and the Go version of the toolchain that built it (as `go env GOVERSION` says).
func TestVersionFlag(t *testing.T) {
	t.Parallel() // waits on its own go build and binary only; asserts no latency bound
	if testing.Short() {
		t.Skip("builds the kvgate binary")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	bin := filepath.Join(t.TempDir(), "kvgate")
	build := exec.Command(goBin, "build", "-ldflags", "-X main.version=v9.8.7-test -X main.commit=0123456789abcdef", "-o", bin, "../cmd/kvgate")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	gv, err := exec.Command(goBin, "env", "GOVERSION").Output()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	want := "kvgate v9.8.7-test\ncommit: 0123456789abcdef\ngo: " + strings.TrimSpace(string(gv)) + " "
	if !strings.HasPrefix(string(out), want) || strings.Count(string(out), "\n") != 3 {
		t.Fatalf("--version printed\n%s\nwant a prefix\n%s", out, want)
	}
	// Without -ldflags (and with -buildvcs=false, as the Makefile sets, so no VCS stamp either): "(devel)"
	// and no commit. This test binary is such a build.
	if got := versionText(); !strings.HasPrefix(got, "kvgate (devel)\ncommit: unknown\ngo: "+strings.TrimSpace(string(gv))) {
		t.Fatalf("unstamped build --version:\n%s", got)
	}
}
