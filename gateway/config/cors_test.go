package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// cors is off by default; allowed origins are exact (case-insensitive) or "*"; bad values name their key.
func TestCORSKeys(t *testing.T) {
	c, err := Parse([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	if c.CORS.Enabled() || c.CORS.Allows("http://localhost:3000") {
		t.Fatalf("cors on by default: %+v", c.CORS)
	}
	c, err = Parse([]byte("cors: {allowed_origins: [\"https://App.example.com\", \"http://localhost:5173\"], max_age: 90s}\n" + minimal))
	if err != nil {
		t.Fatal(err)
	}
	if !c.CORS.Allows("https://app.example.com") || !c.CORS.Allows("http://localhost:5173") || c.CORS.Allows("http://localhost:5174") ||
		c.CORS.Allows("https://app.example.com.evil.test") || c.CORS.Allows("") || c.CORS.AnyOrigin() || c.CORS.MaxAgeOrDefault() != 90*time.Second {
		t.Fatalf("cors: %+v", c.CORS)
	}
	c, _ = Parse([]byte("cors: {allowed_origins: [\"*\"]}\n" + minimal))
	if !c.CORS.AnyOrigin() || !c.CORS.Allows("https://anything.test") || c.CORS.MaxAgeOrDefault() != DefaultCORSMaxAge {
		t.Fatalf("cors *: %+v", c.CORS)
	}
	for _, tc := range []struct{ yaml, key string }{
		{"cors: {allowed_origins: [\"https://a.test/app\"]}\n", "cors.allowed_origins[0]"},
		{"cors: {allowed_origins: [\"https://a.test/\"]}\n", "cors.allowed_origins[0]"},
		{"cors: {allowed_origins: [\"a.test\"]}\n", "cors.allowed_origins[0]"},
		{"cors: {allowed_origins: [\"ftp://a.test\"]}\n", "cors.allowed_origins[0]"},
		{"cors: {allowed_origins: [\"https://a.test\", \"*\"]}\n", "cors.allowed_origins[1]"},
		{"cors: {allowed_origins: [\"*\"], allowed_headers: [\"a b\"]}\n", "cors.allowed_headers[0]"},
		{"cors: {max_age: -1s}\n", "cors.max_age"},
	} {
		_, err := Parse([]byte(tc.yaml + minimal))
		var ce *Error
		if !errors.As(err, &ce) || ce.Key != tc.key {
			t.Errorf("%s: err = %v, want key %s", strings.TrimSpace(tc.yaml), err, tc.key)
		}
	}
}
