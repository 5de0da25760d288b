package server

import (
	"crypto/subtle"
	"net/url"
	"path"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/kvgate/kvgate/gateway/openai"
)

// NormalizePath returns the canonical form of a raw request path used for the auth decision: percent-escapes
// decoded (repeatedly, so double encoding cannot hide a segment), backslashes read as slashes, "." and ".."
// resolved, repeated and trailing slashes dropped, lowercased. ok is false when the path cannot be decoded.
// The decision is taken on this form BEFORE routing, so no spelling of /admin/ reaches a handler unchecked.
func NormalizePath(raw string) (norm string, ok bool) {
	p := raw
	for range 4 {
		if !strings.Contains(p, "%") {
			break
		}
		d, err := url.PathUnescape(p)
		if err != nil {
			return "", false
		}
		p = d
	}
	if strings.Contains(p, "%") {
		return "", false // still escaped after 4 rounds: refuse to guess
	}
	p = strings.ReplaceAll(p, "\\", "/")
	p = path.Clean("/" + p)
	return strings.ToLower(p), true
}

// IsAdminPath reports whether a normalized path is under /admin.
func IsAdminPath(norm string) bool { return norm == "/admin" || strings.HasPrefix(norm, "/admin/") }

func bearer(c *fiber.Ctx) string {
	h := c.Get(fiber.HeaderAuthorization)
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

func tokenOK(got, want string) bool {
	return want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// auth is the one middleware in front of every route: /admin/ (in any spelling) needs the admin token; /v1/
// needs a client key when keys are configured; everything else is open.
func (s *Server) auth(c *fiber.Ctx) error {
	raw := string(c.Request().URI().PathOriginal())
	norm, ok := NormalizePath(raw)
	if !ok {
		// Undecodable: authenticate as admin if it might be one, else let routing 404 it.
		if strings.Contains(strings.ToLower(raw), "admin") && !tokenOK(bearer(c), s.secrets.AdminToken) {
			return sendError(c, openai.Unauthorized())
		}
		return c.Next()
	}
	if IsAdminPath(norm) {
		if !tokenOK(bearer(c), s.secrets.AdminToken) {
			return sendError(c, openai.Unauthorized())
		}
		if norm != strings.ToLower(strings.TrimRight(raw, "/")) {
			// Authenticated, but only the canonical spelling is routed.
			return sendError(c, openai.Errorf(fiber.StatusNotFound, "invalid_request_error", "", "not_found", "Use the canonical path %s.", norm))
		}
		return c.Next()
	}
	if len(s.secrets.ClientAPIKeys) > 0 && (norm == "/v1" || strings.HasPrefix(norm, "/v1/")) {
		got := bearer(c)
		okKey := 0
		for _, k := range s.secrets.ClientAPIKeys {
			okKey |= subtle.ConstantTimeCompare([]byte(got), []byte(k))
		}
		if got == "" || okKey != 1 {
			if c.Method() == fiber.MethodPost && isGeneratePath(norm) {
				s.count(UnknownModel, "", fiber.StatusUnauthorized) // the body is not read for a refused client
			}
			return sendError(c, openai.Unauthorized())
		}
	}
	return c.Next()
}
