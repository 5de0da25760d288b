package sim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Engine is one running simulated vLLM engine: an HTTP server, a scheduler loop over a paged KV cache, and
// optionally a KV-event publisher. Methods are safe for concurrent use.
type Engine struct {
	cfg    Config
	log    *slog.Logger
	model  textModel
	vocab  outputVocab
	hasher blockHasher
	m      *metrics
	faults faultState
	pub    *publisher // nil when events are off
	dm     dialectMetrics

	tokenizedN atomic.Int64           // enginesim:prompts_tokenized_total
	lastChat   atomic.Pointer[[]byte] // the last chat request body (LastChatBody)

	ln  net.Listener
	srv *http.Server

	mu      sync.Mutex
	cond    *sync.Cond
	closed  bool
	cache   *kvCache
	waiting []*request
	running []*request
	vclock  time.Duration // simulated model time, advanced by each step
	// The step being slept, so that a request arriving mid-step gets the model time it arrived at.
	inStep    bool
	stepStart time.Time
	stepDur   time.Duration
	peak      int // most requests ever running at once
	peakIn    int // most requests ever in the engine (running + waiting) at once
	loopDone  chan struct{}
	stop      chan struct{}

	// Data-parallel ranks (Config.DataParallelSize ≥ 2, see dp.go): the front engine serves HTTP and holds
	// ranks; each rank is an Engine without HTTP (parent set) with its own scheduler, KV cache and publisher.
	parent *Engine
	rank   int
	ranks  []*Engine
	rg     rankGauges // a rank's counts for the front engine's gauges and its balancer
}

// Start builds and starts an engine: HTTP on cfg.Host:cfg.Port (0 = free port), the scheduler, and the
// KV-event publisher when cfg.KVEvents enables it. ctx bounds only the start-up; call Close to stop. Errors:
// *ConfigError for invalid configuration, wrapped listen errors.
func Start(ctx context.Context, cfg Config) (*Engine, error) {
	return StartWithLogger(ctx, cfg, slog.New(slog.DiscardHandler))
}

// StartWithLogger is Start with a logger for lifecycle and fault messages.
func StartWithLogger(ctx context.Context, cfg Config, log *slog.Logger) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	model, err := loadTextModel(cfg.Model, log)
	if err != nil {
		return nil, err
	}
	hasher, err := newBlockHasher(cfg.HashSeed)
	if err != nil {
		return nil, err
	}
	e := &Engine{
		cfg:      cfg,
		log:      log,
		model:    model,
		vocab:    newOutputVocab(model),
		hasher:   hasher,
		m:        newMetrics(cfg.servedNames()[0], cfg.API),
		cache:    newKVCache(cfg.BlockSize, cfg.NumGPUBlocks, cfg.NumCPUBlocks, cfg.CPUEventsSelfDescribing),
		loopDone: make(chan struct{}),
		stop:     make(chan struct{}),
	}
	e.cond = sync.NewCond(&e.mu)
	e.m.startTime.Set(float64(time.Now().UnixNano()) / 1e9)
	e.dm = newDialectMetrics(e.m, cfg.servedNames()[0])
	e.faults.set(cfg.Faults)
	for r := range max(cfg.DataParallelSize, 1) {
		e.m.loadGauges(r) // every engine core's load series exists from the start, at 0 (as vLLM's)
	}
	if cfg.DataParallelSize >= 2 {
		if err := e.startRanks(); err != nil {
			return nil, err
		}
	} else if cfg.eventsEnabled() {
		if e.pub, err = newPublisher(&e.cfg, log); err != nil {
			return nil, err
		}
	}
	var lc net.ListenConfig
	e.ln, err = lc.Listen(ctx, "tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)))
	if err != nil {
		if e.pub != nil {
			e.pub.close()
		}
		e.closeRanks()
		return nil, fmt.Errorf("sim: listen: %w", err)
	}
	e.srv = &http.Server{Handler: e.routes(), ReadHeaderTimeout: 10 * time.Second}
	go e.srv.Serve(e.ln)
	go e.loop()
	log.Info("enginesim started", slog.String("http", e.HTTPAddr()), slog.String("events", e.EventsAddr()),
		slog.String("replay", e.ReplayAddr()), slog.String("tokenizer", model.Kind()))
	return e, nil
}

