package plugins

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Errors of ParseVersion and ResolveVersion (wrapped with the string asked for; match with errors.Is).
var (
	// ErrBadVersion: not a version: ParseVersion wants name@ and 64 lowercase hex digits, ResolveVersion
	// name@ and at least 8 hex digits of any case (or, where allowed, a bare name).
	ErrBadVersion = errors.New("want name@sha256 (at least 8 hex digits)")
	// ErrVersionNotFound: no candidate matches.
	ErrVersionNotFound = errors.New("not loaded")
	// ErrVersionAmbiguous: the name or hex prefix matches more than one candidate.
	ErrVersionAmbiguous = errors.New("ambiguous: give more hex digits")
)

// ResolvePrefixMin is the fewest hex digits ResolveVersion takes after "name@".
const ResolvePrefixMin = 8

// VersionOf returns the Version that Load would give wasm under name: name, "@", and the lowercase hex
// sha256 of the module bytes.
func VersionOf(name string, wasm []byte) Version {
	sum := sha256.Sum256(wasm)
	return Version(name + "@" + hex.EncodeToString(sum[:]))
}

// ParseVersion checks that s is a whole version, a non-empty name, "@" and 64 lowercase hex digits, and
// returns it typed; otherwise the error wraps ErrBadVersion. The name is everything before the last "@".
func ParseVersion(s string) (Version, error) {
	i := strings.LastIndexByte(s, '@')
	if i <= 0 || !isHex(s[i+1:], false) || len(s)-i-1 != 2*sha256.Size {
		return "", fmt.Errorf("version %q: %w", s, ErrBadVersion)
	}
	return Version(s), nil
}

// IsVersion reports whether s parses as a whole version (ParseVersion).
func IsVersion(s string) bool {
	_, err := ParseVersion(s)
	return err == nil
}

// Name is the policy name of v (before the last "@"; all of v when it has none).
func (v Version) Name() string {
	if i := strings.LastIndexByte(string(v), '@'); i >= 0 {
		return string(v[:i])
	}
	return string(v)
}

// SHA256 is the hex digest of v ("" when v has no "@").
func (v Version) SHA256() string {
	if i := strings.LastIndexByte(string(v), '@'); i >= 0 {
		return string(v[i+1:])
	}
	return ""
}

// ResolveVersion finds the one candidate that s names: "name@" followed by at least ResolvePrefixMin hex
// digits of any case, which must begin that candidate's digest (a whole version is its own prefix), or,
// when bareName is set, a name alone, which names that name's only candidate. Errors wrap ErrBadVersion
// (s is neither), ErrVersionNotFound or ErrVersionAmbiguous.
func ResolveVersion(candidates []Version, s string, bareName bool) (Version, error) {
	name, prefix, hasAt := s, "", false
	if i := strings.LastIndexByte(s, '@'); i >= 0 {
		name, prefix, hasAt = s[:i], s[i+1:], true
	}
	switch {
	case name == "":
		return "", fmt.Errorf("version %q: %w", s, ErrBadVersion)
	case hasAt && (len(prefix) < ResolvePrefixMin || !isHex(prefix, true)):
		return "", fmt.Errorf("version %q: %w", s, ErrBadVersion)
	case !hasAt && !bareName:
		return "", fmt.Errorf("version %q: %w", s, ErrBadVersion)
	}
	prefix = strings.ToLower(prefix)
	var found Version
	n := 0
	for _, c := range candidates {
		if c.Name() == name && strings.HasPrefix(c.SHA256(), prefix) && c != found {
			found = c
			n++
		}
	}
	switch n {
	case 0:
		return "", fmt.Errorf("version %q: %w", s, ErrVersionNotFound)
	case 1:
		return found, nil
	}
	return "", fmt.Errorf("version %q: %w", s, ErrVersionAmbiguous)
}

// isHex reports whether s is all hex digits (lowercase only unless anyCase).
func isHex(s string, anyCase bool) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || anyCase && c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}
