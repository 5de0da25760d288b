package hygiene

import (
	"go/parser"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/kvstore/testenv"
)

// public lists the packages other modules may import: the API of issue 19, item 1 (docs/CONTRACTS.md says
// what each promises). Everything else lives under an internal/ directory of its top-level folder.
var public = []string{
	"cmd/enginesim/sim",               // the simulator's Start
	"cmd/enginesim/vllmhash",          // engines' block hashes (kvstore/kvevents' tests use them)
	"cmd/kvgate-bench/harness",        // process harness of the benchmark and tests/e2e
	"examples/policies/three-tier-as", // test-only package of the AssemblyScript example
	"gateway",                         // Start; Main (the kvgate command line); the admin API's bodies
	"gateway/config",                  // the configuration
	"gateway/textmodel",               // the text pipeline for the simulator and the benchmark
	"kvstore",                         // the contracts and the memory and Redis backends
	"kvstore/conformance",             // the suite every backend passes
	"kvstore/kvevents",                // the KV-event codec and ingester
	"kvstore/redistest",               // redis-server for tests (other folders' tests use it)
	"kvstore/testenv",                 // machine dependencies of tests (sdk/sdktest uses it)
	"plugins",                         // the policy Host
	"sdk",                             // the policy SDK
	"sdk/rank",                        // the ranking helper the example policies share
	"sdk/sdktest",                     // policy authors' test helpers
	"tpu",                             // the TPU slice allocator
}

// toMove lists packages still to move under internal/ (the lead's move script moves them and empties
// this list). Nothing outside their top-level folder may import them (TestToMoveImports), so that the
// move only rewrites paths.
var toMove = []string{
	// BEGIN toMove
	// END toMove
}

// TestPublicSurface: every importable package (not a command, not under internal/, not tests/) is listed
// in public (or still in toMove), and every listed package exists: a new package is internal unless it is
// added to public on purpose.
func TestPublicSurface(t *testing.T) {
	root := testenv.RepoRoot(t)
	found := map[string]bool{}
	for _, f := range parseGoFiles(t, root, parser.PackageClauseOnly) {
		dir := path.Dir(f.path)
		if f.test || f.ast.Name.Name == "main" || strings.HasPrefix(dir, "tests/") || dir == "." ||
			slices.Contains(strings.Split(dir, "/"), "internal") {
			continue
		}
		found[dir] = true
	}
	for _, f := range parseGoFiles(t, root, parser.PackageClauseOnly) { // test-only packages
		dir := path.Dir(f.path)
		if f.test && !strings.HasPrefix(dir, "tests/") && !found[dir] && slices.Contains(public, dir) {
			found[dir] = true
		}
	}
	for dir := range found {
		if !slices.Contains(public, dir) && !slices.Contains(toMove, dir) {
			t.Errorf("package %s is importable but not in the public list: move it under %s/internal/ or add it to public",
				dir, strings.Split(dir, "/")[0])
		}
	}
	for _, p := range append(slices.Clone(public), toMove...) {
		if !found[p] {
			t.Errorf("listed package %s does not exist (outside internal/)", p)
		}
	}
}

// TestToMoveImports: no file outside a toMove package's top-level folder imports it (after the move it
// could not: Go's internal/ rule), so the move script has nothing to rewrite but paths.
func TestToMoveImports(t *testing.T) {
	root := testenv.RepoRoot(t)
	for _, f := range parseGoFiles(t, root, parser.ImportsOnly) {
		for _, imp := range imports(f) {
			for _, p := range toMove {
				top, _, _ := strings.Cut(p, "/")
				if (imp == module+"/"+p || strings.HasPrefix(imp, module+"/"+p+"/")) && !strings.HasPrefix(f.path, top+"/") {
					t.Errorf("%s imports %s, which moves under %s/internal/: use a public API instead", f.path, imp, top)
				}
			}
		}
	}
}