// HTTPAddr returns the HTTP listen address as host:port (e.g. "127.0.0.1:43117"; an unspecified host is
// reported as 127.0.0.1).
func (e *Engine) HTTPAddr() string {
	a := e.ln.Addr().(*net.TCPAddr)
	host := a.IP.String()
	if a.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, strconv.Itoa(a.Port))
}

// EventsAddr returns the KV-event PUB address a subscriber dials ("tcp://127.0.0.1:5557"), the configured
// endpoint when the publisher connects instead of binding, or "" when events are off.
func (e *Engine) EventsAddr() string {
	if e.ranks != nil {
		return e.ranks[0].EventsAddr()
	}
	if e.pub == nil {
		return ""
	}
	if !zmqBinds(e.cfg.KVEvents.Endpoint) {
		return e.cfg.KVEvents.Endpoint
	}
	return e.pub.eventsAddr()
}

// ReplayAddr returns the replay ROUTER address a DEALER dials, or "" when replay is off.
func (e *Engine) ReplayAddr() string {
	if e.ranks != nil {
		return e.ranks[0].ReplayAddr()
	}
	if e.pub == nil {
		return ""
	}
	return e.pub.replayAddr()
}

// EventSubscriptions returns the topic prefixes that connected KV-event subscribers have subscribed to
// ("" = everything), sorted, without duplicates; nil when events are off. ZMQ drops what a PUB socket sends
// before a subscription arrives, so callers that must see every batch wait until theirs is listed.
func (e *Engine) EventSubscriptions() []string {
	if e.ranks != nil {
		return e.rankSubscriptions() // the topics every rank's subscribers have
	}
	if e.pub == nil {
		return nil
	}
	return e.pub.topics()
}

// ModelName returns the first served model name (the metrics' model_name label).
func (e *Engine) ModelName() string { return e.cfg.servedNames()[0] }

// Close stops the HTTP server (open connections are closed), the scheduler and the publisher. In-flight
// requests end without a finish reason. Closing twice returns ErrClosed.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	e.closed = true
	close(e.stop)
	e.cond.Broadcast()
	e.mu.Unlock()
	err := e.srv.Close()
	if rerr := e.closeRanks(); err == nil {
		err = rerr
	}
	<-e.loopDone
	e.mu.Lock()
	for _, r := range append(e.waiting, e.running...) {
		r.finish("", ErrClosed)
	}
	e.waiting, e.running = nil, nil
	e.mu.Unlock()
	if e.pub != nil {
		if perr := e.pub.close(); err == nil {
			err = perr
		}
	}
	return err
}

// request is one prompt being served.
type request struct {
	id        string
	prompt    []uint32
	hashes    []digest // full blocks of seq: the prompt's, then output blocks as they fill
	salt      string
	seq       []uint32 // prompt then generated tokens (engine-owned)
	lora      string
	maxTokens int
	outStart  int

	// Engine-owned (under Engine.mu).
	blocks       seqBlocks
	computed     int // prompt tokens whose KV exists (cached or computed)
	reloadTokens int // CPU-tier hit tokens still to copy back (costed in the first step)
	generatedN   int
	arrivalV     time.Duration
	admittedV    time.Duration
	lastTokenV   time.Duration
	cancelled    atomic.Bool
	eng          *Engine // the engine (or data-parallel rank) it was submitted to

	// Shared with the HTTP handler (under mu); notify gets a value after each change.
	mu     sync.Mutex
	notify chan struct{}
	out    []uint32
	done   bool
	reason string   // finish reason ("length") when done
	final  []uint32 // the last token, emitted by finish together with done
	err    error
	stats  requestStats
}

// requestStats is what a finished request reports.
type requestStats struct {
	// CachedTokens are prompt tokens served from the prefix cache (GPU and CPU tier).
	CachedTokens int
	// CPUCachedTokens are the part of CachedTokens reloaded from the CPU tier.
	CPUCachedTokens int
	// TTFT, QueueTime and E2E are in simulated model time.
	TTFT, QueueTime, E2E time.Duration
}

// emit hands generated tokens to the handler.
func (r *request) emit(ids ...uint32) {
	r.mu.Lock()
	r.out = append(r.out, ids...)
	r.mu.Unlock()
	r.wake()
}

