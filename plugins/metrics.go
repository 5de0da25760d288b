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
	Refills          uint64            // fuel refills of uploaded (metered) calls; each is a deadline check
	Interrupted      uint64            // uploaded calls stopped at a refill after their deadline
	Overrun          time.Duration     // total time interrupted calls ran past their deadline
	Unloaded         uint64            // versions unloaded
}

// Stats returns a snapshot of the counters.
func (h *Host) Stats() Stats {
	s := Stats{Calls: h.calls.Load(), Fallbacks: map[string]uint64{}, Swaps: h.swaps.Load(),
		ReplacedInstance: h.replaced.Load(), Refills: h.refills.Load(), Interrupted: h.interrupted.Load(),
		Overrun: time.Duration(h.overrunNano.Load()), Unloaded: h.unloaded.Load()}
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
	descRefills   = prometheus.NewDesc("kvgate_policy_fuel_refills_total", "Fuel refills of uploaded (metered) policy calls; each one checks the call's deadline.", nil, nil)
	descInterr    = prometheus.NewDesc("kvgate_policy_interrupted_calls_total", "Uploaded policy calls stopped after their deadline.", nil, nil)
	descOverrun   = prometheus.NewDesc("kvgate_policy_overrun_seconds_total", "Time interrupted policy calls ran past their deadline before they were stopped.", nil, nil)
	descUnloaded  = prometheus.NewDesc("kvgate_policy_unloaded_total", "Policy versions unloaded.", nil, nil)
)

type collector struct{ h *Host }

// Describe implements prometheus.Collector.
func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCalls, descFallbacks, descSwaps, descReplaced, descRefills, descInterr, descOverrun, descUnloaded} {
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
	ch <- prometheus.MustNewConstMetric(descRefills, prometheus.CounterValue, float64(h.refills.Load()))
	ch <- prometheus.MustNewConstMetric(descInterr, prometheus.CounterValue, float64(h.interrupted.Load()))
	ch <- prometheus.MustNewConstMetric(descOverrun, prometheus.CounterValue, time.Duration(h.overrunNano.Load()).Seconds())
	ch <- prometheus.MustNewConstMetric(descUnloaded, prometheus.CounterValue, float64(h.unloaded.Load()))
}

// RegisterMetrics registers the host's metrics (kvgate_policy_*) with reg.
func (h *Host) RegisterMetrics(reg prometheus.Registerer) error { return reg.Register(collector{h}) }
