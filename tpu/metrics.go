package tpu

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the allocator's Prometheus metrics. Counters count this process's calls; the chip gauges are
// read from the store at scrape time (so every gateway on one Redis reports the fleet's truth):
//
//	kvgate_tpu_chips{pool,generation}            chips registered
//	kvgate_tpu_chips_leased{pool,generation}     chips held by live leases
//	kvgate_tpu_chips_unhealthy{pool,generation}  chips on unhealthy hosts
//	kvgate_tpu_leases_granted_total{pool,kind}   kind: slice | subslice
//	kvgate_tpu_leases_refused_total{pool,reason} reason: a refusal code (no_capacity, invalid_shape, ...)
//	kvgate_tpu_leases_expired_total{pool}        leases this process's calls reaped after their TTL
type Metrics struct {
	Granted, Refused, Expired *prometheus.CounterVec
	a                         *Allocator
}

var (
	descChips     = prometheus.NewDesc("kvgate_tpu_chips", "TPU chips registered.", []string{"pool", "generation"}, nil)
	descLeased    = prometheus.NewDesc("kvgate_tpu_chips_leased", "TPU chips held by live leases.", []string{"pool", "generation"}, nil)
	descUnhealthy = prometheus.NewDesc("kvgate_tpu_chips_unhealthy", "TPU chips on hosts marked unhealthy.", []string{"pool", "generation"}, nil)
)

// NewMetrics returns unregistered metrics.
func NewMetrics() *Metrics {
	return &Metrics{
		Granted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_tpu_leases_granted_total", Help: "TPU leases granted."}, []string{"pool", "kind"}),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_tpu_leases_refused_total", Help: "TPU lease requests refused, by reason."}, []string{"pool", "reason"}),
		Expired: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_tpu_leases_expired_total", Help: "TPU leases reaped after their TTL."}, []string{"pool"}),
	}
}

func (m *Metrics) granted(pool, kind string) { m.Granted.WithLabelValues(pool, kind).Inc() }

func (m *Metrics) refused(pool string, err error) {
	if c := Code(err); c != "" {
		m.Refused.WithLabelValues(pool, c).Inc()
	}
}

func (m *Metrics) expired(pool string, n int) {
	if n > 0 {
		m.Expired.WithLabelValues(pool).Add(float64(n))
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- descChips
	ch <- descLeased
	ch <- descUnhealthy
	m.Granted.Describe(ch)
	m.Refused.Describe(ch)
	m.Expired.Describe(ch)
}

// Collect implements prometheus.Collector (one List per pool, 2 s at most in all).
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.Granted.Collect(ch)
	m.Refused.Collect(ch)
	m.Expired.Collect(ch)
	if m.a == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	pools, err := m.a.Pools(ctx)
	if err != nil {
		return
	}
	for _, pool := range pools {
		info, err := m.a.List(ctx, pool)
		if err != nil {
			continue
		}
		type agg struct{ total, leased, bad int }
		by := map[string]*agg{}
		for _, s := range info.Slices {
			a := by[s.Generation]
			if a == nil {
				a = &agg{}
				by[s.Generation] = a
			}
			a.total += s.ChipCount
			a.leased += s.LeasedChips
			a.bad += s.UnhealthyChips
		}
		for gen, a := range by {
			ch <- prometheus.MustNewConstMetric(descChips, prometheus.GaugeValue, float64(a.total), pool, gen)
			ch <- prometheus.MustNewConstMetric(descLeased, prometheus.GaugeValue, float64(a.leased), pool, gen)
			ch <- prometheus.MustNewConstMetric(descUnhealthy, prometheus.GaugeValue, float64(a.bad), pool, gen)
		}
	}
}