func (r *request) finish(reason string, err error) {
	r.mu.Lock()
	if !r.done {
		if r.eng != nil {
			r.eng.rg.held.Add(-1)
		}
		r.out = append(r.out, r.final...)
		r.done, r.reason, r.err = true, reason, err
	}
	r.mu.Unlock()
	r.wake()
}

func (r *request) wake() {
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// snapshot returns the tokens generated so far from index from, and whether the request is done.
func (r *request) snapshot(from int) (ids []uint32, done bool, reason string, err error, st requestStats) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out[from:], r.done, r.reason, r.err, r.stats
}

func newRequestID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// submit queues a prompt; the request's tokens arrive through notify. Errors: *RequestError when the
// request cannot fit the model or the KV cache, ErrClosed.
func (e *Engine) submit(prompt []uint32, lora, salt string, maxTokens int, notify chan struct{}) (*request, error) {
	if len(prompt) == 0 {
		return nil, badRequest("the prompt must contain at least one token")
	}
	// Compared without adding the two: a client's max_tokens may be near MaxInt. The message is vLLM's
	// (OpenAIServing._validate_input); the sum it shows is exact in uint64.
	if maxTokens > e.cfg.MaxModelLen-len(prompt) {
		return nil, badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			e.cfg.MaxModelLen, uint64(len(prompt))+uint64(maxTokens), len(prompt), maxTokens)
	}
	total := e.blocksFor(len(prompt) + maxTokens)
	if total > e.cfg.NumGPUBlocks {
		return nil, badRequest("the request needs %d KV blocks but the engine has %d", total, e.cfg.NumGPUBlocks)
	}
	r := &request{id: newRequestID(), prompt: prompt, lora: lora, salt: salt, maxTokens: maxTokens, notify: notify, eng: e}
	r.seq = slices.Clip(prompt)
	r.hashes = e.hasher.blockHashes(prompt, e.cfg.BlockSize, lora, salt)
	r.outStart = e.vocab.start(prompt)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrClosed
	}
	r.arrivalV = e.now()
	e.waiting = append(e.waiting, r)
	e.rg.held.Add(1)
	if n := len(e.waiting) + len(e.running); n > e.peakIn {
		e.peakIn = n
		e.setPeaks()
	}
	e.updateGauges()
	e.cond.Signal()
	return r, nil
}

// now returns the current simulated model time: the clock at the last step's end, plus the part of the
// running step already slept (wall time / TimeScale, at most the step's duration).
func (e *Engine) now() time.Duration {
	if !e.inStep || e.cfg.TimeScale == 0 {
		return e.vclock
	}
	return e.vclock + min(e.stepDur, time.Duration(float64(time.Since(e.stepStart))/e.cfg.TimeScale))
}

// cancel stops a request whose client went away; the scheduler drops it at its next step.
func (e *Engine) cancel(r *request) {
	if r.eng != nil && r.eng != e {
		r.eng.cancel(r)
		return
	}
	if r.cancelled.CompareAndSwap(false, true) {
		e.mu.Lock()
		e.cond.Signal()
		e.mu.Unlock()
	}
}

// blocksFor returns ceil(tokens / block size) without overflowing near MaxInt.
func (e *Engine) blocksFor(tokens int) int {
	n := tokens / e.cfg.BlockSize
	if tokens%e.cfg.BlockSize != 0 {
		n++
	}
	return n
}

// stepWork is one request's share of a scheduler step.
type stepWork struct {
	r       *request
	prefill int // prompt tokens computed this step (0 for a decode)
	reload  int // CPU-tier tokens copied back this step
}

// loop is the scheduler: each step admits waiting requests (FCFS, up to MaxNumSeqs, while the KV cache has
// room), spends the token budget on one decode token per running request and prefill chunks, sleeps the
// step's simulated duration × TimeScale, then hands out tokens and publishes the step's KV events.
func (e *Engine) loop() {
	defer close(e.loopDone)
	e.mu.Lock()
	defer e.mu.Unlock()
	for {
		for !e.closed && len(e.waiting) == 0 && len(e.running) == 0 {
			e.cond.Wait()
		}
		if e.closed {
			return
		}
		e.dropCancelled()
		e.admit()
		work, dur := e.plan()
		e.updateGauges()
		if len(work) == 0 {
			if len(e.running) == 0 && len(e.waiting) > 0 {
				// Nothing running and the queue head does not fit: cannot happen, since submit rejects
				// requests larger than the cache; wait for a change rather than spin.
				e.cond.Wait()
			}
			continue
		}
		e.inStep, e.stepStart, e.stepDur = true, time.Now(), dur
		e.mu.Unlock()
		if d := time.Duration(float64(dur) * e.cfg.TimeScale); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-e.stop:
				t.Stop()
			}
		}
		e.mu.Lock()
		if e.closed {
			return
		}
		e.inStep = false
		e.vclock += dur
		e.apply(work)
		e.flushEvents()
		e.updateGauges()
	}
}

