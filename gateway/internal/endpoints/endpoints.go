// Package endpoints keeps the live state of every configured endpoint: health (GET /health answered 200)
// and engine load read from its Prometheus /metrics (queued and running requests, KV-cache utilization),
// refreshed every scrape interval (default 250 ms) by one goroutine per endpoint.
//
// Metric names read (summed over label sets): vLLM vllm:num_requests_waiting, vllm:num_requests_running,
// vllm:kv_cache_usage_perc (older: vllm:gpu_cache_usage_perc), all fractions in [0,1]; SGLang
// sglang:num_queue_reqs, sglang:num_running_reqs, sglang:token_usage. The simulator uses vLLM's names (SGLang's
// with --api sglang). vLLM labels each engine core's series engine="<index>" (its data-parallel rank;
// vllm/v1/metrics/loggers.py): those are also kept per engine (Metrics.Engines), so a data-parallel
// endpoint's ranks are routed on their own load (Load.Rank).
package endpoints

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Endpoint is one engine replica as configured.
type Endpoint struct {
	ID     string // endpoint ID from config (unique across models)
	Model  string // served model name
	Engine string // config.EngineSim, EngineVLLM or EngineSGLang
	URL    string // engine base URL, e.g. "http://127.0.0.1:8001"
	// DataParallelSize is the engine's data-parallel ranks (0 or 1: one); its metrics sum them.
	DataParallelSize int
}

// Load is an endpoint's last observed state.
type Load struct {
	// Healthy is true after the last /health probe answered 200 and no forward failed to connect since.
	Healthy bool
	// Waiting and Running are the engine's queued and running requests.
	Waiting, Running float64
	// KVCacheUsage is the engine's KV-cache utilization, a fraction in [0,1].
	KVCacheUsage float64
	// StartTime is the engine's process_start_time_seconds (Unix seconds) as last scraped; 0 when its
	// metrics have none. A change means the engine restarted.
	StartTime float64
	// Engines are the load figures per engine core as last scraped (Metrics.Engines; nil when the metrics
	// carry no engine label). Use Rank for a data-parallel rank's load.
	Engines []EngineLoad
	// Scraped is when the metrics were last read successfully (zero: never).
	Scraped time.Time
	// Err is the last probe or scrape error ("" when fine).
	Err string
	// Ejected says the endpoint is out of routing after consecutive failures until EjectedUntil (Healthy
	// is then false); see Set.Eject.
	Ejected      bool
	EjectedUntil time.Time
}

// Rank returns the load of data-parallel rank r of an endpoint with n ranks: the figures of the series
// labelled engine="<r>" when the scrape had the running and waiting series of every rank 0..n-1 (vLLM),
// else an even split (waiting and running / n, KV-cache usage as the endpoint's). n ≤ 1 returns l. The
// result's Engines is nil.
func (l Load) Rank(r, n int) Load {
	if n <= 1 {
		return l
	}
	out := l
	out.Engines = nil
	if r >= 0 && r < n && len(l.Engines) >= n {
		all := true
		for _, e := range l.Engines[:n] {
			all = all && e.HasRunning && e.HasWaiting
		}
		if all {
			e := l.Engines[r]
			out.Waiting, out.Running = e.Waiting, e.Running
			if e.HasKVCacheUsage {
				out.KVCacheUsage = e.KVCacheUsage
			}
			return out
		}
	}
	out.Waiting, out.Running = l.Waiting/float64(n), l.Running/float64(n)
	return out
}

// EngineLoad is one engine core's load: its series labelled engine="<index>" (vLLM's engine index, the
// data-parallel rank). The Has fields say which series the page had.
type EngineLoad struct {
	Waiting, Running, KVCacheUsage          float64
	HasWaiting, HasRunning, HasKVCacheUsage bool
}

// maxEngines bounds the engine label values kept per endpoint (vLLM's data-parallel size is at most 64 in
// config here; a larger index is summed but not kept).
const maxEngines = 1024

