package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/kvstore"
)

// IngesterConfig configures one endpoint's Ingester.
type IngesterConfig struct {
	// Endpoint is the engine replica whose events these are (required).
	Endpoint kvstore.EndpointID
	// Model is the model name entries are stored under in Index (required).
	Model string
	// EventsAddr is the engine's ZMQ PUB endpoint to connect to, e.g. "tcp://10.0.0.7:5557" (required).
	EventsAddr string
	// ReplayAddr is the engine's replay ROUTER endpoint ("tcp://10.0.0.7:5558"); "" = no replay: a sequence
	// gap then drops the endpoint's entries.
	ReplayAddr string
	// Topic is the ZMQ subscription prefix; "" receives every topic.
	Topic string
	// BlockSize is the model's configured block size in tokens (required, ≥ 1). BlockStored events with
	// another non-zero block size are a configuration error: counted, reported once, not applied.
	BlockSize int
	// Hasher computes kvgate's block keys from each BlockStored's token IDs (config block_key_seed).
	Hasher kvstore.Hasher
	// LoRAByID names LoRA adapters by vLLM's numeric lora_id, for engines whose events carry no lora_name.
	LoRAByID map[int]string
	// Index receives the endpoint's confirmed entries (required): each batch's adds and removals in one
	// Index.Apply call (one pipelined round trip on Redis); ClearConfirmed when the endpoint's picture must
	// be rebuilt. Speculative entries (Index.Record) are never touched. Pass a fenced view
	// (kvstore.Fencer.Fenced with the ingestion lease's token) so a stale ingester's writes are refused:
	// on kvstore.ErrFenced the Ingester stops (Stats.Fenced). Any other failed write resyncs the endpoint
	// (Stats.Resyncs).
	Index kvstore.Index
	// Logger gets lifecycle and error reports; nil = slog.Default().
	Logger *slog.Logger
	// BackoffMin and BackoffMax bound the exponential reconnect backoff; 0 = 100 ms and 5 s.
	BackoffMin, BackoffMax time.Duration
	// ReplayTimeout bounds one replay exchange, plus ReplayTimeoutPerBatch for every batch the replay is
	// expected to bring (the backlog between the requested sequence number and the one that triggered it),
	// at most 2 minutes in all; 0 = 2 s.
	ReplayTimeout time.Duration
	// ReplayTimeoutPerBatch is the replay time allowed per expected batch; 0 = 5 ms (a 10,000-batch
	// catch-up, vLLM's default buffer, gets 52 s).
	ReplayTimeoutPerBatch time.Duration
	// UnconfirmedTTL is how long entries the Ingester can no longer vouch for stay in the index (demoted to
	// unconfirmed holds, kvstore.Demoter) unless the engine's events confirm them again: those an earlier
	// ingester wrote (a takeover, or this gateway restarted) when the engine's replay buffer does not reach
	// back to seq 0, and those from before a sequence gap that replay could not cover. 0 = 5 minutes.
	// With an index that is not a kvstore.Demoter, such entries are cleared instead.
	UnconfirmedTTL time.Duration
	// Instance, if set, returns the engine's instance identity (e.g. its process start time from its
	// metrics); it is called after every (re)connect, before that connection's first message is applied.
	// A value that differs from the last one seen (see Ingester.NoteInstance) means the engine restarted.
	// An error or "" means unknown and changes nothing.
	Instance func(ctx context.Context) (string, error)
	// DataParallelSize, when ≥ 2, says the engine runs that many data-parallel ranks, each publishing on its
	// own port as vLLM does (EventsAddr's and ReplayAddr's TCP port + rank): the Ingester subscribes to all
	// of them and keeps, per rank (the batch's data_parallel_rank; none = rank 0), its own sequence, replay,
	// engine-hash map and index entries, under RankEndpoint(Endpoint, rank). 0 or 1: one engine.
	DataParallelSize int
	// KVCacheGroup is the KV-cache group whose events are indexed (vLLM's group_idx, hybrid models: one group
	// per attention type, each with its own block hashes for the same tokens). Events of other groups are
	// counted in Stats.OtherGroupEvents and ignored; events without group_idx always apply. Default 0.
	KVCacheGroup int
	// RemovedMemory is how many engine hashes whose last tier removed them stay resolvable (0 = 4096), so a
	// token-less placeholder that follows the removal (vLLM appends the offload connector's events after the
	// KV manager's in the same batch) still finds its block key.
	RemovedMemory int
	// MaxHashes bounds the engine-hash map (engine block hash → block key, one per block the engine holds,
	// plus RemovedMemory recently removed ones), per endpoint and per data-parallel rank; 0 =
	// DefaultMaxHashes. It should sit well above what the engine can hold (its GPU + CPU blocks): an engine
	// that announces its removals never reaches it. Beyond it the least recently used hashes are evicted
	// (CLOCK; a hash is used when it or a child is stored) and their blocks removed from the index in the same
	// batch (Stats.HashEvictions); a later BlockRemoved of an evicted hash is counted in UnknownRemoved, a
	// later child of one in Orphans. Memory: 43 to 85 bytes per hash (32-byte slots, load ≤ 3/4, doubling).
	MaxHashes int
	// Now is the clock for Stats.Lag; nil = time.Now.
	Now func() time.Time
}

// DefaultMaxHashes is IngesterConfig.MaxHashes when unset: 1 Mi engine hashes, at most 64 MiB per endpoint
// (a 2 Mi-slot table), several times the blocks of a large engine's GPU and CPU caches.
const DefaultMaxHashes = 1 << 20