// dropCancelled removes cancelled requests from both queues, freeing their blocks.
func (e *Engine) dropCancelled() {
	keep := e.waiting[:0]
	for _, r := range e.waiting {
		if r.cancelled.Load() {
			e.countCancelled(r)
			continue
		}
		keep = append(keep, r)
	}
	clear(e.waiting[len(keep):])
	e.waiting = keep
	run := e.running[:0]
	for _, r := range e.running {
		if r.cancelled.Load() {
			e.cache.release(r.blocks)
			r.blocks = nil
			e.countCancelled(r)
			continue
		}
		run = append(run, r)
	}
	clear(e.running[len(run):])
	e.running = run
}

func (e *Engine) countCancelled(r *request) {
	e.m.cancelled.Inc()
	e.m.requests.WithLabelValues("cancelled").Inc()
	r.finish("", errCancelled)
}

// admit moves waiting requests into the running batch in FCFS order while there is a slot and KV room.
func (e *Engine) admit() {
	for len(e.waiting) > 0 && len(e.running) < e.cfg.MaxNumSeqs {
		r := e.waiting[0]
		var run []tier
		if e.cfg.EnablePrefixCaching {
			// vLLM always computes the last prompt token, so at most (n-1)/B blocks can hit.
			run = e.cache.match(r.hashes, (len(r.prompt)-1)/e.cfg.BlockSize)
		}
		blocks, ok := e.cache.allocate(run, e.blocksFor(len(r.prompt)+r.maxTokens), r.hashes, r.lora)
		if !ok {
			return
		}
		e.waiting = e.waiting[1:]
		r.blocks = blocks
		cpuBlocks := 0
		for _, t := range run {
			if t == tierCPU {
				cpuBlocks++
			}
		}
		B := e.cfg.BlockSize
		r.computed = len(run) * B
		r.reloadTokens = cpuBlocks * B
		r.admittedV = e.vclock
		r.mu.Lock()
		r.stats.CachedTokens = len(run) * B
		r.stats.CPUCachedTokens = cpuBlocks * B
		r.stats.QueueTime = r.admittedV - r.arrivalV
		r.mu.Unlock()
		e.running = append(e.running, r)
		if len(e.running) > e.peak {
			e.peak = len(e.running)
			e.setPeaks()
		}
		n := float64(len(r.prompt))
		gpuHit := float64((len(run) - cpuBlocks) * B)
		e.m.prefixQueries.Add(n)
		e.m.prefixHits.Add(gpuHit)
		if e.cfg.NumCPUBlocks > 0 {
			e.m.externalQueries.Add(n - gpuHit)
			e.m.externalHits.Add(float64(cpuBlocks * B))
		}
		e.m.queueTime.Observe(r.stats.QueueTime.Seconds())
		if cpuBlocks > 0 {
			bytes := float64(cpuBlocks * B * e.cfg.KVBytesPerToken)
			e.m.offloadBytes.WithLabelValues("CPU_to_GPU").Add(bytes)
			e.m.offloadTime.WithLabelValues("CPU_to_GPU").Add((time.Duration(r.reloadTokens) * e.cfg.CPUReloadPerToken).Seconds())
		}
	}
}

// plan spends one step's token budget: a decode token for each request past prefill, then prefill chunks
// in admission order. It returns the work and the step's simulated duration.
func (e *Engine) plan() ([]stepWork, time.Duration) {
	budget := e.cfg.MaxNumBatchedTokens
	var work []stepWork
	for _, r := range e.running {
		if r.computed == len(r.prompt) && budget > 0 {
			work = append(work, stepWork{r: r})
			budget--
		}
	}
	for _, r := range e.running {
		if r.computed < len(r.prompt) && budget > 0 {
			n := min(len(r.prompt)-r.computed, budget)
			budget -= n
			work = append(work, stepWork{r: r, prefill: n, reload: r.reloadTokens})
		}
	}
	dur := e.cfg.StepOverhead + time.Duration(len(work))*e.cfg.DecodePerSeq
	for _, w := range work {
		dur += time.Duration(w.prefill)*e.cfg.PrefillPerToken + time.Duration(w.reload)*e.cfg.CPUReloadPerToken
	}
	return work, dur
}

