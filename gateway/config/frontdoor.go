package config

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Front-door defaults (client connections, upstream timeouts, retries, exposure). See the README's
// "Security" section for what each limit protects against.
const (
	DefaultMaxConnections             = 10000
	DefaultClientHeaderTimeout        = 10 * time.Second
	DefaultClientBodyTimeout          = 60 * time.Second
	DefaultClientWriteTimeout         = 30 * time.Second
	DefaultClientLingeringTime        = 2 * time.Second
	DefaultMaxLingeringConnections    = 1024
	DefaultClientLingeringBytes       = 64 << 20
	DefaultUpstreamConnectTimeout     = 5 * time.Second
	DefaultUpstreamFirstByteTimeout   = 2 * time.Minute
	DefaultUpstreamTotalTimeout       = 30 * time.Minute
	DefaultRetryBudget                = 0.2
	DefaultMaxBatchPrompts            = 256
	DefaultOutlierConsecutiveFailures = 5
	DefaultOutlierEjectionTime        = 30 * time.Second
)

// RetryOnConnectError is the retry_on value for an endpoint that could not be connected to (or whose
// request was provably never written); the other values are engine HTTP statuses ("503", "429", ...).
const RetryOnConnectError = "connect_error"

// DefaultRetryOn is retry_on when left out.
var DefaultRetryOn = []string{RetryOnConnectError, "503", "429"}

// FrontDoor holds the client-connection, upstream-timeout, retry and exposure keys. Its fields are
// top-level keys of the file (inlined into Config).
type FrontDoor struct {
	// MaxConnections caps open client connections (default 10000); a connection over it is closed at once
	// and counted in kvgate_connections_rejected_total{reason="max_connections"}.
	MaxConnections int `yaml:"max_connections,omitempty"`
	// MaxConnectionsPerIP caps open connections per client address (0, the default: no cap). A peer in
	// trusted_proxies is not capped by connection; instead its requests are capped per X-Forwarded-For
	// client address (concurrent requests, 429 over the cap).
	MaxConnectionsPerIP int `yaml:"max_connections_per_ip,omitempty"`
	// TrustedProxies are addresses or CIDR prefixes of proxies whose X-Forwarded-For is believed.
	TrustedProxies []string `yaml:"trusted_proxies,omitempty"`
	// ClientHeaderTimeout is the time a client has to send a request's headers, from the first byte of the
	// connection or the end of the previous response's idle wait (default 10s).
	ClientHeaderTimeout time.Duration `yaml:"client_header_timeout,omitempty"`
	// ClientBodyTimeout is the time a client has to send a request's body once its headers arrived
	// (default 60s).
	ClientBodyTimeout time.Duration `yaml:"client_body_timeout,omitempty"`
	// ClientWriteTimeout disconnects a client that accepts no byte of a response for this long (default
	// 30s): the engine request is cancelled and the lease released.
	ClientWriteTimeout time.Duration `yaml:"client_write_timeout,omitempty"`
	// ClientLingeringTime bounds a lingering close (default 2s): after an error answered before the
	// request's body was read (401 or 400 on the headers, 413, 408), the gateway half-closes the
	// connection and reads and discards what the client still sends, for at most this long, so that the
	// client reads the answer instead of a connection reset.
	ClientLingeringTime time.Duration `yaml:"client_lingering_time,omitempty"`
	// ClientLingeringBytes bounds the bytes a lingering close discards (default 64 MiB). It is not
	// max_body_bytes: a client may be writing fast when the answer arrives, and a cap it reaches before it
	// reads the answer resets the connection as no lingering would.
	ClientLingeringBytes int64 `yaml:"client_lingering_bytes,omitempty"`
	// MaxLingeringConnections caps the connections in a lingering close at once (default 1024); over it a
	// connection is closed at once, as without lingering (kvgate_lingering_closes_total{result="skipped"}).
	MaxLingeringConnections int `yaml:"max_lingering_connections,omitempty"`
	// UpstreamConnectTimeout bounds connecting to an engine (default 5s).
	UpstreamConnectTimeout time.Duration `yaml:"upstream_connect_timeout,omitempty"`
	// UpstreamFirstByteTimeout bounds the wait for a streaming response's headers after the request was
	// sent (default 2m); 504 when it fires.
	UpstreamFirstByteTimeout time.Duration `yaml:"upstream_first_byte_timeout,omitempty"`
	// UpstreamTotalTimeout bounds a whole non-streaming response (default 30m); 504 when it fires.
	UpstreamTotalTimeout time.Duration `yaml:"upstream_total_timeout,omitempty"`
	// RetryOn lists what makes the gateway try another endpoint before any byte reached the client:
	// "connect_error" (the engine provably never started the request) and engine statuses such as "503"
	// and "429" (default [connect_error, "503", "429"]). A request written to an engine is never re-sent
	// after a timeout or a broken connection.
	RetryOn []string `yaml:"retry_on,omitempty"`
	// RetryBudget is the share of requests that may be retries (default 0.2): each request adds this much
	// to a bucket of at most 10 retries, each retry takes one.
	RetryBudget float64 `yaml:"retry_budget,omitempty"`
	// MaxBatchPrompts caps the prompts of one /v1/completions batch (default 256); larger batches get 400.
	MaxBatchPrompts int `yaml:"max_batch_prompts,omitempty"`
	// OutlierConsecutiveFailures ejects an endpoint after this many consecutive 5xx answers or connect
	// errors (default 5) for OutlierEjectionTime (default 30s).
	OutlierConsecutiveFailures int           `yaml:"outlier_consecutive_failures,omitempty"`
	OutlierEjectionTime        time.Duration `yaml:"outlier_ejection_time,omitempty"`
	// MetricsListen, when set (host:port), serves /metrics there only (not on listen).
	MetricsListen string `yaml:"metrics_listen,omitempty"`
	// MetricsTokenEnv names an environment variable holding a bearer token for /metrics on listen. When
	// client API keys are configured, /metrics on listen needs this token or the admin token.
	MetricsTokenEnv string `yaml:"metrics_token_env,omitempty"`
	// ForwardCookies forwards the client's Cookie header to engines (default false: dropped).
	ForwardCookies bool `yaml:"forward_cookies,omitempty"`
}

