package server

import (
	"net/url"
	"path"
	"strings"
	"testing"
)

func TestNormalizePath(t *testing.T) {
	admin := []string{"/admin", "/admin/", "//admin/v1/policies", "/admin/../admin/v1/x", "/%61dmin/v1",
		"/%2561dmin/v1", "/ADMIN/v1", "/admin%2fv1", "/v1/../admin/v1", "/./admin", "/admin\\v1", "/x/..%2fadmin",
		"admin/v1", "/%252561dmin"}
	for _, p := range admin {
		n, ok := NormalizePath(p)
		if !ok || !IsAdminPath(n) {
			t.Errorf("%q → %q ok=%v: not recognised as admin", p, n, ok)
		}
	}
	for _, p := range []string{"/v1/chat/completions", "/administrator", "/v1/admin", "/healthz"} {
		if n, ok := NormalizePath(p); !ok || IsAdminPath(n) {
			t.Errorf("%q → %q ok=%v", p, n, ok)
		}
	}
	if _, ok := NormalizePath("/%zz"); ok {
		t.Error("bad escape accepted")
	}
}

// Whatever a path decodes to, an admin spelling is never classified as non-admin: if some number of
// decodings (as a lenient server or proxy behind us might do) and cleaning yields /admin..., so does ours.
func FuzzNormalizePath(f *testing.F) {
	f.Add("/admin/v1")
	f.Fuzz(func(t *testing.T, raw string) {
		n, ok := NormalizePath(raw)
		if !ok {
			return
		}
		if n != strings.ToLower(n) || !strings.HasPrefix(n, "/") {
			t.Fatalf("%q → %q", raw, n)
		}
		p := raw
		for range 4 {
			d, err := url.PathUnescape(p)
			if err != nil {
				break
			}
			p = d
			c := strings.ToLower(path.Clean("/" + strings.ReplaceAll(p, "\\", "/")))
			if IsAdminPath(c) && !IsAdminPath(n) {
				t.Fatalf("%q decodes to admin path %q but normalized to %q", raw, c, n)
			}
		}
	})
}
