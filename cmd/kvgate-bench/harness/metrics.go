package harness

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is one line of a Prometheus text exposition: metric name, labels and value.
type Sample struct {
	Name   string            // metric name, e.g. "vllm:num_requests_running"
	Labels map[string]string // label values, unquoted
	Value  float64           // sample value ("NaN", "+Inf" and "-Inf" are parsed)
}

// Samples is a parsed exposition.
type Samples []Sample

// Sum adds the values of every sample named name whose labels include all of match (label=value pairs).
// A name with no sample sums to 0.
func (s Samples) Sum(name string, match ...string) float64 {
	var t float64
	for _, x := range s {
		if x.Name != name || !x.has(match) {
			continue
		}
		t += x.Value
	}
	return t
}

// Has reports whether any sample is named name.
func (s Samples) Has(name string) bool {
	for _, x := range s {
		if x.Name == name {
			return true
		}
	}
	return false
}

func (x Sample) has(match []string) bool {
	for i := 0; i+1 < len(match); i += 2 {
		if x.Labels[match[i]] != match[i+1] {
			return false
		}
	}
	return true
}

// ParseMetrics reads a Prometheus text exposition (format 0.0.4) with prometheus/common's own parser and
// flattens it into samples as they appear on the page: counters, gauges and untyped metrics by their name,
// histograms as name_bucket{le}, name_sum and name_count, summaries as name{quantile}, name_sum and
// name_count. A malformed page is an error.
func ParseMetrics(r io.Reader) (Samples, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("harness: metrics: %w", err)
	}
	var out Samples
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			labels := make(map[string]string, len(m.GetLabel())+1)
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			with := func(k, v string) map[string]string {
				c := maps.Clone(labels)
				c[k] = v
				return c
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out = append(out, Sample{Name: name, Labels: labels, Value: m.GetCounter().GetValue()})
			case dto.MetricType_GAUGE:
				out = append(out, Sample{Name: name, Labels: labels, Value: m.GetGauge().GetValue()})
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					le := strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)
					out = append(out, Sample{Name: name + "_bucket", Labels: with("le", le), Value: float64(b.GetCumulativeCount())})
				}
				out = append(out, Sample{Name: name + "_sum", Labels: labels, Value: h.GetSampleSum()},
					Sample{Name: name + "_count", Labels: labels, Value: float64(h.GetSampleCount())})
			case dto.MetricType_SUMMARY:
				sm := m.GetSummary()
				for _, q := range sm.GetQuantile() {
					qs := strconv.FormatFloat(q.GetQuantile(), 'g', -1, 64)
					out = append(out, Sample{Name: name, Labels: with("quantile", qs), Value: q.GetValue()})
				}
				out = append(out, Sample{Name: name + "_sum", Labels: labels, Value: sm.GetSampleSum()},
					Sample{Name: name + "_count", Labels: labels, Value: float64(sm.GetSampleCount())})
			default:
				out = append(out, Sample{Name: name, Labels: labels, Value: m.GetUntyped().GetValue()})
			}
		}
	}
	return out, nil
}

// ScrapeMetrics GETs url and parses the exposition.
func ScrapeMetrics(ctx context.Context, url string) (Samples, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("harness: scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("harness: scrape %s: status %d", url, resp.StatusCode)
	}
	return ParseMetrics(resp.Body)
}

// OracleCachedTokens is what one infinite prefix cache would serve for prompts (token IDs) arriving in the
// given order: for each prompt, its longest common prefix with any earlier prompt, cut to whole blocks of
// blockSize tokens. No router can do better on the same order; it is the ceiling of routing quality.
func OracleCachedTokens(prompts [][]uint32, blockSize int) int64 {
	var total int64
	for i, p := range prompts {
		best := 0
		for _, q := range prompts[:i] {
			n := 0
			for n < len(p) && n < len(q) && p[n] == q[n] {
				n++
			}
			best = max(best, n)
		}
		total += int64(best / blockSize * blockSize)
	}
	return total
}
