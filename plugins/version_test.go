package plugins

import (
	"errors"
	"strings"
	"testing"
)

func TestParseVersion(t *testing.T) {
	a := strings.Repeat("ab", 32)
	if v, err := ParseVersion("p@" + a); err != nil || v.Name() != "p" || v.SHA256() != a {
		t.Fatalf("ParseVersion: %q %v", v, err)
	}
	if v := VersionOf("three-tier", []byte("x")); !IsVersion(string(v)) || v.Name() != "three-tier" || len(v.SHA256()) != 64 {
		t.Fatalf("VersionOf: %q", v)
	}
	for _, bad := range []string{"", "p", "p@", "@" + a, "p@" + strings.ToUpper(a), "p@" + a[:63], "p@" + a + "0", "p@" + a[:63] + "g"} {
		if _, err := ParseVersion(bad); !errors.Is(err, ErrBadVersion) {
			t.Errorf("ParseVersion(%q): %v, want ErrBadVersion", bad, err)
		}
	}
}

// TestResolveVersion pins the one resolver's semantics: name@ plus ≥ 8 hex digits of any case, unique among
// that name's candidates; a bare name only where allowed, and only when that name has one candidate. The
// config resolver used to take "three-tier@" with no digits for the built-in and was case-sensitive.
func TestResolveVersion(t *testing.T) {
	a := strings.Repeat("ab", 32)
	b := "abababab" + strings.Repeat("cd", 28)
	c := strings.Repeat("0f", 32)
	vs := []Version{Version("p@" + a), Version("p@" + b), Version("q@" + c), Version("q@" + c)}
	for _, tc := range []struct {
		s    string
		bare bool
		want string
		err  error
	}{
		{s: "p@" + a, want: "p@" + a},
		{s: "p@ababababcd", want: "p@" + b},
		{s: "q@0F0F0F0F", want: "q@" + c}, // any case; a duplicate candidate counts once
		{s: "q", bare: true, want: "q@" + c},
		{s: "q", err: ErrBadVersion},
		{s: "p", bare: true, err: ErrVersionAmbiguous},
		{s: "r", bare: true, err: ErrVersionNotFound},
		{s: "p@", bare: true, err: ErrBadVersion},
		{s: "p@abab", err: ErrBadVersion},
		{s: "p@abababag", err: ErrBadVersion},
		{s: "@abababab", err: ErrBadVersion},
		{s: "", bare: true, err: ErrBadVersion},
		{s: "p@abababab", err: ErrVersionAmbiguous},
		{s: "q@abababab", err: ErrVersionNotFound},
		{s: "p@cdcdcdcd", err: ErrVersionNotFound},
	} {
		v, err := ResolveVersion(vs, tc.s, tc.bare)
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("ResolveVersion(%q, %v) = %q, %v; want %v", tc.s, tc.bare, v, err, tc.err)
			}
			continue
		}
		if err != nil || string(v) != tc.want {
			t.Errorf("ResolveVersion(%q, %v) = %q, %v; want %s", tc.s, tc.bare, v, err, tc.want)
		}
	}
}