// apply books a finished step: computed prompt blocks enter the prefix cache, finished prefills emit their
// first token, decodes their next one, and requests reaching max_tokens finish.
func (e *Engine) apply(work []stepWork) {
	B := e.cfg.BlockSize
	var finished []*request
	for _, w := range work {
		r := w.r
		if r.cancelled.Load() {
			continue // dropped at the next step
		}
		if w.prefill > 0 {
			from := r.computed / B
			r.computed += w.prefill
			r.reloadTokens = 0
			if e.cfg.EnablePrefixCaching {
				e.cache.commit(r.blocks, r.hashes, r.prompt, r.lora, from, r.computed/B)
			}
			e.m.promptTokens.Add(float64(w.prefill))
			if r.computed < len(r.prompt) {
				continue
			}
			r.mu.Lock()
			r.stats.TTFT = e.vclock - r.arrivalV
			r.mu.Unlock()
			e.m.ttft.Observe(r.stats.TTFT.Seconds())
		} else {
			e.m.itl.Observe((e.vclock - r.lastTokenV).Seconds())
		}
		r.lastTokenV = e.vclock
		tok := e.vocab.token(r.outStart, r.generatedN)
		r.generatedN++
		r.seq = append(r.seq, tok)
		e.cacheOutputBlock(r)
		e.m.generationToks.Inc()
		if r.generatedN >= r.maxTokens {
			// The last token becomes visible together with the finish reason (finish), as vLLM sends
			// them in one chunk: emitted alone, a reader could stream it without finish_reason.
			r.final = append(r.final[:0], tok)
			finished = append(finished, r)
		} else {
			r.emit(tok)
		}
	}
	for _, r := range finished {
		e.cache.release(r.blocks)
		r.blocks = nil
		for i, x := range e.running {
			if x == r {
				e.running = append(e.running[:i], e.running[i+1:]...)
				break
			}
		}
		r.mu.Lock()
		r.stats.E2E = e.vclock - r.arrivalV
		r.mu.Unlock()
		e.m.e2e.Observe(r.stats.E2E.Seconds())
		e.m.requests.WithLabelValues("finished").Inc()
		r.finish("length", nil)
	}
}

// cacheOutputBlock caches the block that the last step's decode completed, as vLLM caches blocks full of
// generated tokens (a follow-up turn that re-sends the answer then hits them). A token's KV exists once it
// has been fed back, so after g generated tokens the sequence has prompt+g-1 computed tokens.
func (e *Engine) cacheOutputBlock(r *request) {
	B := e.cfg.BlockSize
	computed := len(r.prompt) + r.generatedN - 1
	if !e.cfg.EnablePrefixCaching || computed%B != 0 || computed/B <= len(r.hashes) {
		return
	}
	i := computed/B - 1 // the block just completed
	if i != len(r.hashes) || i >= len(r.blocks) {
		return
	}
	r.hashes = append(r.hashes, e.hasher.next(r.hashes, r.seq[i*B:(i+1)*B], r.lora, r.salt))
	e.cache.commit(r.blocks, r.hashes, r.seq, r.lora, i, i+1)
}

func (e *Engine) updateGauges() {
	if e.parent != nil {
		e.rg.store(len(e.running), len(e.waiting), e.usage())
		if !e.m.perEngine {
			e.parent.sumRankGauges()
			return
		}
	}
	run, wait, usage := e.m.loadGauges(e.rank)
	run.Set(float64(len(e.running)))
	wait.Set(float64(len(e.waiting)))
	usage.Set(e.usage())
}

// usage is the KV-cache usage vLLM would report: GPU blocks holding computed tokens of running requests,
// as a fraction of capacity. The simulator reserves a request's output blocks at admission (see
// RATIONALE.md); blocks reserved but not yet written are not counted, as vLLM allocates them as it goes.
func (e *Engine) usage() float64 {
	unfilled := 0
	for _, r := range e.running {
		unfilled += len(r.blocks) - min(len(r.blocks), e.blocksFor(r.computed+r.generatedN))
	}
	return float64(e.cache.pinned-unfilled) / float64(e.cfg.NumGPUBlocks)
}

