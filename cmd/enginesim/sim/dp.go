package sim

import (
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// DataParallelRankHeader is the request header vLLM's OpenAI server reads to pin a request to one
// data-parallel rank (X-data-parallel-rank: <r>).
const DataParallelRankHeader = "X-data-parallel-rank"

// rankGauges are one rank's counts, read without its lock by the front engine (gauges, balancer).
type rankGauges struct {
	held    atomic.Int64  // requests submitted and not finished (the balancer's load)
	running atomic.Int64  // running batch at the last change
	waiting atomic.Int64  // queue at the last change
	usage   atomic.Uint64 // math.Float64bits of the KV-cache usage
	peak    atomic.Int64  // most requests running at once
	peakIn  atomic.Int64  // most requests held at once
}

func (g *rankGauges) store(running, waiting int, usage float64) {
	g.running.Store(int64(running))
	g.waiting.Store(int64(waiting))
	g.usage.Store(math.Float64bits(usage))
}

// root returns the front engine (itself without data-parallel ranks).
func (e *Engine) root() *Engine {
	if e.parent != nil {
		return e.parent
	}
	return e
}

// setPeaks publishes the peak gauges: an engine's own, or (a rank) the largest rank's.
func (e *Engine) setPeaks() {
	if e.parent == nil {
		e.m.peakRunning.Set(float64(e.peak))
		e.m.peakInFlight.Set(float64(e.peakIn))
		return
	}
	e.rg.peak.Store(int64(e.peak))
	e.rg.peakIn.Store(int64(e.peakIn))
	var p, pi int64
	for _, rk := range e.parent.ranks {
		p, pi = max(p, rk.rg.peak.Load()), max(pi, rk.rg.peakIn.Load())
	}
	e.m.peakRunning.Set(float64(p))
	e.m.peakInFlight.Set(float64(pi))
}

// sumRankGauges sets the front engine's running and waiting gauges to the ranks' sums and the KV-cache
// usage to their mean: SGLang's names have one series per metric (vLLM's are labelled per engine, each
// rank setting its own: updateGauges).
func (e *Engine) sumRankGauges() {
	var run, wait int64
	var usage float64
	for _, rk := range e.ranks {
		if rk == nil {
			continue // still starting
		}
		run += rk.rg.running.Load()
		wait += rk.rg.waiting.Load()
		usage += math.Float64frombits(rk.rg.usage.Load())
	}
	rg, wg, ug := e.m.loadGauges(0)
	rg.Set(float64(run))
	wg.Set(float64(wait))
	ug.Set(usage / float64(len(e.ranks)))
}

// pickRank returns the engine that serves an HTTP request: e without data-parallel ranks; else the rank
// its X-data-parallel-rank header names (a *RequestError for a value that is not a rank), or the rank
// holding the fewest requests (lowest rank on ties), as vLLM's internal load balancer picks.
func (e *Engine) pickRank(header string) (*Engine, error) {
	if e.ranks == nil {
		return e, nil
	}
	if header = strings.TrimSpace(header); header != "" {
		r, err := strconv.Atoi(header)
		if err != nil || r < 0 || r >= len(e.ranks) {
			return nil, badRequest("%s %q is not a data-parallel rank (0..%d)", DataParallelRankHeader, header, len(e.ranks)-1)
		}
		return e.ranks[r], nil
	}
	best := e.ranks[0]
	for _, rk := range e.ranks[1:] {
		if rk.rg.held.Load() < best.rg.held.Load() {
			best = rk
		}
	}
	return best, nil
}

// startRanks starts cfg.DataParallelSize ranks behind e: each its own scheduler, KV cache and (events on)
// publisher at the configured event and replay ports + rank. Port 0 picks free ports for rank 0 and tries
// again (up to 20 times) until the ports above it are free too.
func (e *Engine) startRanks() error {
	var err error
	for range 20 {
		if err = e.tryRanks(); err == nil {
			return nil
		}
		e.closeRanks()
		if !e.cfg.eventsEnabled() || !errors.Is(err, errRankPort) {
			return err
		}
	}
	return err
}

var errRankPort = errors.New("sim: a data-parallel rank's port is in use")

func (e *Engine) tryRanks() error {
	n := e.cfg.DataParallelSize
	e.ranks = make([]*Engine, n)
	var evPort, rpPort int
	for r := range n {
		rc := e.cfg
		rc.DataParallelSize = 0
		if r > 0 && e.cfg.eventsEnabled() {
			rc.KVEvents.Endpoint = withPort(rc.KVEvents.Endpoint, evPort+r)
			if rc.KVEvents.ReplayEndpoint != "" {
				rc.KVEvents.ReplayEndpoint = withPort(rc.KVEvents.ReplayEndpoint, rpPort+r)
			}
		}
		rk := &Engine{cfg: rc, log: e.log.With("dp_rank", r), model: e.model, vocab: e.vocab, hasher: e.hasher, m: e.m,
			cache:    newKVCache(rc.BlockSize, rc.NumGPUBlocks, rc.NumCPUBlocks, rc.CPUEventsSelfDescribing),
			loopDone: make(chan struct{}), stop: make(chan struct{}), parent: e, rank: r}
		rk.cond = sync.NewCond(&rk.mu)
		if rc.eventsEnabled() {
			pub, err := newPublisher(&rk.cfg, rk.log)
			if err != nil {
				if r > 0 {
					return fmt.Errorf("%w: rank %d: %w", errRankPort, r, err)
				}
				return err
			}
			pub.rank = r
			rk.pub = pub
			if r == 0 {
				evPort, rpPort = addrPort(rk.EventsAddr()), addrPort(rk.ReplayAddr())
			}
		}
		e.ranks[r] = rk
		go rk.loop()
	}
	return nil
}

// closeRanks stops every started rank (scheduler, requests, publisher); nil without ranks.
func (e *Engine) closeRanks() error {
	var err error
	for _, rk := range e.ranks {
		if rk == nil {
			continue
		}
		rk.mu.Lock()
		if rk.closed {
			rk.mu.Unlock()
			continue
		}
		rk.closed = true
		close(rk.stop)
		rk.cond.Broadcast()
		rk.mu.Unlock()
		<-rk.loopDone
		rk.mu.Lock()
		for _, q := range append(rk.waiting, rk.running...) {
			q.finish("", ErrClosed)
		}
		rk.waiting, rk.running = nil, nil
		rk.mu.Unlock()
		if rk.pub != nil {
			if perr := rk.pub.close(); err == nil {
				err = perr
			}
		}
	}
	return err
}

// withPort replaces the port of a tcp://host:port address.
func withPort(addr string, port int) string {
	rest, ok := strings.CutPrefix(addr, "tcp://")
	if !ok {
		return addr
	}
	host, _, err := net.SplitHostPort(rest)
	if err != nil {
		return addr
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port))
}

