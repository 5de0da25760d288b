package admin

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/plugins"
)

func TestResolveVersion(t *testing.T) {
	a := strings.Repeat("ab", 32)
	b := "abababab" + strings.Repeat("cd", 28)
	vs := []plugins.VersionInfo{{Version: plugins.Version("p@" + a), Name: "p", SHA256: a},
		{Version: plugins.Version("p@" + b), Name: "p", SHA256: b}, {Version: plugins.Version("q@" + a), Name: "q", SHA256: a}}
	if v, err := ResolveVersion(vs, "p@"+a); err != nil || string(v) != "p@"+a {
		t.Fatalf("exact: %v %v", v, err)
	}
	if v, err := ResolveVersion(vs, "q@ABABABAB"); err != nil || string(v) != "q@"+a {
		t.Fatalf("prefix, upper case: %v %v", v, err)
	}
	for _, bad := range []string{"p@abab", "p@ababab", "p@abababab" /* ambiguous */, "p", "@abababab", "r@abababab"} {
		if _, err := ResolveVersion(vs, bad); err == nil {
			t.Errorf("%q resolved", bad)
		}
	}
	if v, err := ResolveVersion(vs, "p@ababababcd"); err != nil || string(v) != "p@"+b {
		t.Fatalf("unique prefix: %v %v", v, err)
	}
}