// Stats are one Ingester's counters, as of the call to Stats. Counters only grow (across reconnects).
type Stats struct {
	// Endpoint is IngesterConfig.Endpoint.
	Endpoint kvstore.EndpointID
	// Connected says whether the SUB socket is connected.
	Connected bool
	// Reconnects counts connections after the first.
	Reconnects uint64
	// Batches and Events count applied batches and events (replayed ones included); Blocks counts blocks
	// added to the index (per tier transition).
	Batches, Events, Blocks uint64
	// Gaps counts sequence gaps; Replays successful replays that closed one; ReplayFailures replays that
	// failed or did not reach back far enough (the endpoint was then cleared).
	Gaps, Replays, ReplayFailures uint64
	// CatchUps counts replays from seq 0 on connecting to a publisher already past seq 0 (with a replay
	// address): the buffered history is applied before live messages.
	CatchUps uint64
	// Restarts counts engine restarts: seq back to 0 or otherwise backwards, or a new engine instance
	// (IngesterConfig.Instance, NoteInstance).
	Restarts uint64
	// Demotions counts the times the endpoint's confirmed entries were demoted to unconfirmed ones
	// (kvstore.Demoter): a first message whose history the replay buffer does not cover, or a gap the replay
	// could not close.
	Demotions uint64
	// UnconfirmedUntil is when the last demotion's unconfirmed entries age out (zero: none pending).
	UnconfirmedUntil time.Time
	// BadTimestamps counts batches whose timestamp is not a finite time within 10 years of the receive
	// time (Lag is not updated from them).
	BadTimestamps uint64
	// CorruptReplays counts undecodable batches fetched again through replay (RecoveredBatches of them
	// then decoded).
	CorruptReplays, RecoveredBatches uint64
	// Clears counts Index.ClearConfirmed calls (the first message, AllBlocksCleared, restarts, unrepaired
	// gaps).
	Clears uint64
	// Duplicates counts messages already applied through replay.
	Duplicates uint64
	// BadFrames counts ZMQ messages that are not [topic, seq(8 bytes), payload].
	BadFrames uint64
	// DecodeErrors counts payloads Decode rejected (skipped); SkippedEvents events with unknown tags.
	DecodeErrors, SkippedEvents uint64
	// BlockSizeErrors counts BlockStored events whose block size differs from the configured one (not applied).
	BlockSizeErrors uint64
	// BadEvents counts BlockStored events whose token count is not len(block_hashes) × block_size.
	BadEvents uint64
	// Orphans counts BlockStored events whose parent hash is unknown (not applied: the chain cannot be keyed).
	Orphans uint64
	// Unresolved counts hashes of token-less (placeholder) BlockStored events that map to no known block;
	// UnknownRemoved hashes of BlockRemoved that do; UnknownMedium events with a medium other than GPU/CPU.
	Unresolved, UnknownRemoved, UnknownMedium uint64
	// OtherGroupEvents counts events of KV-cache groups other than IngesterConfig.KVCacheGroup (ignored).
	OtherGroupEvents uint64
	// KeyConflicts counts engine hashes announced again with token IDs that give a different block key.
	KeyConflicts uint64
	// IndexErrors counts failed Index calls (refused ones included).
	IndexErrors uint64
	// Resyncs counts repairs of the endpoint's entries after a failed index write (Index.Apply, a clear or
	// a demotion): the failed and later updates are sent again in order (or, after a failed clear or a
	// backlog past 64 Ki keys, rebuilt from the engine-hash map), first a second after the failure, then
	// retried with the reconnect backoff until it succeeds (RATIONALE.md, "Fenced ingestion").
	// ResyncPending is set from the failure until the rebuild succeeds.
	Resyncs       uint64
	ResyncPending bool
	// Fenced is set when the index refused a write with kvstore.ErrFenced (another ingester took the
	// endpoint's lease over): the Ingester has stopped applying events and its goroutine has ended.
	Fenced bool
	// HaveSeq says whether LastSeq is set; LastSeq is the last applied sequence number, published once that
	// batch's updates are in the index.
	HaveSeq bool
	LastSeq uint64
	// Lag is the receive time minus the batch timestamp of the last applied batch.
	Lag time.Duration
	// LastBatchAt is when the last batch was applied (IngesterConfig.Now); zero before the first.
	LastBatchAt time.Time
	// Resyncing is set while the endpoint's picture is known to be incomplete: after an unrepaired gap or a
	// demotion, until UnconfirmedUntil (then every entry from before is confirmed again or gone); cleared by
	// AllBlocksCleared or an engine restart (the picture is complete again).
	Resyncing bool
	// ConfigError is set when the engine's events disagree with the configuration (the latest problem), and
	// cleared by the next BlockStored that agrees with it.
	ConfigError string
	// MappedHashes is the number of engine hashes currently mapped to block keys (held ones plus up to
	// IngesterConfig.RemovedMemory recently removed ones), at most IngesterConfig.MaxHashes.
	MappedHashes int
	// HashEvictions counts engine hashes evicted from the map at IngesterConfig.MaxHashes (their blocks were
	// removed from the index with the batch that evicted them).
	HashEvictions uint64
}

// RankEndpoint names data-parallel rank r of endpoint ep in the index: "<ep>/dp<r>".
func RankEndpoint(ep kvstore.EndpointID, r int) kvstore.EndpointID {
	return kvstore.EndpointID(fmt.Sprintf("%s/dp%d", ep, r))
}

// offsetPort adds r to the TCP port of a "tcp://host:port" address (vLLM's offset_endpoint_port); "" stays "".
func offsetPort(addr string, r int) (string, error) {
	if addr == "" || r == 0 {
		return addr, nil
	}
	i := strings.LastIndexByte(addr, ':')
	port, err := strconv.Atoi(addr[i+1:])
	if i < 0 || err != nil || !strings.HasPrefix(addr, "tcp://") {
		return "", fmt.Errorf("%w: address %q: data-parallel ranks need tcp://host:port", ErrConfig, addr)
	}
	return addr[:i+1] + strconv.Itoa(port+r), nil
}

// ErrConfig is wrapped by the errors Start returns for an invalid IngesterConfig.
var ErrConfig = errors.New("kvevents: invalid ingester config")

// endSeq is the replay end marker (-1 as 8 bytes).
const endSeq = math.MaxUint64

// pendingOp is one queued Add (remove false) or Remove of keys on tier; consecutive events of the same
// kind and tier share one.
type pendingOp struct {
	tier   kvstore.Tier
	remove bool
	start  int
}

// Ingester applies one endpoint's KV events to an Index, in order. Start it once; Stats may be called
// concurrently from any goroutine.
type Ingester struct {
	cfg IngesterConfig
	log *slog.Logger

	// Owned by the run goroutine (or the caller of handle in tests and benchmarks).
	hashes      hashTable
	keyBuf      []kvstore.BlockKey
	evictGPU    []hashEntry // makeRoom scratch: evicted blocks held on GPU, on CPU
	evictCPU    []hashEntry
	arena       arena              // decode scratch, reused batch after batch
	ops         []pendingOp        // the current batch's index updates, in order
	opKeys      []kvstore.BlockKey // their keys, back to back (op i spans ops[i].start up to ops[i+1].start)
	opFams      []kvstore.Family   // the keys' families, beside opKeys
	updates     []kvstore.Update   // Apply scratch
	acc         pending            // counts of applied, uncommitted batches
	seqHave     bool               // a sequence number has been applied (published as Stats.HaveSeq at commit)
	seqLast     uint64             // the last applied one (Stats.LastSeq)
	grave       []EngineHash       // ring of hashes whose refs reached zero, forgotten when overwritten
	gravePos    int
	dupLo       uint64 // (dupLo, dupHi]: sequence numbers already applied through replay
	dupHi       uint64
	configNoted bool
	instance    string           // the engine instance last seen ("" unknown)
	unconfUntil time.Time        // demoted entries may exist until then
	replaying   bool             // inside replay (no nested replay for a corrupt batch)
	fenced      bool             // a write was refused with kvstore.ErrFenced: nothing more is written
	writeErr    error            // the failed index write a resync must repair (nil: none pending)
	resyncClear bool             // the failed write was a clear: the resync clears before adding
	resyncDem   bool             // a demotion failed: the resync demotes before replaying the backlog
	backlog     []kvstore.Update // updates not in the index since the failure, in order (copies)
	backlogKeys int
	overflow    bool      // the backlog outgrew maxBacklogKeys: the resync rebuilds from the map instead
	resyncAt    time.Time // next resync attempt
	resyncWait  time.Duration

	instCh chan string // NoteInstance → the run goroutine

	ranks []*Ingester // DataParallelSize ≥ 2: one (not started) Ingester per rank, fed by this one

	mu    sync.Mutex
	stats Stats

	cancel context.CancelFunc
	done   chan struct{}
}