func (f *FrontDoor) applyDefaults() {
	if f.MaxConnections == 0 {
		f.MaxConnections = DefaultMaxConnections
	}
	for _, d := range []struct {
		p *time.Duration
		v time.Duration
	}{{&f.ClientHeaderTimeout, DefaultClientHeaderTimeout}, {&f.ClientBodyTimeout, DefaultClientBodyTimeout},
		{&f.ClientWriteTimeout, DefaultClientWriteTimeout}, {&f.ClientLingeringTime, DefaultClientLingeringTime},
		{&f.UpstreamConnectTimeout, DefaultUpstreamConnectTimeout},
		{&f.UpstreamFirstByteTimeout, DefaultUpstreamFirstByteTimeout}, {&f.UpstreamTotalTimeout, DefaultUpstreamTotalTimeout},
		{&f.OutlierEjectionTime, DefaultOutlierEjectionTime}} {
		if *d.p == 0 {
			*d.p = d.v
		}
	}
	if f.ClientLingeringBytes == 0 {
		f.ClientLingeringBytes = DefaultClientLingeringBytes
	}
	if f.MaxLingeringConnections == 0 {
		f.MaxLingeringConnections = DefaultMaxLingeringConnections
	}
	if f.RetryOn == nil {
		f.RetryOn = append([]string(nil), DefaultRetryOn...)
	}
	if f.RetryBudget == 0 {
		f.RetryBudget = DefaultRetryBudget
	}
	if f.MaxBatchPrompts == 0 {
		f.MaxBatchPrompts = DefaultMaxBatchPrompts
	}
	if f.OutlierConsecutiveFailures == 0 {
		f.OutlierConsecutiveFailures = DefaultOutlierConsecutiveFailures
	}
}

func (f *FrontDoor) validate(bad func(key, format string, a ...any)) {
	if f.MaxConnections < 1 {
		bad("max_connections", "want at least 1, got %d", f.MaxConnections)
	}
	if f.MaxConnectionsPerIP < 0 {
		bad("max_connections_per_ip", "must not be negative (0 = no cap), got %d", f.MaxConnectionsPerIP)
	}
	if f.ClientLingeringBytes < 0 {
		bad("client_lingering_bytes", "must be positive, got %d", f.ClientLingeringBytes)
	}
	if f.MaxLingeringConnections < 1 {
		bad("max_lingering_connections", "want at least 1, got %d", f.MaxLingeringConnections)
	}
	for i, p := range f.TrustedProxies {
		if _, err := ParseTrustedProxy(p); err != nil {
			bad(fmt.Sprintf("trusted_proxies[%d]", i), "want an IP address or CIDR prefix, got %q", p)
		}
	}
	for key, d := range map[string]time.Duration{"client_header_timeout": f.ClientHeaderTimeout,
		"client_body_timeout": f.ClientBodyTimeout, "client_write_timeout": f.ClientWriteTimeout,
		"client_lingering_time":    f.ClientLingeringTime,
		"upstream_connect_timeout": f.UpstreamConnectTimeout, "upstream_first_byte_timeout": f.UpstreamFirstByteTimeout,
		"upstream_total_timeout": f.UpstreamTotalTimeout, "outlier_ejection_time": f.OutlierEjectionTime} {
		if d < 0 {
			bad(key, "must be positive, got %v", d)
		}
	}
	for i, r := range f.RetryOn {
		if r == RetryOnConnectError {
			continue
		}
		if n, err := strconv.Atoi(r); err != nil || (n != 429 && (n < 500 || n > 599)) {
			bad(fmt.Sprintf("retry_on[%d]", i), "want connect_error, 429 or a 5xx status, got %q", r)
		}
	}
	if f.RetryBudget < 0 || f.RetryBudget > 1 {
		bad("retry_budget", "want a share in [0,1], got %v", f.RetryBudget)
	}
	if f.MaxBatchPrompts < 1 {
		bad("max_batch_prompts", "want at least 1, got %d", f.MaxBatchPrompts)
	}
	if f.OutlierConsecutiveFailures < 1 {
		bad("outlier_consecutive_failures", "want at least 1, got %d", f.OutlierConsecutiveFailures)
	}
	if f.MetricsListen != "" && !strings.Contains(f.MetricsListen, ":") {
		bad("metrics_listen", "want host:port, got %q", f.MetricsListen)
	}
}

// ParseTrustedProxy reads a trusted_proxies entry: an address (a single-address prefix) or a CIDR prefix.
func ParseTrustedProxy(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// RetryOnStatus says whether retry_on lists the engine status code.
func (f *FrontDoor) RetryOnStatus(code int) bool {
	s := strconv.Itoa(code)
	for _, r := range f.RetryOn {
		if r == s {
			return true
		}
	}
	return false
}

// RetryOnConnect says whether retry_on lists connect_error.
func (f *FrontDoor) RetryOnConnect() bool {
	for _, r := range f.RetryOn {
		if r == RetryOnConnectError {
			return true
		}
	}
	return false
}
