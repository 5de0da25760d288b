package plugins

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kvgate/kvgate/kvstore/testenv"
)

// TestBuiltinReproducible rebuilds plugins/builtin/threetier exactly as `make policies` does and checks
// the bytes equal the embedded module, so the committed .wasm cannot drift from its source. A cold build
// takes about 4 s, a cached one 0.1 s.
func TestBuiltinReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Wasm module")
	}
	goBin := testenv.Command(t, "go")
	out := filepath.Join(t.TempDir(), "threetier.wasm")
	cmd := exec.Command(goBin, "build", "-trimpath", "-buildvcs=false", "-buildmode=c-shared", "-o", out, "./builtin/threetier")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, b)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, BuiltinWasm) {
		t.Fatalf("rebuilt module (%d bytes, %s) differs from the embedded one (%d bytes, %s): run `make policies` and commit",
			len(got), VersionOf(BuiltinName, got), len(BuiltinWasm), VersionOf(BuiltinName, BuiltinWasm))
	}
}

// TestDeclaredABIMinor: a module built with this SDK declares ABI v1.1 only when its policy honours
// rank_limit (sdk.RankLimited: the built-in), so a gateway from before v1.1, which refuses a newer minor,
// still loads every other policy built with it (an example policy here) in a rolling upgrade.
func TestDeclaredABIMinor(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Wasm module")
	}
	goBin := testenv.Command(t, "go")
	out := filepath.Join(t.TempDir(), "least-loaded.wasm")
	cmd := exec.Command(goBin, "build", "-trimpath", "-buildvcs=false", "-buildmode=c-shared", "-o", out, "../examples/policies/least-loaded")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, b)
	}
	example, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	h := newTestHost(t, Options{})
	for _, tc := range []struct {
		name  string
		wasm  []byte
		minor int32
	}{{"builtin-copy", BuiltinWasm, 1}, {"least-loaded", example, 0}} {
		_, rep, err := h.Load(tc.name, tc.wasm)
		if err != nil || !rep.OK() {
			t.Fatalf("%s: %v %v", tc.name, err, rep.Problems)
		}
		if rep.ABIMinor != tc.minor {
			t.Errorf("%s declares ABI v1.%d, want v1.%d", tc.name, rep.ABIMinor, tc.minor)
		}
	}
}
