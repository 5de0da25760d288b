package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// helperEnv marks the child process that TestMissingFailsUnderCI runs.
const helperEnv = "KVGATE_TESTENV_HELPER"

// TestHelperMissing is the child: it asks for a model that cannot exist.
func TestHelperMissing(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		return // only meaningful in the child process
	}
	t.Setenv("KVGATE_MODELS_DIR", t.TempDir())
	ModelDir(t, "no-such-model")
	t.Log("reached after ModelDir")
}

// TestMissingFailsUnderCI runs TestHelperMissing in a child process: with CI unset it must report SKIP
// and exit 0; with CI=true it must report FAIL and exit non-zero; neither may run past ModelDir.
func TestMissingFailsUnderCI(t *testing.T) {
	for _, tc := range []struct {
		ci       string
		wantFail bool
		wantWord string
	}{
		{ci: "", wantFail: false, wantWord: "--- SKIP: TestHelperMissing"},
		{ci: "true", wantFail: true, wantWord: "--- FAIL: TestHelperMissing"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperMissing$", "-test.v")
		cmd.Env = append(os.Environ(), helperEnv+"=1", "CI="+tc.ci)
		out, err := cmd.CombinedOutput()
		if failed := err != nil; failed != tc.wantFail {
			t.Errorf("CI=%q: exit error %v, want failure %v\n%s", tc.ci, err, tc.wantFail, out)
		}
		if !strings.Contains(string(out), tc.wantWord) || strings.Contains(string(out), "reached after ModelDir") {
			t.Errorf("CI=%q: output lacks %q or ran past ModelDir:\n%s", tc.ci, tc.wantWord, out)
		}
		if !strings.Contains(string(out), "no-such-model") {
			t.Errorf("CI=%q: message does not name the model:\n%s", tc.ci, out)
		}
	}
}

func TestRepoRootHoldsGoMod(t *testing.T) {
	root := RepoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "module github.com/kvgate/kvgate") {
		t.Fatalf("%s/go.mod is not kvgate's", root)
	}
	if !strings.HasPrefix(mustGetwd(t), root) {
		t.Fatalf("root %s is not above %s", root, mustGetwd(t))
	}
}

func TestModelsDirFollowsEnv(t *testing.T) {
	d := t.TempDir()
	t.Setenv("KVGATE_MODELS_DIR", d)
	if got := ModelsDir(t); got != d {
		t.Fatalf("ModelsDir = %s, want %s", got, d)
	}
	if err := os.MkdirAll(filepath.Join(d, "m"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "m", "tokenizer.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := ModelDir(t, "m"); got != filepath.Join(d, "m") {
		t.Fatalf("ModelDir = %s", got)
	}
}

func TestCommandFindsSh(t *testing.T) {
	p := Command(t, "sh")
	if !filepath.IsAbs(p) {
		t.Fatalf("Command(sh) = %q, want an absolute path", p)
	}
}

func mustGetwd(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}

func TestReadJSONLAndGzip(t *testing.T) {
	d := t.TempDir()
	p := filepath.Join(d, "x.jsonl")
	if err := os.WriteFile(p, []byte("{\"a\":1}\n{\"a\":22}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	type row struct{ A int }
	got := ReadJSONL[row](t, p)
	if len(got) != 2 || got[0].A != 1 || got[1].A != 22 {
		t.Fatalf("ReadJSONL = %+v", got)
	}
	// The committed Qwen3 tokenizer is gzip-compressed JSON whose model type is BPE.
	b := ReadGzip(t, filepath.Join(RepoRoot(t), "examples", "models", "qwen3", "tokenizer.json.gz"))
	if len(b) < 1<<20 || !strings.Contains(string(b), `"BPE"`) {
		t.Fatalf("ReadGzip gave %d bytes without a BPE model", len(b))
	}
}

// The committed Qwen3 files are used whatever the models directory holds: its tests never skip.
func TestModelDirCommittedQwen3(t *testing.T) {
	t.Setenv("KVGATE_MODELS_DIR", t.TempDir())
	dir := ModelDir(t, "qwen3")
	if want := filepath.Join(RepoRoot(t), "examples", "models", "qwen3"); dir != want {
		t.Fatalf("ModelDir(qwen3) = %s, want %s", dir, want)
	}
}