// Metrics is what ParseMetrics reads from a Prometheus text exposition.
type Metrics struct {
	// Waiting and Running are the engine's queued and running requests (summed over data-parallel ranks);
	// KVCacheUsage is its KV-cache utilization, a fraction in [0,1] (the mean over engine cores when the
	// series carry an engine label, else the sum of the series, at most 1).
	Waiting, Running, KVCacheUsage float64
	// Engines holds the same figures per engine core, by engine="<index>" label (index 0..1023; nil when
	// no load series has the label). An index without series has a zero EngineLoad.
	Engines []EngineLoad
	// StartTime is process_start_time_seconds (Unix seconds; 0 when absent): the engine process's start,
	// which changes when it restarts.
	StartTime float64
	// Found counts the recognised samples (0: the page had none of the names above).
	Found int
}

// ParseMetrics reads the load metrics from a Prometheus text exposition (format 0.0.4). Unknown lines,
// comments and malformed samples are skipped; it never fails.
func ParseMetrics(page []byte) Metrics {
	var m Metrics
	sc := bufio.NewScanner(bytes.NewReader(page))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		end := bytes.IndexAny(line, "{ ")
		if end <= 0 {
			continue
		}
		name := string(line[:end])
		var dst *float64
		kind := 0 // 1 waiting, 2 running, 3 KV-cache usage
		switch name {
		case "vllm:num_requests_waiting", "sglang:num_queue_reqs":
			dst, kind = &m.Waiting, 1
		case "vllm:num_requests_running", "sglang:num_running_reqs":
			dst, kind = &m.Running, 2
		case "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage":
			dst, kind = &m.KVCacheUsage, 3
		case "process_start_time_seconds":
			dst = &m.StartTime
			if m.StartTime != 0 {
				continue // one process, one value: keep the first
			}
		default:
			continue
		}
		rest := line[end:]
		engine := -1
		if rest[0] == '{' {
			close := labelsEnd(rest)
			if close < 0 {
				continue
			}
			if ev, ok := labelValue(rest[1:close], "engine"); ok {
				if n, err := strconv.Atoi(ev); err == nil && n >= 0 && n < maxEngines {
					engine = n
				}
			}
			rest = rest[close+1:]
		}
		fields := strings.Fields(string(rest))
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil || v != v || v < 0 { // NaN and negatives are not loads
			continue
		}
		*dst += v
		m.Found++
		if engine >= 0 && kind != 0 {
			for len(m.Engines) <= engine {
				m.Engines = append(m.Engines, EngineLoad{})
			}
			e := &m.Engines[engine]
			switch kind {
			case 1:
				e.Waiting += v
				e.HasWaiting = true
			case 2:
				e.Running += v
				e.HasRunning = true
			case 3:
				e.KVCacheUsage = min(e.KVCacheUsage+v, 1)
				e.HasKVCacheUsage = true
			}
		}
	}
	// KV-cache usage is a fraction per engine core: the endpoint's is their mean, not their sum.
	var usage float64
	n := 0
	for _, e := range m.Engines {
		if e.HasKVCacheUsage {
			usage += e.KVCacheUsage
			n++
		}
	}
	if n > 1 {
		m.KVCacheUsage = usage / float64(n)
	}
	if m.KVCacheUsage > 1 {
		m.KVCacheUsage = 1
	}
	return m
}

// labelValue returns the unescaped value of label name in a label set's inside (`a="x",b="y"`), honouring
// quoted values; false when the set has no such label or is malformed.
func labelValue(set []byte, name string) (string, bool) {
	for i := 0; i < len(set); {
		for i < len(set) && (set[i] == ',' || set[i] == ' ') {
			i++
		}
		eq := bytes.IndexByte(set[i:], '=')
		if eq < 0 {
			return "", false
		}
		key := strings.TrimSpace(string(set[i : i+eq]))
		i += eq + 1
		if i >= len(set) || set[i] != '"' {
			return "", false
		}
		i++
		var val []byte
		for ; i < len(set) && set[i] != '"'; i++ {
			if set[i] == '\\' && i+1 < len(set) {
				i++
				switch set[i] {
				case 'n':
					val = append(val, '\n')
					continue
				}
			}
			val = append(val, set[i])
		}
		if i >= len(set) {
			return "", false
		}
		i++ // the closing quote
		if key == name {
			return string(val), true
		}
	}
	return "", false
}

