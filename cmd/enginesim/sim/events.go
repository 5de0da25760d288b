package sim

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/kvstore/kvevents"
)

// endSeq is the replay end marker's sequence number (vLLM's (-1).to_bytes(8, "big", signed=True)).
const endSeq = ^uint64(0)

// bufferedBatch is one published batch kept for replay.
type bufferedBatch struct {
	seq     uint64
	payload []byte
}

// publisher sends KV-event batches on a ZMQ PUB socket as vLLM's ZmqEventPublisher does (frames [topic,
// seq as 8-byte big-endian, msgpack EventBatch]) and answers replay requests on a ROUTER socket. Safe for
// concurrent use.
type publisher struct {
	log       *slog.Logger
	topic     []byte
	layout    kvevents.Layout
	form      kvevents.HashForm
	blockSize int
	rank      int // data_parallel_rank of every batch
	pub       zmq4.Socket
	router    zmq4.Socket // nil without replay
	cancel    context.CancelFunc
	done      chan struct{}

	mu      sync.Mutex
	seq     uint64
	ring    []bufferedBatch // oldest first, at most bufSize
	bufSize int
}

// parseLayout maps the --kv-events-encoding value to a kvevents layout: "array" is the last array-like
// vLLM layout (≤ 0.23), "map" vLLM ≥ 0.24; any kvevents layout name is accepted too.
func parseLayout(s string) (kvevents.Layout, error) {
	switch s {
	case "array":
		return kvevents.LayoutArrayLast, nil
	case "map":
		return kvevents.LayoutMap, nil
	}
	l, err := kvevents.ParseLayout(s)
	if err != nil {
		return 0, &ConfigError{Field: "kv-events-encoding", Reason: err.Error()}
	}
	return l, nil
}

func parseHashForm(s string) (kvevents.HashForm, error) {
	switch s {
	case "int":
		return kvevents.HashUint, nil
	case "bytes":
		return kvevents.HashBytes, nil
	}
	return 0, &ConfigError{Field: "kv-events-hash-form", Reason: fmt.Sprintf("%q is not int or bytes", s)}
}

// zmqBinds is vLLM's rule — bind when the address has a wildcard ("tcp://*:5557": every interface) or is
// ipc/inproc, else connect — plus one of the simulator's own: a loopback host ("tcp://127.0.0.1:5557",
// "tcp://localhost:5557", "tcp://[::1]:5557") binds that address only, so a demo's publisher is not
// reachable from other hosts (vLLM would connect to it, which no subscriber expects).
func zmqBinds(ep string) bool {
	if strings.Contains(ep, "*") || strings.Contains(ep, "::") ||
		strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://") {
		return true
	}
	return loopbackTCP(ep)
}

// loopbackTCP reports whether ep is tcp://HOST:PORT with HOST a loopback address or "localhost".
func loopbackTCP(ep string) bool {
	hostport, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return false
	}
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func newPublisher(cfg *Config, log *slog.Logger) (*publisher, error) {
	layout, err := parseLayout(cfg.EventsEncoding)
	if err != nil {
		return nil, err
	}
	form, err := parseHashForm(cfg.EventsHashForm)
	if err != nil {
		return nil, err
	}
	kc := cfg.KVEvents
	ctx, cancel := context.WithCancel(context.Background())
	p := &publisher{log: log, topic: []byte(kc.Topic), layout: layout, form: form, blockSize: cfg.BlockSize,
		cancel: cancel, done: make(chan struct{}), bufSize: kc.BufferSteps}
	p.pub = zmq4.NewPub(ctx)
	if err := p.pub.SetOption(zmq4.OptionHWM, kc.HWM); err != nil {
		cancel()
		return nil, fmt.Errorf("sim: kv events hwm: %w", err)
	}
	if zmqBinds(kc.Endpoint) {
		err = p.pub.Listen(kc.Endpoint)
	} else {
		err = p.pub.Dial(kc.Endpoint)
	}
	if err != nil {
		p.pub.Close()
		cancel()
		return nil, fmt.Errorf("sim: kv events endpoint %s: %w", kc.Endpoint, err)
	}
	if kc.ReplayEndpoint == "" {
		close(p.done)
		return p, nil
	}
	p.router = zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("enginesim-replay")))
	if err := p.router.Listen(kc.ReplayEndpoint); err != nil {
		p.pub.Close()
		cancel()
		return nil, fmt.Errorf("sim: kv events replay endpoint %s: %w", kc.ReplayEndpoint, err)
	}
	go p.serveReplay()
	return p, nil
}

// localAddr turns a bound socket's address into one a client on this host can dial.
func localAddr(s zmq4.Socket) string {
	a, ok := s.Addr().(*net.TCPAddr)
	if !ok || a == nil {
		if s.Addr() == nil {
			return ""
		}
		return s.Addr().Network() + "://" + s.Addr().String()
	}
	host := a.IP.String()
	if a.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "tcp://" + net.JoinHostPort(host, fmt.Sprint(a.Port))
}

