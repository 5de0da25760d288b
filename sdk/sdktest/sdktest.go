// Package sdktest runs a policy's test cases twice: natively (through the same ABI encode → decode →
// Choose → check path the Wasm exports use, see sdk.ChooseABI) and compiled to Wasm with
// GOOS=wasip1 GOARCH=wasm -buildmode=c-shared, loaded through the real host (package plugins, wazero).
// Unlike package sdk it imports the host, so policy modules must only import it from _test.go files.
package sdktest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore/testenv"
	"github.com/kvgate/kvgate/plugins"
	"github.com/kvgate/kvgate/sdk"
)

// Case is one snapshot and the ranking the policy must give for it.
type Case struct {
	Name     string       // subtest name
	Config   string       // the policy's JSON config; "" means its defaults
	Snapshot sdk.Snapshot // Endpoint.Index is set to the position by Run
	Want     []uint32     // expected ranking, best first; nil accepts any valid ranking
}

// Run checks every case natively and as Wasm built from pkg (a directory or package path, "." for the
// test's own package). newPolicy must return a fresh, un-initialised policy. The Wasm half is skipped
// with -short.
func Run(t *testing.T, newPolicy func() sdk.Policy, pkg string, cases []Case) {
	t.Helper()
	for _, c := range cases {
		t.Run("native/"+c.Name, func(t *testing.T) {
			p := newPolicy()
			if err := p.Init([]byte(c.Config)); err != nil {
				t.Fatalf("Init(%q): %v", c.Config, err)
			}
			s := prepare(c.Snapshot)
			buf := make([]byte, max(sdk.EncodedSize(len(s.Endpoints)), 4*len(s.Endpoints)))
			n, err := sdk.EncodeSnapshot(buf, &s)
			if err != nil {
				t.Fatal(err)
			}
			code, got := sdk.ChooseABI(p, buf, n)
			if code < 0 {
				t.Fatalf("choose returned error code %d", code)
			}
			check(t, c, got)
		})
	}
	if testing.Short() {
		return
	}
	wasm := Build(t, pkg)
	h, err := plugins.New(context.Background(), plugins.Options{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		// Correctness, not speed: a loaded CI box must not turn a slow call into a fallback.
		CallTimeout: time.Second, ValidationTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Close(context.Background()) }()
	v, rep, err := h.Load("policy-under-test", wasm)
	if err != nil {
		t.Fatalf("load: %v\n%s", err, rep.String())
	}
	for _, c := range cases {
		t.Run("wasm/"+c.Name, func(t *testing.T) {
			sum := sha256.Sum256([]byte(c.Config))
			model := "m-" + hex.EncodeToString(sum[:8])
			if cur, cfg := h.Active(model); cur != v || string(cfg) != c.Config {
				if err := h.Activate(model, v, []byte(c.Config)); err != nil {
					t.Fatal(err)
				}
			}
			s := prepare(c.Snapshot)
			got, info := h.Rank(context.Background(), model, &s)
			if info.Fallback {
				t.Fatalf("host fell back: %+v", info)
			}
			out := make([]uint32, len(got))
			for i, g := range got {
				out[i] = uint32(g)
			}
			check(t, c, out)
		})
	}
}

func prepare(s sdk.Snapshot) sdk.Snapshot {
	s.Endpoints = slices.Clone(s.Endpoints)
	for i := range s.Endpoints {
		s.Endpoints[i].Index = uint32(i)
	}
	return s
}

func check(t *testing.T, c Case, got []uint32) {
	t.Helper()
	r := sdk.Ranking{}
	for _, g := range got {
		r.Add(g)
	}
	if err := r.Check(len(c.Snapshot.Endpoints), nil); err != nil {
		t.Fatalf("ranking %v: %v", got, err)
	}
	if c.Want != nil && !slices.Equal(got, c.Want) {
		t.Fatalf("ranking %v, want %v", got, c.Want)
	}
}

var (
	buildMu    sync.Mutex
	buildCache = map[string][]byte{}
)

// Build compiles pkg for wasip1 (-trimpath -buildmode=c-shared, as `make policies` does) and returns the
// module; builds are cached per process and by the go build cache.
func Build(t testing.TB, pkg string) []byte {
	t.Helper()
	abs, err := filepath.Abs(pkg)
	if err != nil {
		t.Fatal(err)
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if b, ok := buildCache[abs]; ok {
		return b
	}
	goBin := testenv.Command(t, "go") // skips without go on PATH; fails when CI=true
	out := filepath.Join(t.TempDir(), "policy.wasm")
	cmd := exec.Command(goBin, "build", "-trimpath", "-buildvcs=false", "-buildmode=c-shared", "-o", out, ".")
	cmd.Dir = abs
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	buildCache[abs] = b
	return b
}