// addrPort returns the port of a tcp://host:port address (0 when there is none).
func addrPort(addr string) int {
	_, p, err := net.SplitHostPort(strings.TrimPrefix(addr, "tcp://"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(p)
	return n
}

// RankStats returns each data-parallel rank's Stats (nil without ranks).
func (e *Engine) RankStats() []Stats {
	if e.ranks == nil {
		return nil
	}
	out := make([]Stats, len(e.ranks))
	for i, rk := range e.ranks {
		out[i] = rk.Stats()
	}
	return out
}

// RankAddrs returns each data-parallel rank's KV-event and replay addresses (nil without ranks).
func (e *Engine) RankAddrs() (events, replay []string) {
	for _, rk := range e.ranks {
		events, replay = append(events, rk.EventsAddr()), append(replay, rk.ReplayAddr())
	}
	return events, replay
}

func sumStats(rs []Stats) Stats {
	var s Stats
	for _, r := range rs {
		s.Running += r.Running
		s.Waiting += r.Waiting
		s.PeakRunning = max(s.PeakRunning, r.PeakRunning)
		s.PeakInFlight = max(s.PeakInFlight, r.PeakInFlight)
		s.GPUCachedBlocks += r.GPUCachedBlocks
		s.CPUCachedBlocks += r.CPUCachedBlocks
		s.KVCacheUsage += r.KVCacheUsage / float64(len(rs))
		s.ModelTime = max(s.ModelTime, r.ModelTime)
	}
	return s
}

// rankSubscriptions returns the topic prefixes subscribed to on every rank's publisher, sorted.
func (e *Engine) rankSubscriptions() []string {
	var out []string
	for i, rk := range e.ranks {
		ts := rk.EventSubscriptions()
		if i == 0 {
			out = ts
			continue
		}
		out = slices.DeleteFunc(out, func(t string) bool { return !slices.Contains(ts, t) })
	}
	return out
}