// labelsEnd returns the index of the '}' closing the label set at s[0], honouring quoted values.
func labelsEnd(s []byte) int {
	inQ := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case inQ && c == '\\':
			i++
		case c == '"':
			inQ = !inQ
		case !inQ && c == '}':
			return i
		}
	}
	return -1
}

type state struct {
	ep   Endpoint
	mu   sync.RWMutex
	load Load
	// ejectedUntil is the end of an outlier ejection, Unix nanoseconds (0: none); outlier.go.
	ejectedUntil atomic.Int64
	// stop ends the endpoint's probe loop (nil until Run starts it).
	stop context.CancelFunc
}

// view is one immutable membership of a Set (replaced whole by Add and Remove).
type view struct {
	list []*state
	byID map[string]*state
}

// Set is the live state of all endpoints; endpoints may be added and removed at run time (Add, Remove).
// Safe for concurrent use.
type Set struct {
	v        atomic.Pointer[view]
	hc       *http.Client
	interval time.Duration
	log      *slog.Logger
	scrapes  atomic.Int64
	onScrape atomic.Pointer[func(id string, l Load)]

	mu     sync.Mutex      // serializes Add, Remove and Run's start
	runCtx context.Context // Run's context (nil before Run): loops of added endpoints run under it
	loops  sync.WaitGroup
}

// OnScrape sets f to be called, from the probing goroutine, with the endpoint's Load after every
// successful metrics scrape: a caller can tell a restarted engine at once from Load.StartTime (kvevents
// Ingester.NoteInstance) and see the engine's own in-flight count (the router's store-down caps). Safe to
// call at any time; nil removes it.
func (s *Set) OnScrape(f func(id string, l Load)) {
	if f == nil {
		s.onScrape.Store(nil)
		return
	}
	s.onScrape.Store(&f)
}

func (s *Set) lookup(id string) (*state, bool) {
	st, ok := s.v.Load().byID[id]
	return st, ok
}

// StartTime scrapes endpoint id's /metrics now and returns its process_start_time_seconds (0 when absent).
func (s *Set) StartTime(ctx context.Context, id string) (float64, error) {
	st, ok := s.lookup(id)
	if !ok {
		return 0, nil
	}
	page, err := s.get(ctx, strings.TrimRight(st.ep.URL, "/")+"/metrics")
	if err != nil {
		return 0, err
	}
	return ParseMetrics(page).StartTime, nil
}

// NewSet returns a Set for eps that probes with hc every interval once Run is called.
func NewSet(eps []Endpoint, hc *http.Client, interval time.Duration, log *slog.Logger) *Set {
	s := &Set{hc: hc, interval: interval, log: log}
	v := &view{byID: map[string]*state{}}
	for _, e := range eps {
		st := &state{ep: e}
		v.list = append(v.list, st)
		v.byID[e.ID] = st
	}
	s.v.Store(v)
	return s
}

// Add adds endpoint e (unhealthy until its first probe, which starts at once when Run is running) and
// returns true; an endpoint with e's ID already in the set is left as it is (false): Remove it first to
// replace it.
func (s *Set) Add(e Endpoint) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.v.Load()
	if _, ok := old.byID[e.ID]; ok {
		return false
	}
	st := &state{ep: e}
	nv := &view{list: append(slices.Clone(old.list), st), byID: make(map[string]*state, len(old.byID)+1)}
	for k, v := range old.byID {
		nv.byID[k] = v
	}
	nv.byID[e.ID] = st
	s.v.Store(nv)
	if s.runCtx != nil {
		s.startLoop(st, true)
	}
	return true
}

// Remove takes endpoint id out of the set and stops its probes; it reports whether id was in the set.
// Load answers the zero Load (unhealthy) for it from now on.
func (s *Set) Remove(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.v.Load()
	st, ok := old.byID[id]
	if !ok {
		return false
	}
	nv := &view{byID: make(map[string]*state, len(old.byID))}
	for _, x := range old.list {
		if x != st {
			nv.list = append(nv.list, x)
			nv.byID[x.ep.ID] = x
		}
	}
	s.v.Store(nv)
	if st.stop != nil {
		st.stop()
	}
	return true
}

