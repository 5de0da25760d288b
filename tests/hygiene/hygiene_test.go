// Package hygiene checks the repository's layout and docs with plain `go test`: which packages import
// which, that every path a document or doc comment names exists, one log key for errors, and one copy of
// each golden file. Each rule is one test; a failure names the file and line to fix.
package hygiene

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/kvstore/testenv"
)

const module = "github.com/kvgate/kvgate"

// buildOutput reports the gitignored directories that `make run`, `make policies` and the benches write
// at the root (bin/, bench-out/): on disk after a build, never part of the repository.
func buildOutput(name string) bool { return name == "bin" || name == "bench-out" }

// skipDir reports directories that hold no source of this module: hidden ones (.git, .cache), installed
// packages, build output, and deploy/ (its own module).
func skipDir(name string) bool {
	return strings.HasPrefix(name, ".") || name == "node_modules" || buildOutput(name) || name == "deploy"
}

// repoFiles returns the repository's files (slash-separated, relative to the root) whose names end in ext,
// outside skipDir directories. testdata directories are included only when withTestdata is set.
func repoFiles(t *testing.T, root, ext string, withTestdata bool) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && (skipDir(d.Name()) || (!withTestdata && d.Name() == "testdata")) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ext) {
			rel, _ := filepath.Rel(root, p)
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// goFile is one parsed Go file of the module.
type goFile struct {
	path string // relative to the root, slash-separated
	test bool   // a _test.go file
	ast  *ast.File
	fset *token.FileSet
}

func parseGoFiles(t *testing.T, root string, mode parser.Mode) []goFile {
	t.Helper()
	var out []goFile
	for _, rel := range repoFiles(t, root, ".go", false) {
		fset := token.NewFileSet()
		src, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, rel, src, mode)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, goFile{path: rel, test: strings.HasSuffix(rel, "_test.go"), ast: f, fset: fset})
	}
	return out
}

func imports(f goFile) []string {
	var out []string
	for _, is := range f.ast.Imports {
		p, _ := strconv.Unquote(is.Path.Value)
		out = append(out, p)
	}
	return out
}

// TestImportRules: no package shipped in the module (any non-test file) imports tests/...; the engines'
// hash package is imported only by its user, the simulator (cmd/enginesim/...), outside tests.
func TestImportRules(t *testing.T) {
	root := testenv.RepoRoot(t)
	rules := []struct {
		pkg     string // import path below the module
		allowed string // directory prefix whose non-test files may import it
	}{
		{pkg: "tests", allowed: "tests/"},
		{pkg: "cmd/enginesim/vllmhash", allowed: "cmd/enginesim/"},
	}
	for _, f := range parseGoFiles(t, root, parser.ImportsOnly) {
		if f.test {
			continue
		}
		for _, imp := range imports(f) {
			for _, r := range rules {
				p := module + "/" + r.pkg
				if (imp == p || strings.HasPrefix(imp, p+"/")) && !strings.HasPrefix(f.path, r.allowed) {
					t.Errorf("%s imports %s: only files under %s may (outside tests)", f.path, imp, r.allowed)
				}
			}
		}
	}
}

// TestErrorLogKey: a log call that records an error names it "error" (slog's convention, and what log
// queries filter on), never "err" or another key.
func TestErrorLogKey(t *testing.T) {
	root := testenv.RepoRoot(t)
	logMethods := map[string]bool{}
	for _, m := range []string{"Debug", "Info", "Warn", "Error", "Log", "With"} {
		logMethods[m] = true
		logMethods[m+"Context"] = true
	}
	attrFuncs := map[string]bool{"Any": true, "String": true}
	errValue := regexp.MustCompile(`(^|[a-z_])(err|Err)$`)
	for _, f := range parseGoFiles(t, root, 0) {
		ast.Inspect(f.ast, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			check := func(key ast.Expr, val ast.Expr) {
				lit, ok := key.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return
				}
				k, _ := strconv.Unquote(lit.Value)
				isErr := k == "err"
				if id, ok := val.(*ast.Ident); ok && errValue.MatchString(id.Name) {
					isErr = true
				}
				if isErr && k != "error" {
					t.Errorf("%s: log key %q for an error; use \"error\"", f.fset.Position(lit.Pos()), k)
				}
			}
			x, _ := sel.X.(*ast.Ident)
			switch {
			case x != nil && x.Name == "slog" && attrFuncs[sel.Sel.Name] && len(call.Args) == 2:
				check(call.Args[0], call.Args[1])
			case logMethods[sel.Sel.Name] && !(x != nil && (x.Name == "t" || x.Name == "b" || x.Name == "tb")):
				for i := 0; i+1 < len(call.Args); i++ {
					check(call.Args[i], call.Args[i+1])
				}
			}
			return true
		})
	}
}

