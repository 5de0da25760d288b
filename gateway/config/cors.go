package config

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
)

// CORS is the `cors` key: cross-origin requests from browsers. Off unless allowed_origins lists an origin.
//
//	cors:
//	  allowed_origins: ["https://app.example.com", "http://localhost:5173"]   # or ["*"]
//	  allowed_headers: [authorization, content-type]    # default: whatever the preflight asks for
//	  max_age: 10m                                       # how long a browser may cache a preflight
//
// An allowed origin's preflight (OPTIONS with Origin and Access-Control-Request-Method) is answered 204 by
// the gateway before authentication (a browser sends no credentials on a preflight); a preflight from
// another origin gets 403. Every answer to an allowed origin carries Access-Control-Allow-Origin (the
// origin itself, or * for "*") and exposes the x-kvgate-* response headers. Credentials (cookies) are
// never allowed: API keys go in the Authorization header.
type CORS struct {
	// AllowedOrigins are exact origins (scheme://host[:port], no path), or "*" for any origin.
	AllowedOrigins []string `yaml:"allowed_origins"`
	// AllowedHeaders are the request headers a browser may send (empty: those the preflight names).
	AllowedHeaders []string `yaml:"allowed_headers"`
	// MaxAge is Access-Control-Max-Age (default DefaultCORSMaxAge; whole seconds).
	MaxAge time.Duration `yaml:"max_age"`
}

// DefaultCORSMaxAge is cors.max_age when unset.
const DefaultCORSMaxAge = 10 * time.Minute

// Enabled says whether any origin is allowed.
func (c *CORS) Enabled() bool { return len(c.AllowedOrigins) > 0 }

// AnyOrigin says whether allowed_origins is ["*"].
func (c *CORS) AnyOrigin() bool { return slices.Contains(c.AllowedOrigins, "*") }

// Allows says whether a request's Origin header value is allowed (compared as lowercased).
func (c *CORS) Allows(origin string) bool {
	if origin == "" || !c.Enabled() {
		return false
	}
	if c.AnyOrigin() {
		return true
	}
	o := strings.ToLower(origin)
	for _, a := range c.AllowedOrigins {
		if strings.ToLower(a) == o {
			return true
		}
	}
	return false
}

// MaxAgeOrDefault returns MaxAge or DefaultCORSMaxAge.
func (c *CORS) MaxAgeOrDefault() time.Duration {
	if c.MaxAge == 0 {
		return DefaultCORSMaxAge
	}
	return c.MaxAge
}

func (c *CORS) validate(bad func(key, format string, a ...any)) {
	for i, o := range c.AllowedOrigins {
		key := fmt.Sprintf("cors.allowed_origins[%d]", i)
		if o == "*" {
			if len(c.AllowedOrigins) > 1 {
				bad(key, `"*" must be the only origin`)
			}
			continue
		}
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") ||
			u.RawQuery != "" || u.Fragment != "" || u.User != nil || strings.HasSuffix(o, "/") {
			bad(key, "want an origin such as https://app.example.com or http://localhost:5173 (no path), got %q", o)
		}
	}
	for i, h := range c.AllowedHeaders {
		if h == "" || strings.ContainsAny(h, " ,:\t") {
			bad(fmt.Sprintf("cors.allowed_headers[%d]", i), "want a header name, got %q", h)
		}
	}
	if c.MaxAge < 0 {
		bad("cors.max_age", "must not be negative, got %v", c.MaxAge)
	}
}
