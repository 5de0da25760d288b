package config

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// The front-door keys have their documented defaults, parse from YAML (retry_on statuses as numbers or
// strings) and are validated with their key path.
func TestFrontDoorKeys(t *testing.T) {
	c, err := Parse([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	f := c.FrontDoor
	if f.MaxConnections != 10000 || f.MaxConnectionsPerIP != 0 || f.ClientHeaderTimeout != 10*time.Second ||
		f.ClientBodyTimeout != time.Minute || f.ClientWriteTimeout != 30*time.Second || f.UpstreamConnectTimeout != 5*time.Second ||
		f.UpstreamFirstByteTimeout != 2*time.Minute || f.UpstreamTotalTimeout != 30*time.Minute || f.RetryBudget != 0.2 ||
		f.MaxBatchPrompts != 256 || f.OutlierConsecutiveFailures != 5 || f.OutlierEjectionTime != 30*time.Second ||
		!slices.Equal(f.RetryOn, []string{"connect_error", "503", "429"}) || f.ForwardCookies || f.MetricsListen != "" ||
		f.ClientLingeringTime != 2*time.Second || f.ClientLingeringBytes != 64<<20 || f.MaxLingeringConnections != 1024 {
		t.Fatalf("defaults: %+v", f)
	}
	c, err = Parse([]byte("retry_on: [connect_error, 502, \"503\"]\ntrusted_proxies: [10.0.0.0/8, \"::1\"]\nmetrics_listen: \"127.0.0.1:9100\"\n" + minimal))
	if err != nil {
		t.Fatal(err)
	}
	if !c.RetryOnStatus(502) || !c.RetryOnStatus(503) || c.RetryOnStatus(429) || !c.RetryOnConnect() {
		t.Fatalf("retry_on %v", c.RetryOn)
	}
	for _, tc := range []struct{ yaml, key string }{
		{"retry_on: [404]\n", "retry_on[0]"},
		{"retry_on: [sometimes]\n", "retry_on[0]"},
		{"trusted_proxies: [not-an-ip]\n", "trusted_proxies[0]"},
		{"max_connections: -1\n", "max_connections"},
		{"max_connections_per_ip: -2\n", "max_connections_per_ip"},
		{"retry_budget: 2\n", "retry_budget"},
		{"upstream_total_timeout: -1s\n", "upstream_total_timeout"},
		{"metrics_listen: nowhere\n", "metrics_listen"},
		{"client_lingering_time: -1s\n", "client_lingering_time"},
		{"client_lingering_bytes: -1\n", "client_lingering_bytes"},
		{"max_lingering_connections: -1\n", "max_lingering_connections"},
	} {
		_, err := Parse([]byte(tc.yaml + minimal))
		var ce *Error
		if !errors.As(err, &ce) || ce.Key != tc.key {
			t.Errorf("%s: err = %v, want key %s", strings.TrimSpace(tc.yaml), err, tc.key)
		}
	}
}