// TestGoldensOnce: no two files under testdata/ directories have the same content; a package that needs
// another's reference data reads it by relative path. Fuzz corpora (the fuzz directory under testdata) are exempt: the go
// command reads them only from the package's own directory.
func TestGoldensOnce(t *testing.T) {
	root := testenv.RepoRoot(t)
	seen := map[string]string{}
	for _, rel := range repoFiles(t, root, "", true) {
		if !strings.Contains("/"+rel, "/testdata/") || strings.Contains(rel, "/testdata/fuzz/") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		k := hex.EncodeToString(sum[:])
		if first, ok := seen[k]; ok {
			t.Errorf("%s is a copy of %s: read the one file by relative path", rel, first)
			continue
		}
		seen[k] = rel
	}
}

var (
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// repoPath is a slash path as docs write it: in backquotes or as a bare word.
	repoPath = regexp.MustCompile("[A-Za-z0-9_.\\-]+(?:/[A-Za-z0-9_.\\-*{}]+)+/?")
	// fileName is a bare file name with an extension the repository's own files use.
	fileName = regexp.MustCompile("(?:^|[\\s`(])([A-Za-z0-9_\\-]+\\.(?:md|py|sh))\\b")
	// external names files of other projects that docs cite by name (vLLM's and transformers' sources).
	external = map[string]bool{"chat_utils.py": true, "chat_template_utils.py": true, "metrics.py": true}
)

// pathChecker resolves the paths docs name against the repository.
type pathChecker struct {
	root  string
	tops  map[string]bool // top-level directories of the repository
	names map[string]bool // base names of every file in the repository
}

func newPathChecker(t *testing.T, root string) *pathChecker {
	c := &pathChecker{root: root, tops: map[string]bool{}, names: map[string]bool{}}
	ents, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		// Build output is not the repository: a doc naming bin/kvgate is not naming a file that must exist.
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") && !buildOutput(e.Name()) {
			c.tops[e.Name()] = true
		}
	}
	c.tops["ref"] = true // reference material that was never in the repository: must not be named
	for _, rel := range repoFiles(t, root, "", true) {
		c.names[filepath.Base(rel)] = true
	}
	for _, n := range []string{"go.mod", "Makefile"} {
		c.names[n] = true
	}
	return c
}

func (c *pathChecker) exists(p string) bool {
	p = strings.TrimSuffix(p, "/")
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		if j := strings.IndexByte(p[i:], '.'); j > 0 && p[i+j+1:] != "" && isIdent(p[i+j+1:]) {
			p = p[:i+j] // a Go identifier: gateway/internal/model.Model, kvstore/testenv.Command
		}
	}
	if strings.ContainsAny(p, "*{") {
		m, _ := filepath.Glob(filepath.Join(c.root, strings.NewReplacer("{", "*", "}", "*").Replace(p)))
		return len(m) > 0
	}
	_, err := os.Stat(filepath.Join(c.root, p))
	return err == nil
}

// isIdent reports whether s is a Go identifier or a dotted chain of them (Model, Set.Load).
func isIdent(s string) bool {
	for _, part := range strings.Split(s, ".") {
		if part == "" || !(part[0] >= 'A' && part[0] <= 'Z') {
			return false
		}
	}
	return true
}

// check reports the missing paths in one line of text written in dir (relative to the root).
func (c *pathChecker) check(t *testing.T, where, dir, line string) {
	t.Helper()
	for _, m := range repoPath.FindAllStringIndex(line, -1) {
		p := strings.TrimRight(line[m[0]:m[1]], ".")
		if m[0] > 0 && strings.ContainsRune("/.:@~$<", rune(line[m[0]-1])) {
			continue // part of a URL, an absolute path or a template
		}
		first, _, _ := strings.Cut(p, "/")
		switch {
		case c.tops[first]:
			if !c.exists(p) && !c.exists(filepath.Join(dir, p)) {
				t.Errorf("%s: %s does not exist", where, p)
			}
		case first == "testdata":
			if !c.exists(filepath.Join(dir, p)) {
				t.Errorf("%s: %s does not exist (relative to %s)", where, p, dir)
			}
		}
	}
	for _, m := range fileName.FindAllStringSubmatch(line, -1) {
		if !c.names[m[1]] && !external[m[1]] {
			t.Errorf("%s: no file named %s in the repository", where, m[1])
		}
	}
}

// TestRelativePathsExist: every string literal in a Go file that is a relative path (starting with "../"
// or with a testdata directory) names a file or directory that exists, resolved from the file's package directory (where
// go test runs): a golden moved or deleted fails here, not only in the package that reads it.
func TestRelativePathsExist(t *testing.T) {
	root := testenv.RepoRoot(t)
	for _, f := range parseGoFiles(t, root, 0) {
		dir := filepath.Dir(f.path)
		ast.Inspect(f.ast, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			p, err := strconv.Unquote(lit.Value)
			relative := strings.HasPrefix(p, "../") || strings.HasPrefix(p, "testdata/") && len(p) > len("testdata/")
			if err != nil || !relative || strings.ContainsAny(p, " %\n") || strings.Contains(p, "/bin/") {
				return true // bin/ is build output, not tracked
			}
			full := filepath.Join(root, dir, p)
			if m, _ := filepath.Glob(full); len(m) == 0 {
				t.Errorf("%s: %q does not exist (from %s)", f.fset.Position(lit.Pos()), p, dir)
			}
			return true
		})
	}
}