// NewIngester validates cfg and returns an Ingester that is not yet connected.
func NewIngester(cfg IngesterConfig) (*Ingester, error) {
	switch {
	case cfg.Endpoint == "":
		return nil, fmt.Errorf("%w: no endpoint", ErrConfig)
	case cfg.Model == "":
		return nil, fmt.Errorf("%w: no model", ErrConfig)
	case cfg.BlockSize < 1:
		return nil, fmt.Errorf("%w: block size %d", ErrConfig, cfg.BlockSize)
	case cfg.Index == nil:
		return nil, fmt.Errorf("%w: no index", ErrConfig)
	}
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = 100 * time.Millisecond
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		cfg.BackoffMax = max(5*time.Second, cfg.BackoffMin)
	}
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = 2 * time.Second
	}
	if cfg.ReplayTimeoutPerBatch <= 0 {
		cfg.ReplayTimeoutPerBatch = 5 * time.Millisecond
	}
	if cfg.UnconfirmedTTL <= 0 {
		cfg.UnconfirmedTTL = 5 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.RemovedMemory <= 0 {
		cfg.RemovedMemory = 4096
	}
	if cfg.MaxHashes <= 0 {
		cfg.MaxHashes = DefaultMaxHashes
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	var ranks []*Ingester
	for r := range cfg.DataParallelSize {
		if cfg.DataParallelSize < 2 {
			break
		}
		if _, err := offsetPort(cfg.EventsAddr, r); err != nil {
			return nil, err
		}
		rc := cfg
		rc.Endpoint, rc.EventsAddr, rc.Instance, rc.DataParallelSize = RankEndpoint(cfg.Endpoint, r), "", nil, 0
		var err error
		if rc.ReplayAddr, err = offsetPort(cfg.ReplayAddr, r); err != nil {
			return nil, err
		}
		ri, err := NewIngester(rc)
		if err != nil {
			return nil, err
		}
		ranks = append(ranks, ri)
	}
	return &Ingester{
		ranks:  ranks,
		cfg:    cfg,
		log:    log.With(slog.String("endpoint_id", string(cfg.Endpoint)), slog.String("model", cfg.Model)),
		grave:  make([]EngineHash, 0, cfg.RemovedMemory),
		stats:  Stats{Endpoint: cfg.Endpoint},
		instCh: make(chan string, 1),
	}, nil
}

// Start connects to EventsAddr and applies events until ctx ends or Close is called, reconnecting with
// exponential backoff when the connection fails or drops. It returns at once; it fails only if EventsAddr is
// empty or Start was already called.
func (in *Ingester) Start(ctx context.Context) error {
	if in.cfg.EventsAddr == "" {
		return fmt.Errorf("%w: no events address", ErrConfig)
	}
	if in.done != nil {
		return fmt.Errorf("%w: already started", ErrConfig)
	}
	ctx, in.cancel = context.WithCancel(ctx)
	in.done = make(chan struct{})
	go in.run(ctx)
	return nil
}

// Close stops the Ingester and waits for it to finish. The index entries stay.
func (in *Ingester) Close() error {
	if in.cancel != nil {
		in.cancel()
		<-in.done
	}
	return nil
}

// Stats returns a copy of the current counters.
func (in *Ingester) Stats() Stats {
	in.mu.Lock()
	defer in.mu.Unlock()
	s := in.stats
	if !s.UnconfirmedUntil.IsZero() && in.cfg.Now().Before(s.UnconfirmedUntil) {
		s.Resyncing = true
	}
	return s
}

// RankStats returns each data-parallel rank's counters (Endpoint = RankEndpoint(Endpoint, rank),
// Connected = this Ingester's), or nil without DataParallelSize.
func (in *Ingester) RankStats() []Stats {
	if in.ranks == nil {
		return nil
	}
	conn := in.Stats().Connected
	out := make([]Stats, len(in.ranks))
	for i, r := range in.ranks {
		out[i] = r.Stats()
		out[i].Connected = conn
	}
	return out
}

// NoteInstance tells a started Ingester the engine's instance identity as its health or metrics show it
// (e.g. process_start_time_seconds). A value different from the last one seen means the engine restarted
// with an empty cache: the endpoint's entries (speculative ones too) are dropped as soon as the Ingester's goroutine sees the note
// (between two messages, or at once while disconnected), and the next message starts a new sequence. The
// first value only sets the identity. Safe from any goroutine; never blocks (a newer note replaces one not
// yet seen). "" is ignored.
func (in *Ingester) NoteInstance(id string) {
	if id == "" || in.instCh == nil {
		return
	}
	for {
		select {
		case in.instCh <- id:
			return
		default:
			select {
			case <-in.instCh:
			default:
			}
		}
	}
}

// instanceSeen applies an instance identity on the run goroutine: a change is an engine restart.
func (in *Ingester) instanceSeen(ctx context.Context, id string) {
	if id == "" || id == in.instance {
		return
	}
	for _, r := range in.ranks {
		r.instanceSeen(ctx, id) // every rank restarted with the engine
	}
	old := in.instance
	in.instance = id
	if old == "" {
		return
	}
	in.log.InfoContext(ctx, "kv events engine restarted (new instance)", slog.String("old", old), slog.String("new", id))
	in.bump(func(s *Stats) { s.Restarts++ })
	// Every entry goes, speculative ones too: they were recorded for requests routed to the old process.
	in.unconfUntil = in.cfg.Now().Add(time.Hour) // makes clear use ClearEndpoint
	in.clear(ctx, false)
	in.seqHave, in.seqLast = false, 0
	in.dupLo, in.dupHi = 0, 0
	in.bump(func(s *Stats) { s.HaveSeq, s.LastSeq = false, 0 })
}

func (in *Ingester) bump(f func(*Stats)) {
	in.mu.Lock()
	f(&in.stats)
	in.mu.Unlock()
}

func (in *Ingester) run(ctx context.Context) {
	defer close(in.done)
	backoff := in.cfg.BackoffMin
	first := true
	for ctx.Err() == nil {
		sub := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(time.Second))
		if err := in.dial(sub); err != nil {
			_ = sub.Close()
			in.log.DebugContext(ctx, "kv events dial failed", slog.String("addr", in.cfg.EventsAddr), slog.Any("error", err))
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			case id := <-in.instCh:
				in.instanceSeen(ctx, id)
			}
			backoff = min(2*backoff, in.cfg.BackoffMax)
			continue
		}
		if err := sub.SetOption(zmq4.OptionSubscribe, in.cfg.Topic); err != nil {
			_ = sub.Close()
			in.log.ErrorContext(ctx, "kv events subscribe failed", slog.Any("error", err))
			return
		}
		backoff = in.cfg.BackoffMin
		in.bump(func(s *Stats) {
			s.Connected = true
			if !first {
				s.Reconnects++
			}
		})
		first = false
		in.log.InfoContext(ctx, "kv events connected", slog.String("addr", in.cfg.EventsAddr))
		if in.cfg.Instance != nil {
			ictx, cancel := context.WithTimeout(ctx, time.Second)
			id, err := in.cfg.Instance(ictx)
			cancel()
			if err == nil {
				in.instanceSeen(ctx, id)
			}
		}
		if err := in.receive(ctx, sub.Recv); ctx.Err() == nil && !in.isFenced() {
			in.log.InfoContext(ctx, "kv events connection lost", slog.Any("error", err))
		}
		_ = sub.Close()
		in.bump(func(s *Stats) { s.Connected = false })
		if in.isFenced() {
			return // another ingester holds the endpoint; Stats.Fenced says so
		}
	}
}

