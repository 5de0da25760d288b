// Package testenv is the one place tests decide what to do when something they need from the machine is
// missing: a program on PATH (redis-server), Debian's /usr/bin/python3 with its modules (zmq, msgpack,
// cbor2, jinja2), or the reference tokenizer files that `make models` puts in .cache/models.
//
// Outside CI a missing dependency skips the test with the reason and the command that installs it. When the
// environment variable CI is "true" (.ci/run installs everything these tests need) the same test fails
// instead, so a broken CI image cannot turn into a green run of skipped tests.
//
// It also holds the small file readers several packages' tests had copied (ReadJSONL, ReadGzip). Every
// helper takes a testing.TB, so tests, benchmarks and fuzz targets can use it; it imports only the standard
// library.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Python is the interpreter whose modules tests use: Debian's python3-zmq, python3-msgpack,
// python3-cbor2 and python3-jinja2 load only under /usr/bin/python3.
const Python = "/usr/bin/python3"

// InCI reports whether the environment variable CI is "true", as .ci/run and most CI services set it.
func InCI() bool { return os.Getenv("CI") == "true" }

// Missing ends t because something it needs is not installed: t.Fatalf under CI (see InCI), t.Skipf
// otherwise. The message is formatted with fmt.Sprintf(format, args...).
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("testenv: %s (required when CI=true)", msg)
	}
	t.Skipf("testenv: %s", msg)
}

// Command returns the absolute path of the program name found on PATH; when it is missing, Missing ends t.
func Command(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, "%s not found on PATH: %v", name, err)
	}
	return p
}

// PythonWith returns Python after checking that it imports every module in modules (for example "zmq",
// "msgpack"); when it cannot, Missing ends t with Python's own error output.
func PythonWith(t testing.TB, modules ...string) string {
	t.Helper()
	if _, err := os.Stat(Python); err != nil {
		Missing(t, "%s: %v", Python, err)
	}
	if len(modules) > 0 {
		out, err := exec.Command(Python, "-c", "import "+strings.Join(modules, ", ")).CombinedOutput()
		if err != nil {
			Missing(t, "%s cannot import %s (apt-get install python3-<module>): %v: %s", Python,
				strings.Join(modules, ", "), err, strings.TrimSpace(string(out)))
		}
	}
	return Python
}

// RepoRoot returns the nearest directory at or above the working directory (a test's package directory)
// that holds go.mod. It fails t when there is none.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("testenv: no go.mod above %s", dir)
		}
		dir = parent
	}
}

// ModelsDir is the directory holding the reference models: $KVGATE_MODELS_DIR when set, else
// <repo>/.cache/models (where `make models`, that is .ci/fetch_models.sh, puts them).
func ModelsDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("KVGATE_MODELS_DIR"); d != "" {
		return d
	}
	return filepath.Join(RepoRoot(t), ".cache", "models")
}

// CommittedModels are the reference models whose tokenizer files are committed in the repository
// (examples/models/<name>, tokenizer.json.gz): ModelDir returns that directory for them, so their exactness
// tests never skip.
var CommittedModels = []string{"qwen3"}

// ModelDir returns the directory of a reference model: examples/models/<model> for CommittedModels, else
// ModelsDir/model after checking that it holds tokenizer.json; when it does not, Missing ends t. The
// reference models are qwen3, llama3_1, deepseek_v3, gemma3 and llama2.
func ModelDir(t testing.TB, model string) string {
	t.Helper()
	if slices.Contains(CommittedModels, model) {
		dir := filepath.Join(RepoRoot(t), "examples", "models", model)
		if _, err := os.Stat(filepath.Join(dir, "tokenizer.json.gz")); err != nil {
			t.Fatalf("testenv: committed model %s: %v", model, err)
		}
		return dir
	}
	dir := filepath.Join(ModelsDir(t), model)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		Missing(t, "model %s missing at %s: run `make models`", model, dir)
	}
	return dir
}

// WaitFor polls cond every 10 ms until it holds or d has passed, and reports whether it held. Use it for
// the event a test names (a counter reaching a value, a state flipping), never as a sleep.
func WaitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Eventually is WaitFor that ends t with "timed out after d waiting for what" when cond never holds.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !WaitFor(d, cond) {
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
}
