package server

import (
	"crypto/subtle"
	"net/url"
	"path"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/kvgate/kvgate/gateway/internal/openai"
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

func tokenOK(got, want string) bool {
	return want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// auth is the one middleware in front of every route: /admin/ (in any spelling) needs the admin token; /v1/
// needs a client key when keys are configured; /metrics needs a token when client keys or a metrics token
// are configured; ambiguous body framing is refused and the connection closed; everything else is open.
// The same decision (refusal) already ran on the headers before the body was read (headerReceived).
func (s *Server) auth(c *fiber.Ctx) error {
	s.refused.del(&c.Request().Header)
	requestID(c) // every answer carries X-Request-Id
	if s.draining.Load() {
		c.Context().SetConnectionClose()
	}
	p := pathOf(&c.Request().Header)
	if e, gen := s.refusal(&c.Request().Header, p); e != nil {
		if gen {
			s.endRefused(c, e.Status) // the body is not read for a refused client
		}
		if e.Status == fiber.StatusBadRequest {
			c.Context().SetConnectionClose()
		}
		return sendError(c, e)
	}
	raw := string(c.Request().URI().PathOriginal())
	if raw != p.raw {
		p.norm, p.ok = NormalizePath(raw)
	}
	if norm, ok := p.norm, p.ok; ok && IsAdminPath(norm) && norm != strings.ToLower(strings.TrimRight(raw, "/")) {
		// Authenticated, but only the canonical spelling is routed.
		return sendError(c, openai.Errorf(fiber.StatusNotFound, "invalid_request_error", "", "not_found", "Use the canonical path %s.", norm))
	}
	return c.Next()
}