// flushEvents publishes the pending cache events as one batch (vLLM publishes once per scheduler step when
// there are events) and books offload transfers.
func (e *Engine) flushEvents() {
	if n := e.cache.offloadedBlocks; n > 0 {
		bytes := float64(n) * float64(e.cfg.BlockSize*e.cfg.KVBytesPerToken)
		e.m.offloadBytes.WithLabelValues("GPU_to_CPU").Add(bytes)
		e.m.offloadTime.WithLabelValues("GPU_to_CPU").Add((time.Duration(int(n)*e.cfg.BlockSize) * e.cfg.CPUReloadPerToken).Seconds())
		e.cache.offloadedBlocks = 0
	}
	events := e.cache.takeEvents()
	if len(events) == 0 || e.pub == nil {
		return
	}
	drop := e.root().faults.takeEventDrop()
	if drop {
		e.log.Info("fault: dropping a kv event batch")
		e.m.faults.WithLabelValues("drop_event_batch").Inc()
		e.m.eventBatchesDropped.Inc()
	}
	e.m.eventBatches.Inc()
	if _, err := e.pub.publish(events, drop); err != nil {
		e.log.Warn("kv event publish failed", slog.String("error", err.Error()))
	}
}

// ResetPrefixCache drops every cached block (vLLM's POST /reset_prefix_cache) and publishes
// AllBlocksCleared.
func (e *Engine) ResetPrefixCache() error {
	for _, rk := range e.ranks {
		if err := rk.ResetPrefixCache(); err != nil {
			return err
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
	}
	e.cache.reset()
	e.flushEvents()
	return nil
}

// SetFaults replaces the armed faults. RestartEventSeq acts at once: the KV cache is emptied without
// events and the event sequence and replay buffer start over at 0, as after an engine restart.
func (e *Engine) SetFaults(f Faults) error {
	if err := f.validate(); err != nil {
		return err
	}
	restart := f.RestartEventSeq
	f.RestartEventSeq = false
	e.faults.set(f)
	if !restart {
		return nil
	}
	for _, rk := range e.ranks {
		if err := rk.restartEvents(); err != nil {
			return err
		}
	}
	if err := e.restartEvents(); err != nil {
		return err
	}
	e.m.faults.WithLabelValues("restart_event_seq").Inc()
	e.m.startTime.Set(float64(time.Now().UnixNano()) / 1e9)
	e.log.Info("fault: restarted the kv event sequence and emptied the cache")
	return nil
}

// restartEvents empties the cache without events and starts the event sequence over (SetFaults).
func (e *Engine) restartEvents() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
	}
	e.cache.reset()
	e.cache.takeEvents()
	if e.pub != nil {
		e.pub.restart()
	}
	return nil
}

// Faults returns the faults still armed.
func (e *Engine) Faults() Faults { return e.faults.get() }

// Stats is a snapshot of the engine's scheduler and cache.
type Stats struct {
	// Running and Waiting are the current batch and queue sizes; PeakRunning the largest batch so far;
	// PeakInFlight the most requests held at once (running + waiting: what a gateway sent concurrently).
	Running, Waiting, PeakRunning, PeakInFlight int
	// GPUCachedBlocks and CPUCachedBlocks are the blocks in each tier's prefix cache.
	GPUCachedBlocks, CPUCachedBlocks int
	// KVCacheUsage is vllm:kv_cache_usage_perc: the fraction of GPU blocks written by running requests,
	// in [0,1].
	KVCacheUsage float64
	// ModelTime is the simulated time elapsed in scheduler steps.
	ModelTime time.Duration
}

// Stats returns a snapshot of the engine's state; with data-parallel ranks, their sums (peaks, usage and
// model time: the largest rank's).
func (e *Engine) Stats() Stats {
	if e.ranks != nil {
		return sumStats(e.RankStats())
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	g, c := e.cache.cachedBlocks()
	return Stats{Running: len(e.running), Waiting: len(e.waiting), PeakRunning: e.peak, PeakInFlight: e.peakIn, GPUCachedBlocks: g,
		CPUCachedBlocks: c, KVCacheUsage: e.usage(), ModelTime: e.vclock}
}
