package kvstore

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Speculative records out of the Redis index (issue 14; RATIONALE.md, "The hot path"). A Record whose ttl is
// at most RedisConfig.SharedRecordMaxTTL is not written into the block keys: the gateway keeps it in memory
// (recordCache) and PUBLISHes it once, as one binary message, on <base>records; every RedisIndex on the
// same Redis and prefix subscribes and keeps the others' records too, and Match adds the live ones to what
// Redis holds. One PUBLISH replaces a script that rewrote every block of the prompt (measured 58 µs against
// 2,195 µs of Redis CPU per 128-block record). Longer records (the router's routed-hit confirmations,
// index_unconfirmed_ttl) stay in Redis, where a gateway started later finds them.
//
// Message (binary, little-endian): 'R' (record) or 'C' (clear endpoint), sender (8 bytes), ttl ms (uvarint;
// 0 for 'C'), model length (uvarint) + model, endpoint length (uvarint) + endpoint, then 8 bytes per block
// key. A lost message (a subscriber reconnecting) loses speculative holds only: the engine's events confirm
// the blocks moments later.

// DefaultSharedRecordMaxTTL is RedisConfig.SharedRecordMaxTTL's default.
const DefaultSharedRecordMaxTTL = 30 * time.Second

// maxSharedRecords bounds the speculative holds one gateway keeps in memory (the oldest go first).
const maxSharedRecords = 4 << 20

type recKey struct {
	model string
	key   BlockKey
}

type recHold struct {
	ep  EndpointID
	exp time.Time
}

type recFIFO struct {
	k   recKey
	exp time.Time
}

// recordCache holds speculative records by (model, block key), expiring on this process's clock.
type recordCache struct {
	mu    sync.Mutex
	holds map[recKey][]recHold
	fifo  []recFIFO // in insertion order from head on, for the lazy sweep and the bound
	head  int       // fifo[:head] is swept
	n     int       // holds in the map
	now   func() time.Time
}

func newRecordCache() *recordCache {
	return &recordCache{holds: map[recKey][]recHold{}, now: time.Now}
}

// record sets ep's hold of keys to expire at exp (or later, when it already does).
func (c *recordCache) record(model string, ep EndpointID, keys []BlockKey, exp time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweep(c.now())
	for _, k := range keys {
		rk := recKey{model, k}
		hs := c.holds[rk]
		found := false
		for i := range hs {
			if hs[i].ep == ep {
				if exp.After(hs[i].exp) {
					hs[i].exp = exp
				}
				found = true
				break
			}
		}
		if !found {
			c.holds[rk] = append(hs, recHold{ep, exp})
			c.n++
		}
		c.fifo = append(c.fifo, recFIFO{rk, exp})
	}
	for c.n > maxSharedRecords && c.head < len(c.fifo) {
		c.drop(c.fifo[c.head].k, time.Time{}, true)
		c.head++
	}
	c.compact()
}

// sweep drops expired holds from the FIFO's front.
func (c *recordCache) sweep(now time.Time) {
	for ; c.head < len(c.fifo) && !c.fifo[c.head].exp.After(now); c.head++ {
		c.drop(c.fifo[c.head].k, now, false)
	}
	c.compact()
}

// compact moves the FIFO's live part to the front once the swept part is over half of it (amortized O(1)
// per entry).
func (c *recordCache) compact() {
	if c.head > 1024 && c.head*2 > len(c.fifo) {
		n := copy(c.fifo, c.fifo[c.head:])
		c.fifo = c.fifo[:n]
		c.head = 0
	}
}

// drop removes rk's holds that expired by now (all of them when all is set).
func (c *recordCache) drop(rk recKey, now time.Time, all bool) {
	hs := c.holds[rk]
	j := 0
	for _, h := range hs {
		if !all && h.exp.After(now) {
			hs[j] = h
			j++
		} else {
			c.n--
		}
	}
	if j == 0 {
		delete(c.holds, rk)
	} else {
		c.holds[rk] = hs[:j]
	}
}

// clearEndpoint drops every hold of ep under model.
func (c *recordCache) clearEndpoint(model string, ep EndpointID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for rk, hs := range c.holds {
		if rk.model != model {
			continue
		}
		j := 0
		for _, h := range hs {
			if h.ep != ep {
				hs[j] = h
				j++
			} else {
				c.n--
			}
		}
		if j == 0 {
			delete(c.holds, rk)
		} else {
			c.holds[rk] = hs[:j]
		}
	}
}

