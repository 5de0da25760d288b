package server

import (
	"strconv"
	"strings"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/gateway/internal/openai"
)

// CORS (config key `cors`, gateway/config/cors.go): off unless allowed origins are configured.

// corsMethods are the methods a preflight may ask for.
const corsMethods = "GET, POST, PUT, DELETE, OPTIONS"

// corsExposed are the response headers a page may read.
const corsExposed = "x-kvgate-endpoint, x-kvgate-policy, x-kvgate-policy-fallback, x-kvgate-routing, x-kvgate-routing-reason, retry-after"

// corsSkip are the engine's own CORS response headers: never passed through (vLLM answers
// Access-Control-Allow-Origin: * by default); the gateway's configuration alone decides.
var corsSkip = map[string]bool{"Access-Control-Allow-Origin": true, "Access-Control-Allow-Credentials": true,
	"Access-Control-Allow-Methods": true, "Access-Control-Allow-Headers": true, "Access-Control-Expose-Headers": true,
	"Access-Control-Max-Age": true}

// isPreflight says whether h is a CORS preflight: OPTIONS with Origin and Access-Control-Request-Method.
func isPreflight(h *fasthttp.RequestHeader) bool {
	return string(h.Method()) == fiber.MethodOptions && len(h.Peek(fiber.HeaderOrigin)) > 0 &&
		len(h.Peek(fiber.HeaderAccessControlRequestMethod)) > 0
}

// corsPreflight says whether h is a preflight the gateway answers itself (CORS enabled): such a request
// carries no credentials, so the auth decision lets it through to cors, which answers it without a body.
func (s *Server) corsPreflight(h *fasthttp.RequestHeader) bool {
	return s.o.Config.CORS.Enabled() && isPreflight(h)
}

// cors runs before auth: it answers preflights (204 for an allowed origin, 403 otherwise) and adds
// Access-Control-Allow-Origin and -Expose-Headers to every answer to an allowed origin, errors included
// (so a page can read a 401 or 429).
func (s *Server) cors(c *fiber.Ctx) error {
	cfg := &s.o.Config.CORS
	if !cfg.Enabled() {
		return c.Next()
	}
	origin := c.Get(fiber.HeaderOrigin)
	if origin == "" {
		return c.Next()
	}
	c.Append(fiber.HeaderVary, fiber.HeaderOrigin)
	allowed := cfg.Allows(origin)
	if isPreflight(&c.Request().Header) {
		if !allowed {
			return sendError(c, openai.Errorf(fiber.StatusForbidden, "invalid_request_error", "", "origin_not_allowed",
				"The origin %s is not allowed (cors.allowed_origins).", origin))
		}
		s.corsAllow(c, origin)
		c.Set(fiber.HeaderAccessControlAllowMethods, corsMethods)
		hdrs := strings.Join(cfg.AllowedHeaders, ", ")
		if hdrs == "" {
			hdrs = c.Get(fiber.HeaderAccessControlRequestHeaders)
			c.Append(fiber.HeaderVary, fiber.HeaderAccessControlRequestHeaders)
		}
		if hdrs != "" {
			c.Set(fiber.HeaderAccessControlAllowHeaders, hdrs)
		}
		c.Set(fiber.HeaderAccessControlMaxAge, strconv.Itoa(int(cfg.MaxAgeOrDefault().Seconds())))
		return c.SendStatus(fiber.StatusNoContent)
	}
	if allowed {
		s.corsAllow(c, origin)
		c.Set(fiber.HeaderAccessControlExposeHeaders, corsExposed)
	}
	return c.Next()
}

func (s *Server) corsAllow(c *fiber.Ctx, origin string) {
	if s.o.Config.CORS.AnyOrigin() {
		c.Set(fiber.HeaderAccessControlAllowOrigin, "*")
		return
	}
	c.Set(fiber.HeaderAccessControlAllowOrigin, origin)
}