// TestDocPathsExist: every relative link in a Markdown file points at a file or directory that exists,
// and every repository path or repository file name that a Markdown file or a Go doc comment names exists.
func TestDocPathsExist(t *testing.T) {
	root := testenv.RepoRoot(t)
	c := newPathChecker(t, root)
	for _, rel := range repoFiles(t, root, ".md", false) {
		f, err := os.Open(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Dir(rel)
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		n, fenced := 0, false
		for sc.Scan() {
			n++
			line := sc.Text()
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				fenced = !fenced
				continue
			}
			where := rel + ":" + strconv.Itoa(n)
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target, _, _ := strings.Cut(m[1], "#")
				if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				if _, err := os.Stat(filepath.Join(root, dir, target)); err != nil {
					t.Errorf("%s: link %s does not exist", where, m[1])
				}
			}
			if !fenced {
				c.check(t, where, dir, line)
			}
		}
		f.Close()
	}
	for _, f := range parseGoFiles(t, root, parser.ParseComments) {
		dir := filepath.Dir(f.path)
		for _, cg := range f.ast.Comments {
			for _, cm := range cg.List {
				for i, line := range strings.Split(cm.Text, "\n") {
					pos := f.fset.Position(cm.Pos())
					c.check(t, f.path+":"+strconv.Itoa(pos.Line+i), dir, line)
				}
			}
		}
	}
}

var (
	contractSection = regexp.MustCompile("^## ([a-z][a-z0-9/\\-]*)[: ]")
	contractFunc    = regexp.MustCompile(`\bfunc (?:\(\w+ \*?(\w+)(?:\[[^\]]*\])?\) )?([A-Z]\w*)[\[(]`)
	contractType    = regexp.MustCompile(`\btype ([A-Z]\w*)\b`)
)

// TestContractsSignaturesExist: every exported function, method and type that docs/CONTRACTS.md names in
// the Go blocks of a package's section ("## path: ...") is declared in that package (outside tests), so the
// document cannot keep naming what was renamed or removed.
func TestContractsSignaturesExist(t *testing.T) {
	root := testenv.RepoRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "docs", "CONTRACTS.md"))
	if err != nil {
		t.Fatal(err)
	}
	decls := map[string]map[string]bool{} // package dir → "Name" and "Recv.Name"
	declsOf := func(dir string) map[string]bool {
		if d, ok := decls[dir]; ok {
			return d
		}
		d := map[string]bool{}
		decls[dir] = d
		ents, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			return nil
		}
		for _, e := range ents {
			if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, dir, e.Name()), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			for _, decl := range f.Decls {
				switch x := decl.(type) {
				case *ast.FuncDecl:
					if x.Recv != nil && len(x.Recv.List) == 1 {
						typ := x.Recv.List[0].Type
						if s, ok := typ.(*ast.StarExpr); ok {
							typ = s.X
						}
						if ix, ok := typ.(*ast.IndexExpr); ok {
							typ = ix.X
						}
						if id, ok := typ.(*ast.Ident); ok {
							d[id.Name+"."+x.Name.Name] = true
						}
					} else {
						d[x.Name.Name] = true
					}
				case *ast.GenDecl:
					for _, sp := range x.Specs {
						switch s := sp.(type) {
						case *ast.TypeSpec:
							d[s.Name.Name] = true
						case *ast.ValueSpec:
							for _, n := range s.Names {
								d[n.Name] = true
							}
						}
					}
				}
			}
		}
		return d
	}
	dir, inGo := "", false
	for n, line := range strings.Split(string(raw), "\n") {
		if m := contractSection.FindStringSubmatch(line); m != nil {
			dir = m[1]
			continue
		}
		if strings.HasPrefix(line, "```") {
			inGo = strings.HasPrefix(line, "```go")
			continue
		}
		if !inGo || dir == "" {
			continue
		}
		d := declsOf(dir)
		if d == nil {
			t.Errorf("docs/CONTRACTS.md:%d: section %s is not a package directory", n+1, dir)
			continue
		}
		for _, m := range contractFunc.FindAllStringSubmatch(line, -1) {
			name := m[2]
			if m[1] != "" {
				name = m[1] + "." + m[2]
			}
			if !d[name] {
				t.Errorf("docs/CONTRACTS.md:%d: %s names %s, which %s does not declare", n+1, dir, name, dir)
			}
		}
		for _, m := range contractType.FindAllStringSubmatch(line, -1) {
			if !d[m[1]] {
				t.Errorf("docs/CONTRACTS.md:%d: %s names type %s, which %s does not declare", n+1, dir, m[1], dir)
			}
		}
	}
}