// live returns, per key, the live holds as block-value records "<endpoint>\t<v>\n" with v = (server expiry
// ms)*4 (a speculative hold, counted as GPU), the server's clock being serverNow ms now. nil when none of
// the keys has a live hold.
func (c *recordCache) live(model string, keys []BlockKey, serverNow int64) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.holds) == 0 {
		return nil
	}
	now := c.now()
	var out []string
	for i, k := range keys {
		hs := c.holds[recKey{model, k}]
		if len(hs) == 0 {
			continue
		}
		var s []byte
		for _, h := range hs {
			if rem := h.exp.Sub(now); rem > 0 {
				s = append(s, h.ep...)
				s = append(s, '\t')
				s = strconv.AppendInt(s, (serverNow+rem.Milliseconds()+1)*4, 10)
				s = append(s, '\n')
			}
		}
		if len(s) > 0 {
			if out == nil {
				out = make([]string, len(keys))
			}
			out[i] = string(s)
		}
	}
	return out
}

// recordBus is a RedisIndex's shared speculative records: the cache and its subscription.
type recordBus struct {
	cache   *recordCache
	channel string
	sender  [8]byte
	once    sync.Once
	mu      sync.Mutex
	ps      *redis.PubSub
	closed  bool
}

func newRecordBus(channel string) *recordBus {
	b := &recordBus{cache: newRecordCache(), channel: channel}
	_, _ = rand.Read(b.sender[:])
	return b
}

// start subscribes (once) to the channel; messages of other senders are applied to the cache.
func (b *recordBus) start(c redis.UniversalClient) {
	b.once.Do(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.closed {
			return
		}
		b.ps = c.Subscribe(context.Background(), b.channel)
		ch := b.ps.Channel(redis.WithChannelSize(1024))
		go func() {
			for m := range ch {
				b.apply([]byte(m.Payload))
			}
		}()
	})
}

func (b *recordBus) close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.ps != nil {
		return b.ps.Close()
	}
	return nil
}

var errBadRecordMsg = errors.New("kvstore: malformed shared record")

func encodeRecordMsg(op byte, sender [8]byte, ttl time.Duration, model string, ep EndpointID, keys []BlockKey) []byte {
	b := make([]byte, 0, 32+len(model)+len(ep)+8*len(keys))
	b = append(b, op)
	b = append(b, sender[:]...)
	b = binary.AppendUvarint(b, uint64(ttl.Milliseconds()))
	b = binary.AppendUvarint(b, uint64(len(model)))
	b = append(b, model...)
	b = binary.AppendUvarint(b, uint64(len(ep)))
	b = append(b, ep...)
	for _, k := range keys {
		b = binary.LittleEndian.AppendUint64(b, uint64(k))
	}
	return b
}

type recordMsg struct {
	op     byte
	sender [8]byte
	ttl    time.Duration
	model  string
	ep     EndpointID
	keys   []BlockKey
}

func decodeRecordMsg(b []byte) (recordMsg, error) {
	var m recordMsg
	if len(b) < 9 || (b[0] != 'R' && b[0] != 'C') {
		return m, errBadRecordMsg
	}
	m.op = b[0]
	copy(m.sender[:], b[1:9])
	b = b[9:]
	ttl, n := binary.Uvarint(b)
	if n <= 0 || ttl > uint64(24*time.Hour/time.Millisecond) {
		return m, errBadRecordMsg
	}
	m.ttl = time.Duration(ttl) * time.Millisecond
	b = b[n:]
	str := func() (string, bool) {
		l, n := binary.Uvarint(b)
		if n <= 0 || l > uint64(len(b)-n) {
			return "", false
		}
		s := string(b[n : n+int(l)])
		b = b[n+int(l):]
		return s, true
	}
	var ok bool
	if m.model, ok = str(); !ok {
		return m, errBadRecordMsg
	}
	ep, ok := str()
	if !ok || len(b)%8 != 0 {
		return m, errBadRecordMsg
	}
	m.ep = EndpointID(ep)
	m.keys = make([]BlockKey, len(b)/8)
	for i := range m.keys {
		m.keys[i] = BlockKey(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return m, nil
}

// apply applies a message of another sender (a malformed one is ignored).
func (b *recordBus) apply(p []byte) {
	m, err := decodeRecordMsg(p)
	if err != nil || m.sender == b.sender || checkNames("shared record", m.model, m.ep) != nil {
		return
	}
	switch m.op {
	case 'R':
		if m.ttl > 0 {
			b.cache.record(m.model, m.ep, m.keys, b.cache.now().Add(m.ttl))
		}
	case 'C':
		b.cache.clearEndpoint(m.model, m.ep)
	}
}

// liveHolders returns, per key, the endpoints with a live hold now (this process's clock); nil when none of
// the keys has one. Layout 2's Match merges them with what Redis holds.
func (c *recordCache) liveHolders(model string, keys []BlockKey) [][]EndpointID {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.holds) == 0 {
		return nil
	}
	now := c.now()
	var out [][]EndpointID
	for i, k := range keys {
		for _, h := range c.holds[recKey{model, k}] {
			if h.exp.After(now) {
				if out == nil {
					out = make([][]EndpointID, len(keys))
				}
				out[i] = append(out[i], h.ep)
			}
		}
	}
	return out
}
