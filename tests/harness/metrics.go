package harness

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
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

// ParseMetrics reads a Prometheus text exposition (format 0.0.4): comments and blank lines are skipped,
// label values are unquoted (\\, \", \n escapes). A malformed sample line is an error naming the line.
func ParseMetrics(r io.Reader) (Samples, error) {
	var out Samples
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("harness: metrics line %d: %w", n, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

func parseSample(line string) (Sample, error) {
	s := Sample{Labels: map[string]string{}}
	i := strings.IndexAny(line, "{ \t")
	if i <= 0 {
		return s, fmt.Errorf("no value in %q", line)
	}
	s.Name = line[:i]
	rest := line[i:]
	if rest[0] == '{' {
		rest = rest[1:]
		for {
			rest = strings.TrimLeft(rest, " ,")
			if rest == "" {
				return s, fmt.Errorf("unterminated labels in %q", line)
			}
			if rest[0] == '}' {
				rest = rest[1:]
				break
			}
			eq := strings.IndexByte(rest, '=')
			if eq <= 0 || eq+1 >= len(rest) || rest[eq+1] != '"' {
				return s, fmt.Errorf("bad label in %q", line)
			}
			key := strings.TrimSpace(rest[:eq])
			rest = rest[eq+2:]
			var val strings.Builder
			closed := false
			for j := 0; j < len(rest); j++ {
				c := rest[j]
				if c == '\\' && j+1 < len(rest) {
					j++
					switch rest[j] {
					case 'n':
						val.WriteByte('\n')
					default:
						val.WriteByte(rest[j])
					}
					continue
				}
				if c == '"' {
					rest = rest[j+1:]
					closed = true
					break
				}
				val.WriteByte(c)
			}
			if !closed {
				return s, fmt.Errorf("unterminated label value in %q", line)
			}
			s.Labels[key] = val.String()
		}
	}
	f := strings.Fields(rest)
	if len(f) < 1 {
		return s, fmt.Errorf("no value in %q", line)
	}
	v, err := parseValue(f[0])
	if err != nil {
		return s, fmt.Errorf("value in %q: %w", line, err)
	}
	s.Value = v
	return s, nil
}

func parseValue(s string) (float64, error) {
	switch s {
	case "+Inf":
		return math.Inf(1), nil
	case "-Inf":
		return math.Inf(-1), nil
	case "NaN":
		return math.NaN(), nil
	}
	return strconv.ParseFloat(s, 64)
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
