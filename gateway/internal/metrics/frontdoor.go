package metrics

import "github.com/prometheus/client_golang/prometheus"

// Reasons of kvgate_connections_rejected_total.
const (
	RejectMaxConnections      = "max_connections"
	RejectMaxConnectionsPerIP = "max_connections_per_ip"
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
	r.MustRegister(f.AcceptErrors, f.ConnectionsOpen, f.ConnectionsRejected, f.UpstreamTimeouts, f.UpstreamFailures,
		f.RetryBudgetExhausted, f.Ejections, f.EndpointEjected)
	return f
}
