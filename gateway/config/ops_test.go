package config

import (
	"strings"
	"testing"
	"time"
)

// The operations keys: defaults, access_log as on/off/fraction, an explicit zero grace, and errors with
// their key.
func TestOpsKeys(t *testing.T) {
	c, err := Parse([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	if c.AccessLogSample() != 1 || c.Grace() != 5*time.Second || c.Drain() != 30*time.Second {
		t.Fatalf("defaults: %v %v %v", c.AccessLogSample(), c.Grace(), c.Drain())
	}
	for in, want := range map[string]float64{"off": 0, "on": 1, "0.05": 0.05, "1": 1, "false": 0} {
		c, err := Parse([]byte("access_log: " + in + "\nshutdown_grace: 0s\ndrain_timeout: 2m\n" + minimal))
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if c.AccessLogSample() != want || c.Grace() != 0 || c.Drain() != 2*time.Minute {
			t.Fatalf("%s: %v %v %v", in, c.AccessLogSample(), c.Grace(), c.Drain())
		}
	}
	for _, bad := range []string{"access_log: 0\n", "access_log: 1.5\n", "access_log: sometimes\n", "shutdown_grace: -1s\n", "drain_timeout: -1s\n"} {
		_, err := Parse([]byte(bad + minimal))
		key := strings.SplitN(bad, ":", 2)[0]
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Fatalf("%q: %v", bad, err)
		}
	}
}