// publish encodes events as one batch, assigns it the next sequence number, keeps it for replay and sends
// it unless drop is set (a deliberate sequence gap).
func (p *publisher) publish(events []kvEvent, drop bool) (uint64, error) {
	payload, err := p.encode(float64(time.Now().UnixNano())/1e9, events)
	if err != nil {
		return 0, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := p.seq
	p.seq++
	if len(p.ring) == p.bufSize {
		p.ring = append(p.ring[:0], p.ring[1:]...)
	}
	p.ring = append(p.ring, bufferedBatch{seq: seq, payload: payload})
	if drop {
		return seq, nil
	}
	var seqb [8]byte
	binary.BigEndian.PutUint64(seqb[:], seq)
	if err := p.pub.Send(zmq4.NewMsgFrom(p.topic, seqb[:], payload)); err != nil {
		return seq, fmt.Errorf("sim: publish kv events: %w", err)
	}
	return seq, nil
}

// encode builds one EventBatch (data_parallel_rank p.rank) and encodes it with kvevents.Encode.
func (p *publisher) encode(ts float64, events []kvEvent) ([]byte, error) {
	rank := p.rank
	batch := kvevents.EventBatch{TS: ts, DataParallelRank: &rank}
	for _, ev := range events {
		batch.Events = append(batch.Events, p.convert(ev))
	}
	payload, err := kvevents.Encode(batch, p.layout, p.form)
	if err != nil {
		return nil, fmt.Errorf("sim: encode kv events: %w", err)
	}
	return payload, nil
}

// restart starts the sequence over at 0 with an empty replay buffer, as a restarted engine would.
func (p *publisher) restart() {
	p.mu.Lock()
	p.seq = 0
	p.ring = nil
	p.mu.Unlock()
}

// convert builds the kvevents value of one cache event.
func (p *publisher) convert(ev kvEvent) kvevents.Event {
	hashes := make([]kvevents.EngineHash, len(ev.hashes))
	var raw [][]byte
	for i := range ev.hashes {
		hashes[i] = kvevents.HashFromDigest(ev.hashes[i][:])
		if p.form == kvevents.HashBytes {
			raw = append(raw, ev.hashes[i][:])
		}
	}
	switch ev.kind {
	case kvevents.TagBlockRemoved:
		return kvevents.BlockRemoved{BlockHashes: hashes, RawBlockHashes: raw, Medium: ev.medium.medium()}
	case kvevents.TagAllBlocksCleared:
		return kvevents.AllBlocksCleared{}
	}
	s := kvevents.BlockStored{BlockHashes: hashes, RawBlockHashes: raw, Medium: ev.medium.medium(), LoRAName: ev.lora}
	if ev.placeholder {
		s.TokenIDs = []uint32{}
		return s
	}
	s.TokenIDs = ev.tokens
	s.BlockSize = p.blockSize
	if ev.parent != nil {
		h := kvevents.HashFromDigest(ev.parent[:])
		s.ParentBlockHash = &h
		if p.form == kvevents.HashBytes {
			s.RawParentBlockHash = ev.parent[:]
		}
	}
	return s
}

// serveReplay answers DEALER requests [identity, "", start_seq] with every buffered batch whose seq ≥
// start_seq, each as [identity, "", seq, payload], then the end marker [identity, "", 2^64-1, ""]
// (vLLM's ZmqEventPublisher._service_replay). Malformed requests are logged and ignored.
func (p *publisher) serveReplay() {
	defer close(p.done)
	for {
		msg, err := p.router.Recv()
		if err != nil {
			return
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 0 || len(msg.Frames[2]) != 8 {
			p.log.Warn("invalid kv event replay request", slog.Int("frames", len(msg.Frames)))
			continue
		}
		id := msg.Frames[0]
		start := binary.BigEndian.Uint64(msg.Frames[2])
		p.mu.Lock()
		var out []bufferedBatch
		for _, b := range p.ring {
			if b.seq >= start {
				out = append(out, b)
			}
		}
		p.mu.Unlock()
		for _, b := range out {
			var seqb [8]byte
			binary.BigEndian.PutUint64(seqb[:], b.seq)
			if err := p.router.Send(zmq4.NewMsgFrom(id, []byte{}, seqb[:], b.payload)); err != nil {
				p.log.Warn("kv event replay send failed", slog.String("error", err.Error()))
				break
			}
		}
		var end [8]byte
		binary.BigEndian.PutUint64(end[:], endSeq)
		if err := p.router.Send(zmq4.NewMsgFrom(id, []byte{}, end[:], []byte{})); err != nil {
			p.log.Warn("kv event replay send failed", slog.String("error", err.Error()))
		}
	}
}

// topics returns the topic prefixes connected subscribers have subscribed to ("" = everything).
func (p *publisher) topics() []string {
	if t, ok := p.pub.(interface{ Topics() []string }); ok {
		return t.Topics()
	}
	return nil
}

func (p *publisher) eventsAddr() string { return localAddr(p.pub) }

func (p *publisher) replayAddr() string {
	if p.router == nil {
		return ""
	}
	return localAddr(p.router)
}

func (p *publisher) close() error {
	err := p.pub.Close()
	if p.router != nil {
		if e := p.router.Close(); err == nil {
			err = e
		}
	}
	p.cancel()
	<-p.done
	return err
}