// dial connects sub to EventsAddr, or to every data-parallel rank's publisher.
func (in *Ingester) dial(sub zmq4.Socket) error {
	if in.ranks == nil {
		return sub.Dial(in.cfg.EventsAddr)
	}
	for r := range in.ranks {
		addr, err := offsetPort(in.cfg.EventsAddr, r)
		if err == nil {
			err = sub.Dial(addr)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// errFenced ends receive once a write was fenced off.
var errFenced = errors.New("kvevents: ingestion fenced off")

// maxQueued is the most received messages applied with one commit (one index call).
const maxQueued = 64

// receive applies the messages recv returns until it fails, and returns that error. A goroutine receives
// while the previous messages are applied; the messages waiting when one is applied are applied with it
// and committed together (up to maxQueued), so an ingester that falls behind its engine catches up with
// fewer, larger index calls, while one that keeps up still commits every message on its own.
func (in *Ingester) receive(ctx context.Context, recv func() (zmq4.Msg, error)) error {
	msgs := make(chan zmq4.Msg, maxQueued)
	var rerr error
	go func() {
		defer close(msgs)
		for {
			msg, err := recv()
			if err != nil {
				rerr = err
				return
			}
			select {
			case msgs <- msg:
			case <-ctx.Done():
				rerr = ctx.Err()
				return
			}
		}
	}()
	for {
		if in.isFenced() {
			return errFenced
		}
		var msg zmq4.Msg
		var ok bool
		var retry <-chan time.Time
		if at, due := in.resyncDue(); due {
			retry = time.After(max(time.Millisecond, at.Sub(in.cfg.Now())))
		}
		select {
		case msg, ok = <-msgs:
		case id := <-in.instCh:
			in.instanceSeen(ctx, id)
			continue
		case <-retry:
			in.commit(ctx) // resyncs (the endpoint and its ranks) when nothing else arrives
			continue
		}
		if !ok {
			break
		}
		in.message(ctx, msg.Frames)
	more:
		for n := 1; n < maxQueued; n++ {
			select {
			case m, ok := <-msgs:
				if !ok {
					break more
				}
				in.message(ctx, m.Frames)
			default:
				break more
			}
		}
		in.commit(ctx)
	}
	return rerr // written before msgs was closed
}

// message queues one ZMQ message [topic, seq8, payload] (handleQueued); the caller commits.
func (in *Ingester) message(ctx context.Context, frames [][]byte) {
	if len(frames) != 3 || len(frames[1]) != 8 {
		in.bump(func(s *Stats) { s.BadFrames++ })
		return
	}
	in.handleQueued(ctx, binary.BigEndian.Uint64(frames[1]), frames[2])
}

// handle applies one sequenced payload, repairing order first (see RATIONALE.md), and commits it: when it
// returns, the batch is in the index and in Stats.
func (in *Ingester) handle(ctx context.Context, seq uint64, payload []byte) {
	in.handleQueued(ctx, seq, payload)
	in.commit(ctx)
}

// handleQueued is handle without the commit: the batch's index updates stay queued (with those of earlier
// uncommitted batches) until commit, so several received batches go to the index in one call.
func (in *Ingester) handleQueued(ctx context.Context, seq uint64, payload []byte) {
	if in.ranks != nil {
		// Data-parallel ranks: each has its own sequence; hand the batch to its rank.
		r := 0
		if b, err := Decode(payload); err == nil && b.DataParallelRank != nil {
			r = *b.DataParallelRank
		}
		if r < 0 || r >= len(in.ranks) {
			in.bump(func(s *Stats) { s.BadFrames++ })
			return
		}
		in.ranks[r].handleQueued(ctx, seq, payload)
		return
	}
	have, last := in.seqHave, in.seqLast
	switch {
	case !have && seq > 0 && in.cfg.ReplayAddr != "":
		// This Ingester's first message, from a publisher that has been running for a while. Whatever the
		// index holds for the endpoint was written by an earlier ingester (another gateway before a lease
		// takeover, or this one before a restart) whose engine-hash map is gone. Fetch the publisher's
		// buffered history: if it reaches back to seq 0 it is the whole truth (replay clears, then applies
		// it); if not, the earlier entries are demoted to unconfirmed holds that age out unless the engine
		// confirms them (RATIONALE.md), and the history is applied on top.
		in.replay(ctx, 0, seq, true)
		have, last = in.seqHave, in.seqLast
		in.bump(func(s *Stats) { s.CatchUps++ })
		switch {
		case have && seq <= last:
			in.dupLo, in.dupHi = seq, last
			return
		case have && seq > last+1: // the buffer has a hole before seq
			in.demote(ctx)
		case !have: // the replay brought nothing
			in.demote(ctx)
		}
	case !have && seq == 0:
		in.clear(ctx, false) // a new engine process: nothing from before is held
	case !have:
		in.demote(ctx) // joined mid-stream without replay
	case seq == last+1:
	case seq > last+1:
		in.bump(func(s *Stats) { s.Gaps++ })
		in.log.WarnContext(ctx, "kv events sequence gap", slog.Uint64("expected", last+1), slog.Uint64("got", seq))
		if in.cfg.ReplayAddr != "" {
			in.replay(ctx, last+1, seq, false)
			last = in.seqLast
			if seq <= last {
				in.dupLo, in.dupHi = seq, last
				in.bump(func(s *Stats) { s.Replays++ })
				return // the replay covered this message
			}
			if seq == last+1 {
				in.bump(func(s *Stats) { s.Replays++ })
				break
			}
			in.bump(func(s *Stats) { s.ReplayFailures++ })
		}
		// Lost events: what the index holds may be stale, but most of it is still on the engine. Keep the
		// engine-hash map (children of earlier blocks still resolve) and let the entries age out unless
		// confirmed.
		in.demote(ctx)
	default: // seq <= last
		if seq > in.dupLo && seq <= in.dupHi {
			in.bump(func(s *Stats) { s.Duplicates++ })
			return
		}
		in.log.InfoContext(ctx, "kv events sequence restarted (engine restart)", slog.Uint64("last", last), slog.Uint64("got", seq))
		in.bump(func(s *Stats) { s.Restarts++ })
		in.clear(ctx, false)
		in.dupLo, in.dupHi = 0, 0
	}
	if in.apply(ctx, seq, payload) || in.cfg.ReplayAddr == "" || in.replaying {
		return
	}
	// An undecodable batch: fetch it again (a corrupted copy is not the engine's buffer).
	in.bump(func(s *Stats) { s.CorruptReplays++ })
	in.seqHave, in.seqLast = have || seq > 0, seq-1
	if !have && seq == 0 {
		in.seqHave = false
	}
	in.replay(ctx, seq, seq, false)
	if in.seqHave && in.seqLast >= seq {
		in.bump(func(s *Stats) { s.RecoveredBatches++ })
		in.dupLo, in.dupHi = seq, in.seqLast
		return
	}
	// Its events are lost: as after a gap the replay could not close.
	in.seqHave, in.seqLast = true, seq
	in.demote(ctx)
}

// replay fetches batches from seq `from` on through the replay socket and applies those that continue the
// sequence. upto is the sequence number that triggered it (the timeout grows with upto-from). With catchUp
// (no sequence number seen yet), the first batch is applied whatever its number: before it the endpoint is
// cleared when the buffer reaches back to seq 0, else demoted.
func (in *Ingester) replay(ctx context.Context, from, upto uint64, catchUp bool) {
	timeout := in.cfg.ReplayTimeout
	if upto > from {
		timeout += time.Duration(min(upto-from, 1<<20)) * in.cfg.ReplayTimeoutPerBatch
	}
	timeout = min(timeout, max(2*time.Minute, in.cfg.ReplayTimeout))
	in.replaying = true
	defer func() { in.replaying = false }()
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := zmq4.NewDealer(rctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(in.cfg.ReplayTimeout))
	defer d.Close()
	fail := func(err error) {
		in.log.WarnContext(ctx, "kv events replay failed", slog.String("addr", in.cfg.ReplayAddr), slog.Any("error", err),
			slog.Float64("timeout_seconds", timeout.Seconds()))
	}
	if err := d.Dial(in.cfg.ReplayAddr); err != nil {
		fail(err)
		return
	}
	var seq8 [8]byte
	binary.BigEndian.PutUint64(seq8[:], from)
	if err := d.SendMulti(zmq4.NewMsgFrom([]byte{}, seq8[:])); err != nil {
		fail(err)
		return
	}
	for {
		msg, err := d.Recv()
		if err != nil {
			fail(err)
			return
		}
		f := msg.Frames
		if len(f) != 3 || len(f[0]) != 0 || len(f[1]) != 8 {
			in.bump(func(s *Stats) { s.BadFrames++ })
			continue
		}
		seq := binary.BigEndian.Uint64(f[1])
		if seq == endSeq {
			return
		}
		switch {
		case catchUp && !in.seqHave:
			if seq == 0 {
				in.clear(ctx, false)
			} else {
				in.demote(ctx)
			}
			in.apply(ctx, seq, f[2])
		case in.seqHave && seq == in.seqLast+1, !in.seqHave && seq == from:
			in.apply(ctx, seq, f[2])
		}
		// Older batches are skipped; a batch beyond last+1 means the buffer no longer reaches back to the
		// gap: the caller sees last < trigger-1 and demotes.
	}
}

// bury keeps h (now held on no tier) resolvable until RemovedMemory more hashes have been buried.
func (in *Ingester) bury(h EngineHash) {
	if len(in.grave) < cap(in.grave) {
		in.grave = append(in.grave, h)
		return
	}
	old := in.grave[in.gravePos]
	if he := in.hashes.get(old); he != nil && !he.held() {
		in.hashes.del(old)
	}
	in.grave[in.gravePos] = h
	in.gravePos = (in.gravePos + 1) % cap(in.grave)
}

// forgetAll drops the whole engine-hash map.
func (in *Ingester) forgetAll() {
	in.hashes.reset()
	in.grave = in.grave[:0]
	in.gravePos = 0
}

// clear drops the endpoint's confirmed entries and its hash map (speculative entries stay) — and, while
// demoted entries may still be live, every entry (ClearEndpoint): the engine says it holds nothing.
func (in *Ingester) clear(ctx context.Context, resync bool) {
	in.commit(ctx) // what came before the clear, in order (Stats included)
	in.forgetAll()
	err := in.clearIndex(ctx)
	if !in.wrote(ctx, "clear", err) {
		in.resyncClear = true
	} else {
		in.dropBacklog() // the clear supersedes what was queued before it
	}
	in.bump(func(s *Stats) {
		s.Clears++
		s.Resyncing = resync
		s.UnconfirmedUntil = time.Time{}
		s.MappedHashes = 0
		if err != nil {
			s.IndexErrors++
		}
	})
}

// clearIndex drops the endpoint's entries from the index (see clear).
func (in *Ingester) clearIndex(ctx context.Context) error {
	if in.fenced {
		return nil
	}
	if !in.unconfUntil.IsZero() && in.cfg.Now().Before(in.unconfUntil) {
		in.unconfUntil = time.Time{}
		return in.cfg.Index.ClearEndpoint(ctx, in.cfg.Model, in.cfg.Endpoint)
	}
	in.unconfUntil = time.Time{}
	return in.cfg.Index.ClearConfirmed(ctx, in.cfg.Model, in.cfg.Endpoint)
}

// demote turns the endpoint's confirmed entries into unconfirmed holds that age out after UnconfirmedTTL
// unless the engine's events confirm them again (kvstore.Demoter; an index without it is cleared). The
// engine-hash map stays: the engine's hashes are still valid, so children of known blocks still resolve
// and a later BlockStored of a known hash confirms it again.
func (in *Ingester) demote(ctx context.Context) {
	d, ok := in.cfg.Index.(kvstore.Demoter)
	if !ok {
		in.clear(ctx, true)
		return
	}
	in.commit(ctx)
	// Every hash the map holds is confirmed again by its next BlockStored (its tier counts restart at 0);
	// the keys stay so that children still resolve. Entries never confirmed again are forgotten once the
	// demoted entries have aged out (commit).
	in.hashes.markUnconfirmed()
	var err error
	if !in.fenced {
		err = d.Demote(ctx, in.cfg.Model, in.cfg.Endpoint, in.cfg.UnconfirmedTTL)
		if !in.wrote(ctx, "demote", err) {
			in.resyncDem = true
		}
	}
	until := in.cfg.Now().Add(in.cfg.UnconfirmedTTL)
	in.unconfUntil = until
	in.bump(func(s *Stats) {
		s.Demotions++
		s.UnconfirmedUntil = until
		if err != nil {
			s.IndexErrors++
		}
	})
}

// wrote reports whether an index write succeeded. A refused one (kvstore.ErrFenced: another ingester holds
// the endpoint's lease now) stops the Ingester's writes; any other failure schedules a resync, logged once
// with its cause (later failures until the resync succeeds are only counted). The first attempt waits a
// second (retrying at once, while the store is down, added store load at every recovery).
func (in *Ingester) wrote(ctx context.Context, op string, err error) bool {
	if err == nil {
		return true
	}
	if errors.Is(err, kvstore.ErrFenced) {
		if !in.fenced {
			in.fenced = true
			in.log.ErrorContext(ctx, "kv events ingestion fenced off: another ingester holds the endpoint now; stopping",
				slog.String("op", op), slog.Any("error", err))
			in.bump(func(s *Stats) { s.Fenced = true })
		}
		return false
	}
	if in.writeErr == nil {
		in.log.WarnContext(ctx, "kv events index write failed; the endpoint will be resynced", slog.String("op", op), slog.Any("error", err))
		in.writeErr = err
		in.resyncWait = max(in.cfg.BackoffMin, time.Second)
		in.resyncAt = in.cfg.Now().Add(in.resyncWait)
		in.bump(func(s *Stats) { s.ResyncPending = true })
	}
	return false
}

// isFenced reports whether this Ingester or one of its ranks had a write refused.
func (in *Ingester) isFenced() bool {
	if in.fenced {
		return true
	}
	for _, r := range in.ranks {
		if r.fenced {
			return true
		}
	}
	return false
}

// resyncDue reports whether a resync is pending (on this Ingester or a rank), and when it is due.
func (in *Ingester) resyncDue() (time.Time, bool) {
	var at time.Time
	due := false
	if in.writeErr != nil && !in.fenced {
		at, due = in.resyncAt, true
	}
	for _, r := range in.ranks {
		if rat, ok := r.resyncDue(); ok && (!due || rat.Before(at)) {
			at, due = rat, true
		}
	}
	return at, due
}

// resyncChunk is the most keys one update of a resync carries (a Redis script runs them in one call).
const resyncChunk = 4096

// resync repairs the endpoint's entries after a failed write. Usually it sends the updates that did not
// reach the index since the failure again, in order (set semantics make a partly applied one harmless),
// after the demotion that failed, if one did. When the failed write was a clear, it clears again and adds
// every block the engine-hash map holds; when the backlog outgrew maxBacklogKeys, it demotes the
// confirmed entries (what a lost Remove left behind ages out, what the engine still holds keeps its score)
// and adds every block the map holds, confirming them again. Nothing the engine still holds is dropped,
// also when this fails (it is retried with backoff).
func (in *Ingester) resync(ctx context.Context) {
	if in.writeErr == nil || in.fenced || in.cfg.Now().Before(in.resyncAt) {
		return
	}
	var err error
	op := "demote"
	demoted, rebuild := false, in.resyncClear || in.overflow
	d, canDemote := in.cfg.Index.(kvstore.Demoter)
	switch {
	case in.resyncClear:
		op = "clear"
		err = in.clearIndex(ctx)
	case (in.overflow || in.resyncDem) && canDemote:
		err = d.Demote(ctx, in.cfg.Model, in.cfg.Endpoint, in.cfg.UnconfirmedTTL)
		demoted = err == nil
	}
	var until time.Time
	if demoted {
		in.resyncDem = false
		until = in.cfg.Now().Add(in.cfg.UnconfirmedTTL)
		in.unconfUntil = until
	}
	if err == nil {
		op = "apply"
		in.resyncClear = false
		us := in.backlog
		if rebuild {
			us = nil
			for _, tier := range []kvstore.Tier{kvstore.TierGPU, kvstore.TierCPU} {
				var keys []kvstore.BlockKey
				var fams []kvstore.Family
				in.hashes.eachHeld(tier, func(k kvstore.BlockKey, f kvstore.Family) {
					keys = append(keys, k)
					fams = append(fams, f)
				})
				for len(keys) > 0 {
					n := min(len(keys), resyncChunk)
					us = append(us, kvstore.Update{Endpoint: in.cfg.Endpoint, Tier: tier, Keys: keys[:n:n], Families: fams[:n:n]})
					keys, fams = keys[n:], fams[n:]
				}
			}
		}
		if len(us) > 0 {
			err = in.cfg.Index.Apply(ctx, in.cfg.Model, us)
		}
		if err == nil {
			in.dropBacklog()
		}
	}
	in.bump(func(s *Stats) {
		if demoted {
			s.Demotions++
			s.UnconfirmedUntil = until
		}
		if err != nil {
			s.IndexErrors++
		}
	})
	if err != nil {
		if errors.Is(err, kvstore.ErrFenced) {
			in.wrote(ctx, "resync "+op, err)
			return
		}
		in.resyncWait = min(2*in.resyncWait, in.cfg.BackoffMax)
		in.resyncAt = in.cfg.Now().Add(in.resyncWait)
		in.log.DebugContext(ctx, "kv events resync failed", slog.String("op", op), slog.Any("error", err))
		return
	}
	in.log.InfoContext(ctx, "kv events endpoint resynced after a failed index write", slog.Any("cause", in.writeErr),
		slog.Int("mapped_hashes", in.hashes.len()))
	in.writeErr = nil
	in.bump(func(s *Stats) {
		s.Resyncs++
		s.ResyncPending = false
	})
}

// maxLag bounds a believable batch timestamp: one further than this from the receive time (or not finite)
// is counted in Stats.BadTimestamps and leaves Stats.Lag as it was. A clock years off is still reported as
// lag (an operator should see it); inf or -1e300 are not times at all.
const maxLag = 10 * 365 * 24 * time.Hour

// apply decodes one batch, queues its index updates and counts it; seq becomes the last applied sequence
// number. commit sends the updates and publishes the counts. It reports false when the batch did not decode.
func (in *Ingester) apply(ctx context.Context, seq uint64, payload []byte) bool {
	in.seqHave, in.seqLast = true, seq
	in.acc.any = true
	b, err := decodeInto(payload, &in.arena) // the batch is not kept past this call
	if err != nil {
		in.acc.decodeErrors++
		in.log.WarnContext(ctx, "kv events batch undecodable", slog.Uint64("seq", seq), slog.Any("error", err))
		return false
	}
	for _, ev := range b.Events {
		in.event(ctx, ev, &in.acc.c)
	}
	now := in.cfg.Now()
	in.acc.batches++
	in.acc.events += uint64(len(b.Events))
	in.acc.skipped += uint64(b.Skipped)
	in.acc.at = now
	// ts is float seconds; inf, NaN or -1e300 say nothing about lag.
	if nowS := float64(now.UnixNano()) / 1e9; b.TS-b.TS == 0 && math.Abs(nowS-b.TS) <= maxLag.Seconds() {
		in.acc.lag = time.Duration((nowS - b.TS) * 1e9)
		in.acc.lagSet = true
	} else {
		in.acc.badTS++
	}
	return true
}

// commit sends the queued index updates (one Batcher.Apply) and then publishes the applied batches'
// counters and sequence number in Stats, so Stats.LastSeq never runs ahead of the index.
func (in *Ingester) commit(ctx context.Context) {
	for _, r := range in.ranks {
		r.commit(ctx)
	}
	if !in.acc.any && len(in.ops) == 0 {
		in.resync(ctx)
		return
	}
	if !in.unconfUntil.IsZero() && !in.cfg.Now().Before(in.unconfUntil) {
		// The demoted entries have aged out of the index: forget the hashes never confirmed since.
		in.unconfUntil = time.Time{}
		in.hashes.dropUnconfirmed()
	}
	in.flush(ctx, &in.acc.c)
	in.resync(ctx)
	a := in.acc
	in.acc = pending{}
	in.bump(func(s *Stats) {
		s.HaveSeq, s.LastSeq = in.seqHave, in.seqLast
		s.DecodeErrors += a.decodeErrors
		s.Batches += a.batches
		s.Events += a.events
		s.SkippedEvents += a.skipped
		s.BadTimestamps += a.badTS
		if a.batches > 0 {
			s.LastBatchAt = a.at
		}
		if a.lagSet {
			s.Lag = a.lag
		}
		if a.configOK {
			s.ConfigError = ""
		}
		a.c.addTo(s)
		s.MappedHashes = in.hashes.len()
	})
}

// pending is what apply counted since the last commit.
type pending struct {
	c                                      applyCounts
	any                                    bool
	decodeErrors, batches, events, skipped uint64
	badTS                                  uint64
	lag                                    time.Duration
	lagSet                                 bool
	configOK                               bool // a BlockStored agreed with the configuration after a config error
	at                                     time.Time
}

// applyCounts gathers one batch's counters so Stats is locked once per batch.
type applyCounts struct {
	blocks, blockSizeErrors, badEvents, orphans, unresolved, unknownRemoved, unknownMedium, conflicts,
	indexErrors, clears, otherGroups, hashEvictions uint64
	cleared bool
}

func (c *applyCounts) addTo(s *Stats) {
	s.Blocks += c.blocks
	s.BlockSizeErrors += c.blockSizeErrors
	s.BadEvents += c.badEvents
	s.Orphans += c.orphans
	s.Unresolved += c.unresolved
	s.UnknownRemoved += c.unknownRemoved
	s.UnknownMedium += c.unknownMedium
	s.KeyConflicts += c.conflicts
	s.OtherGroupEvents += c.otherGroups
	s.IndexErrors += c.indexErrors
	s.Clears += c.clears
	s.HashEvictions += c.hashEvictions
	if c.cleared {
		s.Resyncing = false
		s.UnconfirmedUntil = time.Time{}
	}
}

// tierOf maps an event medium to a tier: None (vLLM v0.9) and "GPU" → GPU; "CPU" and SGLang's
// "CPU_PINNED" → CPU; anything else (DISK, EXTERNAL, ...) is not indexed.
func tierOf(medium string) (kvstore.Tier, bool) {
	switch strings.ToUpper(medium) {
	case "", "GPU":
		return kvstore.TierGPU, true
	case "CPU", "CPU_PINNED":
		return kvstore.TierCPU, true
	}
	return 0, false
}

func (in *Ingester) event(ctx context.Context, ev Event, c *applyCounts) {
	switch e := ev.(type) {
	case BlockStored:
		in.stored(ctx, &e, c)
	case BlockRemoved:
		if e.GroupIdx != nil && *e.GroupIdx != in.cfg.KVCacheGroup {
			c.otherGroups++
			return
		}
		tier, ok := tierOf(e.Medium)
		if !ok {
			c.unknownMedium++
			return
		}
		in.beginOp(tier, true)
		for _, h := range e.BlockHashes {
			he := in.hashes.get(h)
			if he == nil || he.refs[tier] == 0 {
				c.unknownRemoved++
				continue
			}
			if he.unconfirmed() {
				// Demoted: the index holds it unconfirmed (it ages out); forget the hash.
				he.refs[tier] = 0
				if !he.held() {
					in.bury(h)
				}
				continue
			}
			he.refs[tier]--
			if he.refs[tier] == 0 {
				in.opKeys = append(in.opKeys, he.key)
				in.opFams = append(in.opFams, he.fam)
			}
			if !he.held() {
				in.bury(h) // may delete another entry: he is not used after this
			}
		}
	case AllBlocksCleared:
		in.flush(ctx, c) // in order: what came before the clear reaches the index first (a rare event)
		in.forgetAll()
		if err := in.clearIndex(ctx); !in.wrote(ctx, "clear", err) {
			in.resyncClear = true
			c.indexErrors++
		} else {
			in.dropBacklog()
		}
		c.clears++
		c.cleared = true
	}
}

func (in *Ingester) stored(ctx context.Context, e *BlockStored, c *applyCounts) {
	if e.GroupIdx != nil && *e.GroupIdx != in.cfg.KVCacheGroup {
		c.otherGroups++
		return
	}
	tier, ok := tierOf(e.Medium)
	if !ok {
		c.unknownMedium++
		return
	}
	if len(e.TokenIDs) == 0 {
		// Placeholder (vLLM CPU offload without self-describing events): resolve through the map.
		for _, h := range e.BlockHashes {
			he := in.hashes.get(h)
			if he == nil {
				c.unresolved++
				continue
			}
			he.confirm()
			he.touch()
			he.refs[tier]++
			if he.refs[tier] == 1 {
				in.beginOp(tier, false)
				in.opKeys = append(in.opKeys, he.key)
				in.opFams = append(in.opFams, he.fam)
			}
		}
	} else {
		if e.BlockSize != in.cfg.BlockSize {
			c.blockSizeErrors++
			in.configError(ctx, fmt.Sprintf("engine block size %d, model %q configured with %d", e.BlockSize, in.cfg.Model, in.cfg.BlockSize))
			return
		}
		if in.configNoted {
			in.configNoted = false
			in.acc.configOK = true
			in.log.InfoContext(ctx, "kv events agree with configuration again")
		}
		if len(e.TokenIDs) != len(e.BlockHashes)*e.BlockSize {
			c.badEvents++
			return
		}
		extra := kvstore.ExtraKeys{LoRA: e.LoRAName}
		if extra.LoRA == "" && e.LoRAID != nil {
			extra.LoRA = in.cfg.LoRAByID[*e.LoRAID]
		}
		keys := in.keyBuf[:0]
		var fam kvstore.Family
		if e.ParentBlockHash == nil {
			extra.CacheSalt = cacheSalt(e, extra.LoRA)
			keys = in.cfg.Hasher.AppendKeys(keys, e.TokenIDs, e.BlockSize, extra)
			if len(keys) > 0 {
				fam = kvstore.FamilyOf(keys[0])
			}
		} else {
			parent := in.hashes.get(*e.ParentBlockHash)
			if parent == nil {
				c.orphans++
				return
			}
			parent.touch()
			fam = parent.fam
			keys = in.cfg.Hasher.AppendKeysAfter(keys, parent.key, e.TokenIDs, e.BlockSize, extra)
		}
		in.keyBuf = keys
		// Room for the event's hashes first, so its evictions' removals go to the index as one update before
		// its additions (a hash already mapped is counted too: the map may stay up to one event below its cap).
		in.makeRoom(len(e.BlockHashes), c)
		for i, h := range e.BlockHashes {
			if in.hashes.len() >= in.cfg.MaxHashes && in.hashes.get(h) == nil {
				in.makeRoom(1, c) // an event longer than the cap
			}
			he, added := in.hashes.put(h)
			if added {
				he.key, he.fam = keys[i], fam
			} else if he.key != keys[i] {
				c.conflicts++
			}
			he.confirm()
			he.touch()
			he.refs[tier]++
			if he.refs[tier] == 1 {
				in.beginOp(tier, false)
				in.opKeys = append(in.opKeys, he.key)
				in.opFams = append(in.opFams, he.fam)
			}
		}
	}
}

// makeRoom evicts engine hashes (CLOCK, hashTable.evict) until n more fit within IngesterConfig.MaxHashes,
// and queues the removal of their blocks from the index, in order with the batch's other updates, so the
// index never keeps a confirmed entry the map cannot resolve (a later BlockRemoved could not remove it).
// An unconfirmed entry's block is left to age out of the index, as a BlockRemoved would leave it. Why
// remove rather than demote: RATIONALE.md, "Why is the engine-hash map capped, and by CLOCK?".
func (in *Ingester) makeRoom(n int, c *applyCounts) {
	excess := in.hashes.len() + n - in.cfg.MaxHashes
	if excess <= 0 {
		return
	}
	for range excess {
		_, e, ok := in.hashes.evict()
		if !ok {
			break
		}
		c.hashEvictions++
		if e.unconfirmed() {
			continue
		}
		if e.refs[kvstore.TierGPU] > 0 {
			in.evictGPU = append(in.evictGPU, e)
		}
		if e.refs[kvstore.TierCPU] > 0 {
			in.evictCPU = append(in.evictCPU, e)
		}
	}
	for i, ev := range [][]hashEntry{in.evictGPU, in.evictCPU} {
		if len(ev) > 0 {
			in.beginOp(kvstore.Tier(i+1), true)
			for _, e := range ev {
				in.opKeys = append(in.opKeys, e.key)
				in.opFams = append(in.opFams, e.fam)
			}
		}
	}
	in.evictGPU, in.evictCPU = in.evictGPU[:0], in.evictCPU[:0]
}

// beginOp makes the last queued update an Add (remove false) or Remove on tier, so that keys appended to
// opKeys join it: consecutive events of one kind and tier become one update.
func (in *Ingester) beginOp(tier kvstore.Tier, remove bool) {
	if n := len(in.ops); n > 0 && in.ops[n-1].tier == tier && in.ops[n-1].remove == remove {
		return
	}
	in.ops = append(in.ops, pendingOp{tier: tier, remove: remove, start: len(in.opKeys)})
}

// dropOps forgets the queued updates.
func (in *Ingester) dropOps() {
	in.ops = in.ops[:0]
	in.opKeys = in.opKeys[:0]
	in.opFams = in.opFams[:0]
}

// flush sends the queued updates (of the batches since the last commit) in order: one Index.Apply (one
// pipelined round trip on Redis). Nothing is sent once a write was fenced off.
func (in *Ingester) flush(ctx context.Context, c *applyCounts) {
	defer in.dropOps()
	in.updates = in.updates[:0]
	added := 0
	for i, op := range in.ops {
		end := len(in.opKeys)
		if i+1 < len(in.ops) {
			end = in.ops[i+1].start
		}
		if end == op.start {
			continue
		}
		u := kvstore.Update{Endpoint: in.cfg.Endpoint, Tier: op.tier, Remove: op.remove, Keys: in.opKeys[op.start:end:end],
			Families: in.opFams[op.start:end:end]}
		if !u.Remove {
			added += len(u.Keys)
		}
		in.updates = append(in.updates, u)
	}
	if len(in.updates) == 0 || in.fenced {
		return
	}
	if in.writeErr != nil { // a resync is pending: these wait behind the failed ones, in order
		in.queueBacklog(in.updates)
		return
	}
	if err := in.cfg.Index.Apply(ctx, in.cfg.Model, in.updates); in.wrote(ctx, "apply", err) {
		c.blocks += uint64(added)
	} else {
		c.indexErrors++
		in.queueBacklog(in.updates)
	}
}

// maxBacklogKeys bounds the keys of updates kept for a resync; beyond it the resync rebuilds from the
// engine-hash map.
const maxBacklogKeys = 1 << 16

// queueBacklog keeps copies of us for the pending resync.
func (in *Ingester) queueBacklog(us []kvstore.Update) {
	if in.overflow || in.fenced {
		return
	}
	for _, u := range us {
		in.backlogKeys += len(u.Keys)
		if in.backlogKeys > maxBacklogKeys {
			in.dropBacklog()
			in.overflow = true
			return
		}
		u.Keys = slices.Clone(u.Keys)
		u.Families = slices.Clone(u.Families)
		in.backlog = append(in.backlog, u)
	}
}

// dropBacklog forgets the queued updates.
func (in *Ingester) dropBacklog() {
	in.backlog, in.backlogKeys, in.overflow = nil, 0, false
}

// cacheSalt finds the cache salt of a chain's first block: SGLang's metadata.cache_salt, or the last string
// of vLLM's block-0 extra_keys tuple that is not the LoRA name (vLLM orders it lora, multimodal, cache_salt,
// prompt-embeds digest; multimodal prompts are not supported). "" when the event carries none.
func cacheSalt(e *BlockStored, lora string) string {
	if e.CacheSalt != "" {
		return e.CacheSalt
	}
	if len(e.ExtraKeys) == 0 || e.ExtraKeys[0] == nil {
		return ""
	}
	k := e.ExtraKeys[0]
	for i := len(k) - 1; i >= 0; i-- {
		if s, ok := k[i].(string); ok {
			if i == 0 && s == lora {
				return ""
			}
			return s
		}
	}
	return ""
}

// configError reports a configuration mismatch (logged once until events agree again) and flags the
// endpoint with the latest problem.
func (in *Ingester) configError(ctx context.Context, msg string) {
	in.acc.configOK = false
	if !in.configNoted {
		in.log.ErrorContext(ctx, "kv events disagree with configuration", slog.String("problem", msg))
	}
	in.configNoted = true
	in.bump(func(s *Stats) { s.ConfigError = msg })
}