// Endpoints returns the endpoints in the order they were configured or added.
func (s *Set) Endpoints() []Endpoint {
	v := s.v.Load()
	out := make([]Endpoint, len(v.list))
	for i, st := range v.list {
		out[i] = st.ep
	}
	return out
}

// Get returns the endpoint with id.
func (s *Set) Get(id string) (Endpoint, bool) {
	st, ok := s.lookup(id)
	if !ok {
		return Endpoint{}, false
	}
	return st.ep, true
}

// Load returns id's last observed state (zero Load, unhealthy, for an unknown id).
func (s *Set) Load(id string) Load {
	st, ok := s.lookup(id)
	if !ok {
		return Load{}
	}
	st.mu.RLock()
	l := st.load
	st.mu.RUnlock()
	st.applyEjection(&l)
	return l
}

// MarkDown records that a forward to id failed to connect: it counts as unhealthy until the next good probe.
func (s *Set) MarkDown(id string, reason string) {
	if st, ok := s.lookup(id); ok {
		st.mu.Lock()
		st.load.Healthy, st.load.Err = false, reason
		st.mu.Unlock()
	}
}

// ProbeAll probes every endpoint once, concurrently, and returns when all answered or ctx ended.
func (s *Set) ProbeAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, st := range s.v.Load().list {
		wg.Go(func() { s.probe(ctx, st) })
	}
	wg.Wait()
}

// Probe probes endpoint id once (health and metrics) and returns its Load.
func (s *Set) Probe(ctx context.Context, id string) Load {
	if st, ok := s.lookup(id); ok {
		s.probe(ctx, st)
	}
	return s.Load(id)
}

// Run probes every endpoint each interval until ctx ends, endpoints added meanwhile too (their first
// probe at once).
func (s *Set) Run(ctx context.Context) {
	s.mu.Lock()
	s.runCtx = ctx
	for _, st := range s.v.Load().list {
		s.startLoop(st, false)
	}
	s.mu.Unlock()
	<-ctx.Done()
	s.loops.Wait()
}

// startLoop starts st's probe loop under s.runCtx (caller holds s.mu).
func (s *Set) startLoop(st *state, now bool) {
	ctx, cancel := context.WithCancel(s.runCtx)
	st.stop = cancel
	s.loops.Go(func() {
		defer cancel()
		if now {
			s.probe(ctx, st)
		}
		t := time.NewTicker(s.interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.probe(ctx, st)
			}
		}
	})
}

func (s *Set) get(ctx context.Context, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, max(s.interval*4, time.Second))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &statusError{resp.StatusCode}
	}
	return b, nil
}

type statusError struct{ code int }

// Error reports the unexpected status.
func (e *statusError) Error() string { return "status " + strconv.Itoa(e.code) }

func (s *Set) probe(ctx context.Context, st *state) {
	base := strings.TrimRight(st.ep.URL, "/")
	_, herr := s.get(ctx, base+"/health")
	var page []byte
	var merr error
	if herr == nil {
		page, merr = s.get(ctx, base+"/metrics")
	}
	if ctx.Err() != nil {
		return
	}
	s.scrapes.Add(1)
	var after func()
	defer func() {
		if after != nil {
			after() // outside st.mu
		}
	}()
	st.mu.Lock()
	defer st.mu.Unlock()
	was := st.load.Healthy
	st.load.Healthy = herr == nil
	st.load.Err = ""
	switch {
	case herr != nil:
		st.load.Err = "health: " + herr.Error()
	case merr != nil:
		st.load.Err = "metrics: " + merr.Error()
	default:
		m := ParseMetrics(page)
		st.load.Waiting, st.load.Running, st.load.KVCacheUsage = m.Waiting, m.Running, m.KVCacheUsage
		st.load.Engines = m.Engines
		st.load.StartTime = m.StartTime
		st.load.Scraped = time.Now()
		if f := s.onScrape.Load(); f != nil {
			id, l := st.ep.ID, st.load
			after = func() { (*f)(id, l) }
		}
	}
	if was != st.load.Healthy && s.log != nil {
		s.log.LogAttrs(ctx, slog.LevelInfo, "endpoint health changed", slog.String("endpoint_id", st.ep.ID),
			slog.Bool("healthy", st.load.Healthy), slog.String("error", st.load.Err))
	}
}
