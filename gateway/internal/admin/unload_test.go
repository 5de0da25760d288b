package admin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/gofiber/fiber/v2"

	"github.com/kvgate/kvgate/plugins"
)

// newTestAPI mounts the admin API for one model "m" on a real policy host (no Sync: a single gateway
// without a store).
func newTestAPI(t *testing.T) (*fiber.App, *plugins.Host) {
	t.Helper()
	h, err := plugins.New(context.Background(), plugins.Options{PoolSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	app := fiber.New()
	(&API{Host: h, ModelNames: []string{"m"}, MaxPolicyBytes: 64 << 20}).Mount(app.Group("/admin/v1"))
	return app, h
}

func do(t *testing.T, app *fiber.App, method, path, body string) (int, []byte) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	resp, err := app.Test(req, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// errorOf decodes an OpenAI error body.
func errorOf(t *testing.T, b []byte) (typ, param, code, msg string) {
	t.Helper()
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Param   any    `json:"param"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("not an OpenAI error: %s", b)
	}
	p, _ := e.Error.Param.(string)
	c, _ := e.Error.Code.(string)
	return e.Error.Type, p, c, e.Error.Message
}

// DELETE /admin/v1/policies/{version}: refused while the version is active or kept warm for a rollback
// (409 naming where), allowed once it is only in the older history, then 404; the built-in is never
// unloaded; malformed names are 400; the same module can be uploaded again afterwards.
func TestUnloadRoute(t *testing.T) {
	app, h := newTestAPI(t)
	builtin := h.BuiltinVersion()
	if st, b := do(t, app, "PUT", "/admin/v1/policies/p", string(plugins.BuiltinWasm)); st != 201 {
		t.Fatalf("upload: %d %s", st, b)
	}
	v := plugins.VersionOf("p", plugins.BuiltinWasm)
	short := string(v)[:len("p@")+10]
	activate := func(ver plugins.Version) {
		t.Helper()
		if st, b := do(t, app, "POST", "/admin/v1/policies/activate", `{"model":"m","version":"`+string(ver)+`"}`); st != 200 {
			t.Fatalf("activate %s: %d %s", ver, st, b)
		}
	}
	inUse := func(path, where string) {
		t.Helper()
		st, b := do(t, app, "DELETE", path, "")
		typ, param, code, msg := errorOf(t, b)
		if st != 409 || typ != "invalid_request_error" || param != "version" || code != "policy_in_use" || !strings.Contains(msg, where) {
			t.Fatalf("DELETE %s: %d %s, want 409 policy_in_use naming %q", path, st, b, where)
		}
	}

	activate(v)
	inUse("/admin/v1/policies/"+short, "active for m here")
	activate(builtin) // p is now the previous activation, kept warm for a rollback
	inUse("/admin/v1/policies/"+string(v), "previous activation of m here")
	inUse("/admin/v1/policies/"+string(builtin), "built-in default")
	activate(builtin) // p moves to the older history, which Unload drops

	// "@" percent-encoded and the hex prefix in upper case still resolve.
	st, b := do(t, app, "DELETE", "/admin/v1/policies/p%40"+strings.ToUpper(short[len("p@"):]), "")
	var ur UnloadResponse
	if st != 200 || json.Unmarshal(b, &ur) != nil || ur != (UnloadResponse{Version: v, Unloaded: true}) {
		t.Fatalf("DELETE: %d %s", st, b)
	}
	if slices.ContainsFunc(h.Versions(), func(i plugins.VersionInfo) bool { return i.Version == v }) {
		t.Fatal("still loaded after DELETE")
	}
	st, b = do(t, app, "GET", "/admin/v1/policies", "")
	if st != 200 || strings.Contains(string(b), string(v)) {
		t.Fatalf("list after DELETE: %d %s", st, b)
	}
	st, b = do(t, app, "DELETE", "/admin/v1/policies/"+string(v), "")
	if typ, param, code, _ := errorOf(t, b); st != 404 || typ != "invalid_request_error" || param != "version" || code != "policy_not_found" {
		t.Fatalf("second DELETE: %d %s", st, b)
	}
	for _, bad := range []string{"p", "p@abc", "p@zzzzzzzzzz", "activate", "@0123456789"} {
		st, b := do(t, app, "DELETE", "/admin/v1/policies/"+bad, "")
		if _, param, _, _ := errorOf(t, b); st != 400 || param != "version" {
			t.Errorf("DELETE %s: %d %s, want 400", bad, st, b)
		}
	}
	// A Rollback cannot return to the unloaded version: the host kept only the activation before the active one warm.
	if st, b := do(t, app, "POST", "/admin/v1/policies/rollback", `{"model":"m"}`); st != 200 {
		t.Fatalf("rollback: %d %s", st, b)
	}
	if got, _ := h.Active("m"); got != builtin {
		t.Fatalf("after rollback %s is active", got)
	}
	// Upload again: a new load of the same version, which can be activated.
	if st, b := do(t, app, "PUT", "/admin/v1/policies/p", string(plugins.BuiltinWasm)); st != 201 {
		t.Fatalf("upload again: %d %s", st, b)
	}
	activate(v)
	if got, _ := h.Active("m"); got != v {
		t.Fatalf("active %s after upload again", got)
	}
}

func TestResolveVersionErrors(t *testing.T) {
	a := strings.Repeat("ab", 32)
	b := "abababab" + strings.Repeat("cd", 28)
	vs := []plugins.VersionInfo{{Version: plugins.Version("p@" + a), Name: "p", SHA256: a},
		{Version: plugins.Version("p@" + b), Name: "p", SHA256: b}}
	for in, want := range map[string]error{"p@abab": ErrBadVersion, "p": ErrBadVersion, "@abababab": ErrBadVersion,
		"p@abababag": ErrBadVersion, "p@abababab": ErrVersionAmbiguous, "q@abababab": ErrVersionNotFound,
		"p@cdcdcdcd": ErrVersionNotFound} {
		if _, err := ResolveVersion(vs, in); !errors.Is(err, want) {
			t.Errorf("%q: %v, want %v", in, err, want)
		}
	}
	stored := withStored(vs[:1], []plugins.Version{vs[0].Version, "q@" + plugins.Version(a), "noat"})
	if len(stored) != 2 || stored[1].Version != plugins.Version("q@"+a) || stored[1].Name != "q" || stored[1].SHA256 != a {
		t.Fatalf("withStored: %+v", stored)
	}
	if v, err := ResolveVersion(stored, "q@ABABABAB"); err != nil || string(v) != "q@"+a {
		t.Fatalf("stored only: %v %v", v, err)
	}
}

// FuzzResolveVersion: any string either resolves to a listed version with that name and hex prefix, or
// gives one of the typed errors; never a panic.
func FuzzResolveVersion(f *testing.F) {
	a := strings.Repeat("ab", 32)
	b := "abababab" + strings.Repeat("cd", 28)
	vs := []plugins.VersionInfo{{Version: plugins.Version("p@" + a), Name: "p", SHA256: a},
		{Version: plugins.Version("p@" + b), Name: "p", SHA256: b}, {Version: plugins.Version("q@" + a), Name: "q", SHA256: a}}
	for _, s := range []string{"p@" + a, "q@ABABABAB", "p@abababab", "p@", "@", "", "p@@abababab", "p@ababababcd"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ResolveVersion(vs, s)
		if err != nil {
			if !errors.Is(err, ErrBadVersion) && !errors.Is(err, ErrVersionNotFound) && !errors.Is(err, ErrVersionAmbiguous) {
				t.Fatalf("%q: untyped error %v", s, err)
			}
			return
		}
		name, hex, _ := strings.Cut(s, "@")
		if !strings.HasPrefix(string(v), name+"@"+strings.ToLower(hex)) {
			t.Fatalf("%q resolved to %s", s, v)
		}
	})
}
