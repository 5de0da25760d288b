package config

import (
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Operations defaults (access log, drain). See the README's "Operations" section.
const (
	// DefaultShutdownGrace is how long a stopping gateway keeps accepting after SIGTERM while /readyz
	// already fails, so that load balancers stop sending it new requests first.
	DefaultShutdownGrace = 5 * time.Second
	// DefaultDrainTimeout is how long a stopping gateway waits for its in-flight requests (streams
	// included) once it stopped accepting; those still running then are cancelled.
	DefaultDrainTimeout = 30 * time.Second
)

// Access-log modes (Ops.AccessLog).
const (
	AccessLogOn  = "on"
	AccessLogOff = "off"
)

// Ops holds the operations keys: access log, drain on shutdown. Its fields are top-level keys of the file
// (inlined into Config).
type Ops struct {
	// AccessLog is "on" (default: one info line per generation request), "off", or a fraction in (0,1]
	// such as 0.05: that share of successful requests is logged, and every request answered with a status
	// of 400 or more (or 499, the client went away) is logged whatever the fraction.
	AccessLog string `yaml:"access_log,omitempty"`
	// ShutdownGrace is how long, after SIGTERM, the gateway keeps serving and accepting while /readyz
	// answers 503 (default 5s; 0s is allowed only written as "0s": no grace).
	ShutdownGrace *time.Duration `yaml:"shutdown_grace,omitempty"`
	// DrainTimeout bounds the wait for in-flight requests (streams included) once the listener closed
	// (default 30s); requests still running then are cancelled and their leases released.
	DrainTimeout time.Duration `yaml:"drain_timeout,omitempty"`
	// TLS, when set, serves listen over TLS with this certificate, reloaded when its files change.
	TLS *ListenerTLS `yaml:"tls,omitempty"`
	// UpstreamTLS verifies https:// engines with ca_file (default: the system's roots) and presents a
	// client certificate for mutual TLS.
	UpstreamTLS *ClientTLS `yaml:"upstream_tls,omitempty"`
	// Tracing, when set, exports OpenTelemetry traces over OTLP/HTTP (off by default).
	Tracing *Tracing `yaml:"tracing,omitempty"`
}

// Tracing configures OpenTelemetry traces: a span per generation request with the routing stages, reserve,
// the engine call and the first byte as child spans and events; W3C traceparent read from clients and sent
// to engines.
type Tracing struct {
	// Endpoint is the collector's OTLP/HTTP traces URL, e.g. http://otel-collector:4318/v1/traces.
	Endpoint string `yaml:"endpoint"`
	// SampleRatio is the share of new traces sampled (0 or unset: 1); a client's traceparent sampled flag
	// is followed.
	SampleRatio float64 `yaml:"sample_ratio"`
	// ServiceName is the service.name of the spans (default kvgate).
	ServiceName string `yaml:"service_name"`
	// BatchTimeout is the longest a finished span waits before it is exported (default 5s).
	BatchTimeout time.Duration `yaml:"batch_timeout"`
}

// ListenerTLS names the listener's PEM certificate (chain) and key files.
type ListenerTLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// ClientTLS configures a TLS client (engines, Redis): CAFile is a PEM bundle of the CAs that verify the
// server (empty: the system's roots); CertFile and KeyFile, both or neither, the client certificate for
// mutual TLS; ServerName, when set, the name verified instead of the dialled host.
type ClientTLS struct {
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
}

func (t *ClientTLS) validate(key string, bad func(key, format string, a ...any)) {
	if t != nil && (t.CertFile == "") != (t.KeyFile == "") {
		bad(key+".cert_file", "cert_file and key_file go together")
	}
}

func (o *Ops) applyDefaults() {
	if o.AccessLog == "" {
		o.AccessLog = AccessLogOn
	}
	if o.ShutdownGrace == nil {
		d := DefaultShutdownGrace
		o.ShutdownGrace = &d
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	if t := o.Tracing; t != nil {
		if t.SampleRatio == 0 {
			t.SampleRatio = 1
		}
		if t.ServiceName == "" {
			t.ServiceName = "kvgate"
		}
	}
}

func (o *Ops) validate(bad func(key, format string, a ...any)) {
	if _, ok := parseAccessLog(o.AccessLog); !ok {
		bad("access_log", "want on, off or a fraction in (0,1], got %q", o.AccessLog)
	}
	if o.ShutdownGrace != nil && *o.ShutdownGrace < 0 {
		bad("shutdown_grace", "must not be negative, got %v", *o.ShutdownGrace)
	}
	if o.DrainTimeout < 0 {
		bad("drain_timeout", "must be positive, got %v", o.DrainTimeout)
	}
	if o.TLS != nil && (o.TLS.CertFile == "" || o.TLS.KeyFile == "") {
		bad("tls", "needs cert_file and key_file")
	}
	o.UpstreamTLS.validate("upstream_tls", bad)
	if t := o.Tracing; t != nil {
		if u, err := url.Parse(t.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("tracing.endpoint", "want an http(s)://host:port/v1/traces URL, got %q", t.Endpoint)
		}
		if t.SampleRatio < 0 || t.SampleRatio > 1 {
			bad("tracing.sample_ratio", "want a share in [0,1], got %v", t.SampleRatio)
		}
		if t.BatchTimeout < 0 {
			bad("tracing.batch_timeout", "must not be negative")
		}
	}
}

// AccessLogSample is the share of successful requests the access log writes: 1 for on (and for a Config
// built by a program that left the key empty), 0 for off, else the configured fraction.
func (o *Ops) AccessLogSample() float64 {
	f, _ := parseAccessLog(o.AccessLog)
	return f
}

// Grace returns shutdown_grace (DefaultShutdownGrace when unset).
func (o *Ops) Grace() time.Duration {
	if o.ShutdownGrace == nil {
		return DefaultShutdownGrace
	}
	return *o.ShutdownGrace
}

// Drain returns drain_timeout (DefaultDrainTimeout when unset).
func (o *Ops) Drain() time.Duration {
	if o.DrainTimeout <= 0 {
		return DefaultDrainTimeout
	}
	return o.DrainTimeout
}

func parseAccessLog(s string) (float64, bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", AccessLogOn, "true":
		return 1, true
	case AccessLogOff, "false":
		return 0, true
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f > 0 && f <= 1) {
		return 0, false
	}
	return f, true
}
