package route

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The router knows no store and speaks no HTTP: none of its files imports go-redis (store failure is
// kvstore.Guarded's) or gateway/internal/openai (errors are mapped to HTTP in gateway/internal/server). Test files may.
func TestRouteImportsNoRedisNoOpenAI(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, im := range f.Imports {
			path, _ := strconv.Unquote(im.Path.Value)
			if strings.HasPrefix(path, "github.com/redis/go-redis") || path == "github.com/kvgate/kvgate/gateway/internal/openai" {
				t.Errorf("%s imports %s", name, path)
			}
		}
	}
	if checked < 3 {
		t.Fatalf("checked %d files: not the package directory?", checked)
	}
}
