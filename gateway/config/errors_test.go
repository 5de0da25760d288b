package config

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigErrors runs every testdata/errors/*.yaml through Parse. Each file starts with comment lines
// "# want: TEXT", one per error the file must produce: the error message must contain every TEXT
// (Parse reports all errors at once; each names the key path, and the line when the YAML decoder knows
// it: "config: line N: key: message"). The rest of the file is the config. Add a case by adding a file.
func TestConfigErrors(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "errors", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no error cases: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var wants []string
			sc := bufio.NewScanner(strings.NewReader(string(raw)))
			for sc.Scan() {
				w, ok := strings.CutPrefix(sc.Text(), "# want: ")
				if !ok {
					break
				}
				wants = append(wants, w)
			}
			if len(wants) == 0 {
				t.Fatalf("%s has no \"# want: \" line", f)
			}
			_, err = Parse(raw)
			if err == nil {
				t.Fatalf("Parse accepted %s", f)
			}
			for _, w := range wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}
