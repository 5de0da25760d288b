package gateway

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

var policyCacheDir string

func runPolicy(t *testing.T, args ...string) (string, error) {
	t.Helper()
	if policyCacheDir == "" {
		policyCacheDir = t.TempDir() // shared by the calls of one test: the built-in compiles once
	}
	args = append([]string{"--cache-dir", policyCacheDir}, args...)
	cmd := newPolicyCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestPolicyValidate(t *testing.T) {
	policyCacheDir = ""
	out, err := runPolicy(t, "validate", "../plugins/testdata/good.wasm")
	if err != nil || !strings.HasPrefix(out, "ACCEPTED good@") || !strings.Contains(out, "sample hot-endpoint-idle-owner") {
		t.Fatalf("good: %v\n%s", err, out)
	}
	out, err = runPolicy(t, "validate", "../plugins/testdata/badimport.wasm")
	if !errors.Is(err, errRejected) || !strings.HasPrefix(out, "REJECTED badimport@") ||
		!strings.Contains(out, "problem: import env.http_get is not allowed") {
		t.Fatalf("badimport: %v\n%s", err, out)
	}
	if _, err := runPolicy(t, "validate", "does-not-exist.wasm"); err == nil {
		t.Fatal("missing file accepted")
	}
}

func TestPolicyBench(t *testing.T) {
	policyCacheDir = ""
	out, err := runPolicy(t, "bench", "--endpoints", "8", "--calls", "200", "../plugins/testdata/good.wasm")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "policy good@") || !strings.HasPrefix(strings.TrimSpace(lines[2]), "8 ") ||
		!strings.HasSuffix(lines[2], " 0") {
		t.Fatalf("output:\n%s", out)
	}
	if _, err := runPolicy(t, "bench", "--endpoints", "x", "builtin"); err == nil {
		t.Fatal("bad --endpoints accepted")
	}
}
