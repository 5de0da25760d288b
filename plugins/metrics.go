package plugins

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Stats are the host's counters since New.
type Stats struct {
	Calls            uint64            // Rank calls
	Fallbacks        map[string]uint64 // by Reason label
	Swaps            uint64            // activations, rollbacks and deactivations
	ReplacedInstance uint64            // instances discarded after a trap or timeout
	AbandonedRunning int64             // calls past their deadline still running on their goroutine
	AbandonedTotal   uint64            // calls given up at their deadline while still running
	AbandonedOverrun time.Duration     // total time abandoned calls ran past their deadline (once they ended)
}

// Stats returns a snapshot of the counters.
func (h *Host) Stats() Stats {
	s := Stats{Calls: h.calls.Load(), Fallbacks: map[string]uint64{}, Swaps: h.swaps.Load(),
		ReplacedInstance: h.replaced.Load(), AbandonedRunning: h.abandoned.Load(),
		AbandonedTotal: h.abandonedN.Load(), AbandonedOverrun: time.Duration(h.abandonedNano.Load())}
	for r := ReasonTrap; r < numReasons; r++ {
		s.Fallbacks[r.String()] = h.fallbacks[r].Load()
	}
	return s
}

var (
	descCalls     = prometheus.NewDesc("kvgate_policy_calls_total", "Routing decisions asked of the policy host.", nil, nil)
	descFallbacks = prometheus.NewDesc("kvgate_policy_host_fallbacks_total", "Decisions the host answered with the native three-tier fallback, by reason (the gateway also counts them per model in kvgate_policy_fallbacks_total).", []string{"reason"}, nil)
	descSwaps     = prometheus.NewDesc("kvgate_policy_swaps_total", "Policy activations, rollbacks and deactivations.", nil, nil)
	descReplaced  = prometheus.NewDesc("kvgate_policy_instances_replaced_total", "Policy instances discarded after a trap or timeout.", nil, nil)
	descAbandoned = prometheus.NewDesc("kvgate_policy_abandoned_calls", "Policy calls past their deadline still running.", nil, nil)
	descAbandTot  = prometheus.NewDesc("kvgate_policy_abandoned_calls_total", "Policy calls given up at their deadline while still running.", nil, nil)
	descOverrun   = prometheus.NewDesc("kvgate_policy_abandoned_overrun_seconds_total", "Time abandoned policy calls ran past their deadline.", nil, nil)
)

type collector struct{ h *Host }

// Describe implements prometheus.Collector.
func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCalls, descFallbacks, descSwaps, descReplaced, descAbandoned, descAbandTot, descOverrun} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	h := c.h
	ch <- prometheus.MustNewConstMetric(descCalls, prometheus.CounterValue, float64(h.calls.Load()))
	for r := ReasonTrap; r < numReasons; r++ {
		ch <- prometheus.MustNewConstMetric(descFallbacks, prometheus.CounterValue, float64(h.fallbacks[r].Load()), r.String())
	}
	ch <- prometheus.MustNewConstMetric(descSwaps, prometheus.CounterValue, float64(h.swaps.Load()))
	ch <- prometheus.MustNewConstMetric(descReplaced, prometheus.CounterValue, float64(h.replaced.Load()))
	ch <- prometheus.MustNewConstMetric(descAbandoned, prometheus.GaugeValue, float64(h.abandoned.Load()))
	ch <- prometheus.MustNewConstMetric(descAbandTot, prometheus.CounterValue, float64(h.abandonedN.Load()))
	ch <- prometheus.MustNewConstMetric(descOverrun, prometheus.CounterValue, time.Duration(h.abandonedNano.Load()).Seconds())
}

// RegisterMetrics registers the host's metrics (kvgate_policy_*) with reg.
func (h *Host) RegisterMetrics(reg prometheus.Registerer) error { return reg.Register(collector{h}) }
