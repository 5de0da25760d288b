package metrics

import "github.com/prometheus/client_golang/prometheus"

// Reasons of kvgate_connections_rejected_total.
const (
	RejectMaxConnections      = "max_connections"
	RejectMaxConnectionsPerIP = "max_connections_per_ip"
)

// Results of kvgate_lingering_closes_total: how a lingering close ended.
const (
	LingerEOF      = "eof"      // the client closed (or reset) its side: the normal end
	LingerTime     = "time"     // client_lingering_time passed
	LingerBytes    = "bytes"    // client_lingering_bytes were discarded
	LingerError    = "error"    // a read failed otherwise
	LingerShutdown = "shutdown" // the listener was closed (shutdown)
	LingerSkipped  = "skipped"  // max_lingering_connections were lingering: closed at once
)

// Kinds of kvgate_upstream_timeouts_total.
const (
	TimeoutConnect   = "connect"
	TimeoutFirstByte = "first_byte"
	TimeoutTotal     = "total"
	TimeoutIdle      = "idle"
)

// FrontDoor are the collectors of the client-facing listener and of upstream failure handling.
type FrontDoor struct {
	// AcceptErrors counts failed accepts (e.g. EMFILE); the listener backs off and keeps accepting.
	AcceptErrors prometheus.Counter
	// ConnectionsOpen is the number of open client connections.
	ConnectionsOpen prometheus.Gauge
	// ConnectionsRejected counts client connections closed at once for a limit, by reason.
	ConnectionsRejected *prometheus.CounterVec
	// ConnectionsLingering is the number of client connections in a lingering close (half-closed after an
	// error answer, discarding the rest of the request); they are also counted in ConnectionsOpen.
	ConnectionsLingering prometheus.Gauge
	// LingeringCloses counts lingering closes by how they ended (Linger* results).
	LingeringCloses *prometheus.CounterVec
	// UpstreamTimeouts counts upstream requests ended by a timeout, by endpoint and kind.
	UpstreamTimeouts *prometheus.CounterVec
	// UpstreamFailures counts responses that failed after the engine started them (broken or incomplete
	// streams, bodies cut short), by endpoint.
	UpstreamFailures *prometheus.CounterVec
	// RetryBudgetExhausted counts retries refused because the retry budget was spent.
	RetryBudgetExhausted prometheus.Counter
	// Ejections counts passive outlier ejections; EndpointEjected is 1 while an endpoint is ejected.
	Ejections       *prometheus.CounterVec
	EndpointEjected *prometheus.GaugeVec
}

func newFrontDoor(r *prometheus.Registry) *FrontDoor {
	f := &FrontDoor{
		AcceptErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_accept_errors_total",
			Help: "Failed accepts on the client listener (the listener backs off and keeps accepting)."}),
		ConnectionsOpen: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvgate_connections_open",
			Help: "Open client connections."}),
		ConnectionsRejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_connections_rejected_total",
			Help: "Client connections closed at once because a connection limit was reached."}, []string{"reason"}),
		ConnectionsLingering: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvgate_connections_lingering",
			Help: "Client connections in a lingering close (half-closed after an error answer, discarding the rest of the request)."}),
		LingeringCloses: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_lingering_closes_total",
			Help: "Lingering closes by how they ended (eof, time, bytes, error, shutdown; skipped: over max_lingering_connections, closed at once)."}, []string{"result"}),
		UpstreamTimeouts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_upstream_timeouts_total",
			Help: "Upstream requests ended by a timeout, by kind (connect, first_byte, total, idle)."}, []string{"endpoint", "kind"}),
		UpstreamFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_upstream_failures_total",
			Help: "Engine responses that failed after the engine started them (broken or incomplete)."}, []string{"endpoint"}),
		RetryBudgetExhausted: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_retry_budget_exhausted_total",
			Help: "Retries not made because the retry budget was spent."}),
		Ejections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_endpoint_ejections_total",
			Help: "Passive outlier ejections (consecutive 5xx answers or connect errors)."}, []string{"endpoint"}),
		EndpointEjected: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvgate_endpoint_ejected",
			Help: "1 while the endpoint is ejected as an outlier."}, []string{"endpoint"}),
	}
	f.ConnectionsRejected.WithLabelValues(RejectMaxConnections)
	f.ConnectionsRejected.WithLabelValues(RejectMaxConnectionsPerIP)
	for _, r := range []string{LingerEOF, LingerTime, LingerBytes, LingerError, LingerShutdown, LingerSkipped} {
		f.LingeringCloses.WithLabelValues(r)
	}
	r.MustRegister(f.AcceptErrors, f.ConnectionsOpen, f.ConnectionsRejected, f.ConnectionsLingering, f.LingeringCloses, f.UpstreamTimeouts, f.UpstreamFailures,
		f.RetryBudgetExhausted, f.Ejections, f.EndpointEjected)
	return f
}
