package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// Sentinel errors wrapped by *DecodeError.
var (
	// ErrMalformed: the payload is not valid msgpack (truncated, reserved code, trailing bytes).
	ErrMalformed = errors.New("kvevents: malformed msgpack")
	// ErrWrongType: valid msgpack, but a value has a type the schema does not allow (e.g. a string where the
	// block size goes, a negative token ID, a batch that is neither array nor map).
	ErrWrongType = errors.New("kvevents: wrong type")
	// ErrTooLarge: a declared length exceeds what the remaining payload could hold, or nesting is deeper than
	// maxDepth.
	ErrTooLarge = errors.New("kvevents: absurd length")
)

// maxDepth bounds the nesting Decode follows inside extra keys and skipped values.
const maxDepth = 32

// DecodeError reports why Decode rejected a payload: Kind is ErrMalformed, ErrWrongType or ErrTooLarge,
// Offset the byte offset in the payload where it was noticed, Where the field being read.
type DecodeError struct {
	// Kind is ErrMalformed, ErrWrongType or ErrTooLarge.
	Kind error
	// Offset is the byte offset in the payload.
	Offset int
	// Where names the field being read ("batch.ts", "BlockStored.token_ids", ...).
	Where string
	// Detail says what was found.
	Detail string
}

// Error implements error.
func (e *DecodeError) Error() string {
	return fmt.Sprintf("%v at byte %d (%s): %s", e.Kind, e.Offset, e.Where, e.Detail)
}

// Unwrap returns Kind, so errors.Is(err, ErrWrongType) works.
func (e *DecodeError) Unwrap() error { return e.Kind }

type reader struct {
	b   []byte
	off int
	br  bytes.Reader
	dec *msgpack.Decoder
	a   *arena // nil: every slice is allocated on its own (Decode)
}

// arena holds the token, hash and event slices of one decoded batch for decodeInto: a caller that is done
// with a batch before it decodes the next (the Ingester) reuses them instead of allocating ~5 slices and
// ~2.5 KB per 32-block batch. Slices handed out are capped (3-index), so appending to one never writes
// into its neighbour.
type arena struct {
	tokens []uint32
	hashes []EngineHash // block hashes and parent hashes
	ints   []int        // optional ints (data_parallel_rank, group_idx, ...)
	events []Event
}

// reset makes the arena's memory reusable; slices handed out before must no longer be used.
func (a *arena) reset() {
	a.tokens = a.tokens[:0]
	a.hashes = a.hashes[:0]
	a.ints = a.ints[:0]
	clear(a.events) // drop references to the previous batch's events
	a.events = a.events[:0]
}

// take returns n elements (to be overwritten) at the end of *buf (grown geometrically when full).
func take[T any](buf *[]T, n int) []T {
	b := *buf
	if cap(b)-len(b) < n {
		b = make([]T, 0, max(2*cap(b), n, 256))
	}
	l := len(b)
	b = b[:l+n]
	*buf = b
	return b[l : l+n : l+n]
}

var decPool = sync.Pool{New: func() any {
	r := &reader{}
	r.dec = msgpack.NewDecoder(&r.br)
	return r
}}

func (r *reader) fail(kind error, where, format string, args ...any) error {
	return &DecodeError{Kind: kind, Offset: r.off, Where: where, Detail: fmt.Sprintf(format, args...)}
}

func (r *reader) peek(where string) (byte, error) {
	if r.off >= len(r.b) {
		return 0, r.fail(ErrMalformed, where, "unexpected end of payload")
	}
	return r.b[r.off], nil
}

// need checks that n more bytes exist.
func (r *reader) need(n int, where string) error {
	if n < 0 || n > len(r.b)-r.off {
		return r.fail(ErrMalformed, where, "need %d bytes, %d left", n, len(r.b)-r.off)
	}
	return nil
}

// be reads an n-byte big-endian unsigned number (n = 1, 2, 4 or 8).
func (r *reader) be(n int, where string) (uint64, error) {
	if err := r.need(n, where); err != nil {
		return 0, err
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	switch n {
	case 1:
		return uint64(p[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(p)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(p)), nil
	}
	return binary.BigEndian.Uint64(p), nil
}

// tryNil consumes a nil and reports whether there was one.
func (r *reader) tryNil() bool {
	if r.off < len(r.b) && r.b[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

// containerLen reads an array (wantMap=false) or map header; n elements must fit in the remaining bytes
// (each element, or key+value, takes at least one byte each).
func (r *reader) containerLen(wantMap bool, where string) (int, error) {
	c, err := r.peek(where)
	if err != nil {
		return 0, err
	}
	var n uint64
	isMap := false
	switch {
	case c >= 0x90 && c <= 0x9f:
		n = uint64(c & 0x0f)
		r.off++
	case c >= 0x80 && c <= 0x8f:
		n = uint64(c & 0x0f)
		isMap = true
		r.off++
	case c == 0xdc || c == 0xde:
		isMap = c == 0xde
		r.off++
		n, err = r.be(2, where)
	case c == 0xdd || c == 0xdf:
		isMap = c == 0xdf
		r.off++
		n, err = r.be(4, where)
	default:
		if wantMap {
			return 0, r.fail(ErrWrongType, where, "want map, have code 0x%02x", c)
		}
		return 0, r.fail(ErrWrongType, where, "want array, have code 0x%02x", c)
	}
	if err != nil {
		return 0, err
	}
	if isMap != wantMap {
		return 0, r.fail(ErrWrongType, where, "want map=%v, have map=%v", wantMap, isMap)
	}
	per := uint64(1)
	if isMap {
		per = 2
	}
	if n*per > uint64(len(r.b)-r.off) {
		return 0, r.fail(ErrTooLarge, where, "%d elements declared, %d bytes left", n, len(r.b)-r.off)
	}
	return int(n), nil
}

// rawStr reads a str (or, if allowBin, a bin) and returns its bytes, aliased to the payload.
func (r *reader) rawStr(allowBin bool, where string) ([]byte, bool, error) {
	c, err := r.peek(where)
	if err != nil {
		return nil, false, err
	}
	var n uint64
	isBin := false
	r.off++
	switch {
	case c >= 0xa0 && c <= 0xbf:
		n = uint64(c & 0x1f)
	case c == 0xd9:
		n, err = r.be(1, where)
	case c == 0xda:
		n, err = r.be(2, where)
	case c == 0xdb:
		n, err = r.be(4, where)
	case allowBin && c == 0xc4:
		isBin = true
		n, err = r.be(1, where)
	case allowBin && c == 0xc5:
		isBin = true
		n, err = r.be(2, where)
	case allowBin && c == 0xc6:
		isBin = true
		n, err = r.be(4, where)
	default:
		r.off--
		return nil, false, r.fail(ErrWrongType, where, "want string, have code 0x%02x", c)
	}
	if err != nil {
		return nil, false, err
	}
	if n > uint64(len(r.b)-r.off) {
		return nil, false, r.fail(ErrTooLarge, where, "%d bytes declared, %d left", n, len(r.b)-r.off)
	}
	s := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return s, isBin, nil
}

// optStr reads a string or nil (""). The media names engines send on every event come back as constants,
// without an allocation.
func (r *reader) optStr(where string) (string, error) {
	if r.tryNil() {
		return "", nil
	}
	s, _, err := r.rawStr(false, where)
	switch string(s) {
	case "GPU":
		return "GPU", err
	case "CPU":
		return "CPU", err
	case "CPU_PINNED":
		return "CPU_PINNED", err
	}
	return string(s), err
}

// isIntCode reports whether c starts a msgpack integer.
func isIntCode(c byte) bool {
	return c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xd3)
}

// number decodes any msgpack int through the msgpack Decoder; signed reports a signed encoding.
func (r *reader) number(where string) (v uint64, signed bool, err error) {
	c, err := r.peek(where)
	if err != nil {
		return 0, false, err
	}
	switch {
	case c <= 0x7f: // positive fixint, the hot path
		r.off++
		return uint64(c), false, nil
	case c == 0xcc:
		r.off++
		v, err = r.be(1, where)
		return v, false, err
	case c == 0xcd:
		r.off++
		v, err = r.be(2, where)
		return v, false, err
	case c == 0xce:
		r.off++
		v, err = r.be(4, where)
		return v, false, err
	case c == 0xcf:
		r.off++
		v, err = r.be(8, where)
		return v, false, err
	case c >= 0xe0 || (c >= 0xd0 && c <= 0xd3):
		r.br.Reset(r.b[r.off:])
		i, derr := r.dec.DecodeInt64()
		if derr != nil {
			return 0, true, r.fail(ErrMalformed, where, "%v", derr)
		}
		r.off = len(r.b) - r.br.Len()
		return uint64(i), true, nil
	}
	return 0, false, r.fail(ErrWrongType, where, "want integer, have code 0x%02x", c)
}

// int reads an int that must fit a Go int (block sizes, ranks, indexes).
func (r *reader) int(where string) (int, error) {
	v, signed, err := r.number(where)
	if err != nil {
		return 0, err
	}
	if signed {
		if i := int64(v); i >= math.MinInt32 && i <= math.MaxInt32 {
			return int(i), nil
		}
	} else if v <= math.MaxInt32 {
		return int(v), nil
	}
	return 0, r.fail(ErrWrongType, where, "integer out of range")
}

func (r *reader) optInt(where string) (*int, error) {
	if r.tryNil() {
		return nil, nil
	}
	v, err := r.int(where)
	if err != nil {
		return nil, err
	}
	if r.a != nil {
		p := &take(&r.a.ints, 1)[0]
		*p = v
		return p, nil
	}
	return newInt(v), nil
}

// newInt returns a new *int holding v (kept out of optInt so that v does not escape on the arena path).
func newInt(v int) *int { return &v }

// hash reads a block hash: an int of any width and sign (cast to uint64) or a bin/str digest (last 8
// bytes, big-endian; the digest is copied out).
func (r *reader) hash(where string) (EngineHash, []byte, error) {
	c, err := r.peek(where)
	if err != nil {
		return 0, nil, err
	}
	if isIntCode(c) {
		v, _, err := r.number(where)
		return EngineHash(v), nil, err
	}
	d, _, err := r.rawStr(true, where)
	if err != nil {
		return 0, nil, r.fail(ErrWrongType, where, "want integer or bytes hash, have code 0x%02x", c)
	}
	return HashFromDigest(d), bytes.Clone(d), nil
}

func (r *reader) hashes(where string) ([]EngineHash, [][]byte, error) {
	n, err := r.containerLen(false, where)
	if err != nil {
		return nil, nil, err
	}
	var hs []EngineHash
	if r.a != nil && n > 0 {
		hs = take(&r.a.hashes, n)
	} else {
		hs = make([]EngineHash, n)
	}
	var raws [][]byte
	for i := range hs {
		h, raw, err := r.hash(where)
		if err != nil {
			return nil, nil, err
		}
		hs[i] = h
		if raw != nil {
			if raws == nil {
				raws = make([][]byte, n)
			}
			raws[i] = raw
		}
	}
	return hs, raws, nil
}

func (r *reader) tokens(where string) ([]uint32, error) {
	n, err := r.containerLen(false, where)
	if err != nil {
		return nil, err
	}
	var ts []uint32
	if r.a != nil && n > 0 {
		ts = take(&r.a.tokens, n)
	} else {
		ts = make([]uint32, n)
	}
	// The common encodings (fixint, uint8, uint16, uint32) are read inline with the offset in a local, the
	// rest through number().
	b, off := r.b, r.off
	for i := range ts {
		if off+5 <= len(b) {
			switch c := b[off]; {
			case c <= 0x7f:
				ts[i] = uint32(c)
				off++
				continue
			case c == 0xcd:
				ts[i] = uint32(b[off+1])<<8 | uint32(b[off+2])
				off += 3
				continue
			case c == 0xce:
				ts[i] = binary.BigEndian.Uint32(b[off+1 : off+5])
				off += 5
				continue
			case c == 0xcc:
				ts[i] = uint32(b[off+1])
				off += 2
				continue
			}
		}
		r.off = off
		v, signed, err := r.number(where)
		if err != nil {
			return nil, err
		}
		if (signed && int64(v) < 0) || v > math.MaxUint32 {
			return nil, r.fail(ErrWrongType, where, "token ID out of uint32 range")
		}
		ts[i] = uint32(v)
		off = r.off
	}
	r.off = off
	return ts, nil
}

// skip skips one value of any type, following at most maxDepth levels of nesting.
func (r *reader) skip(depth int, where string) error {
	if depth > maxDepth {
		return r.fail(ErrTooLarge, where, "nested deeper than %d", maxDepth)
	}
	c, err := r.peek(where)
	if err != nil {
		return err
	}
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		r.off++
		return nil
	case isIntCode(c):
		_, _, err := r.number(where)
		return err
	case c == 0xca:
		r.off++
		return r.need4skip(4, where)
	case c == 0xcb:
		r.off++
		return r.need4skip(8, where)
	case (c >= 0xa0 && c <= 0xbf) || (c >= 0xd9 && c <= 0xdb) || (c >= 0xc4 && c <= 0xc6):
		_, _, err := r.rawStr(true, where)
		return err
	case (c >= 0x90 && c <= 0x9f) || c == 0xdc || c == 0xdd:
		n, err := r.containerLen(false, where)
		if err != nil {
			return err
		}
		for range n {
			if err := r.skip(depth+1, where); err != nil {
				return err
			}
		}
		return nil
	case (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf:
		n, err := r.containerLen(true, where)
		if err != nil {
			return err
		}
		for range 2 * n {
			if err := r.skip(depth+1, where); err != nil {
				return err
			}
		}
		return nil
	case c >= 0xd4 && c <= 0xd8: // fixext: type byte + 1..16 data bytes
		r.off++
		return r.need4skip(1+(1<<(c-0xd4)), where)
	case c >= 0xc7 && c <= 0xc9: // ext8/16/32
		r.off++
		n, err := r.be(1<<(c-0xc7), where)
		if err != nil {
			return err
		}
		if n+1 > uint64(len(r.b)-r.off) {
			return r.fail(ErrTooLarge, where, "ext of %d bytes declared", n)
		}
		r.off += int(n) + 1
		return nil
	}
	return r.fail(ErrMalformed, where, "reserved code 0x%02x", c)
}

func (r *reader) need4skip(n int, where string) error {
	if err := r.need(n, where); err != nil {
		return err
	}
	r.off += n
	return nil
}

// value decodes one extra-key element: nil, bool, int64 (uint64 above MaxInt64), float64, string, []byte
// or []any.
func (r *reader) value(depth int, where string) (any, error) {
	if depth > maxDepth {
		return nil, r.fail(ErrTooLarge, where, "nested deeper than %d", maxDepth)
	}
	c, err := r.peek(where)
	if err != nil {
		return nil, err
	}
	switch {
	case c == 0xc0:
		r.off++
		return nil, nil
	case c == 0xc2 || c == 0xc3:
		r.off++
		return c == 0xc3, nil
	case isIntCode(c):
		v, signed, err := r.number(where)
		if err != nil {
			return nil, err
		}
		if !signed && v > math.MaxInt64 {
			return v, nil
		}
		return int64(v), nil
	case c == 0xca || c == 0xcb:
		r.br.Reset(r.b[r.off:])
		f, err := r.dec.DecodeFloat64()
		if err != nil {
			return nil, r.fail(ErrMalformed, where, "%v", err)
		}
		r.off = len(r.b) - r.br.Len()
		return f, nil
	case (c >= 0xa0 && c <= 0xbf) || (c >= 0xd9 && c <= 0xdb) || (c >= 0xc4 && c <= 0xc6):
		s, isBin, err := r.rawStr(true, where)
		if err != nil {
			return nil, err
		}
		if isBin {
			return bytes.Clone(s), nil
		}
		return string(s), nil
	case (c >= 0x90 && c <= 0x9f) || c == 0xdc || c == 0xdd:
		n, err := r.containerLen(false, where)
		if err != nil {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = r.value(depth+1, where); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, r.fail(ErrWrongType, where, "extra key element with code 0x%02x", c)
}

func (r *reader) extraKeys(where string) ([]ExtraKey, error) {
	if r.tryNil() {
		return nil, nil
	}
	n, err := r.containerLen(false, where)
	if err != nil {
		return nil, err
	}
	out := make([]ExtraKey, n)
	for i := range out {
		if r.tryNil() {
			continue
		}
		m, err := r.containerLen(false, where)
		if err != nil {
			return nil, err
		}
		k := make(ExtraKey, m)
		for j := range k {
			if k[j], err = r.value(1, where); err != nil {
				return nil, err
			}
		}
		out[i] = k
	}
	return out, nil
}

// Decode parses one event-batch payload in any layout (see Layout): an array [ts, events, rank?] or a map
// {"ts", "events", "data_parallel_rank"}; events as tagged arrays or tagged maps; extra trailing array
// elements and unknown map keys are skipped; events with unknown tags are skipped and counted in
// EventBatch.Skipped. Hashes come back as EngineHash (see there), with RawBlockHashes set only for byte-string
// hashes. Errors are *DecodeError; Decode never panics, and allocates at most a small multiple of
// len(payload). Safe for concurrent use; the result does not alias payload.
func Decode(payload []byte) (EventBatch, error) {
	return decodeInto(payload, nil)
}

// decodeInto is Decode with the batch's token, hash and event slices taken from a (reset first) when a is
// not nil: the result is equal to Decode's but aliases a's memory, valid until a is reset or used again.
func decodeInto(payload []byte, a *arena) (EventBatch, error) {
	r := decPool.Get().(*reader)
	defer decPool.Put(r)
	if a != nil {
		a.reset()
	}
	r.b, r.off, r.a = payload, 0, a
	b, err := r.batch()
	r.b, r.a = nil, nil
	r.br.Reset(nil)
	if err != nil {
		return EventBatch{}, err
	}
	return b, nil
}

func (r *reader) batch() (EventBatch, error) {
	var b EventBatch
	c, err := r.peek("batch")
	if err != nil {
		return b, err
	}
	if (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf {
		if err := r.mapBatch(&b); err != nil {
			return b, err
		}
	} else {
		n, err := r.containerLen(false, "batch")
		if err != nil {
			return b, err
		}
		if n < 2 {
			return b, r.fail(ErrWrongType, "batch", "batch array of %d elements, want at least 2", n)
		}
		if b.TS, err = r.ts(); err != nil {
			return b, err
		}
		if err := r.events(&b); err != nil {
			return b, err
		}
		if n >= 3 {
			if b.DataParallelRank, err = r.optInt("batch.data_parallel_rank"); err != nil {
				return b, err
			}
		}
		for i := 3; i < n; i++ {
			if err := r.skip(1, "batch"); err != nil {
				return b, err
			}
		}
	}
	if r.off != len(r.b) {
		return b, r.fail(ErrMalformed, "batch", "%d trailing bytes", len(r.b)-r.off)
	}
	return b, nil
}

func (r *reader) mapBatch(b *EventBatch) error {
	n, err := r.containerLen(true, "batch")
	if err != nil {
		return err
	}
	var haveTS, haveEvents bool
	for range n {
		k, _, err := r.rawStr(false, "batch key")
		if err != nil {
			return err
		}
		switch string(k) {
		case "ts":
			haveTS = true
			if b.TS, err = r.ts(); err != nil {
				return err
			}
		case "events":
			haveEvents = true
			err = r.events(b)
		case "data_parallel_rank", "attn_dp_rank":
			b.DataParallelRank, err = r.optInt("batch.data_parallel_rank")
		default:
			err = r.skip(1, "batch")
		}
		if err != nil {
			return err
		}
	}
	if !haveTS || !haveEvents {
		return r.fail(ErrWrongType, "batch", "map batch without ts or events")
	}
	return nil
}

func (r *reader) ts() (float64, error) {
	c, err := r.peek("batch.ts")
	if err != nil {
		return 0, err
	}
	if c == 0xca || c == 0xcb {
		r.br.Reset(r.b[r.off:])
		f, err := r.dec.DecodeFloat64()
		if err != nil {
			return 0, r.fail(ErrMalformed, "batch.ts", "%v", err)
		}
		r.off = len(r.b) - r.br.Len()
		return f, nil
	}
	if isIntCode(c) {
		v, signed, err := r.number("batch.ts")
		if signed {
			return float64(int64(v)), err
		}
		return float64(v), err
	}
	return 0, r.fail(ErrWrongType, "batch.ts", "want float, have code 0x%02x", c)
}

func (r *reader) events(b *EventBatch) error {
	n, err := r.containerLen(false, "batch.events")
	if err != nil {
		return err
	}
	if r.a != nil && n > 0 {
		b.Events = take(&r.a.events, n)[:0]
	} else {
		b.Events = make([]Event, 0, n)
	}
	for range n {
		c, err := r.peek("event")
		if err != nil {
			return err
		}
		var ev Event
		if (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf {
			ev, err = r.mapEvent()
		} else {
			ev, err = r.arrayEvent()
		}
		if err != nil {
			return err
		}
		if ev == nil {
			b.Skipped++
			continue
		}
		b.Events = append(b.Events, ev)
	}
	return nil
}

// arrayEvent decodes [tag, field...]; nil, nil for an unknown tag (skipped).
func (r *reader) arrayEvent() (Event, error) {
	n, err := r.containerLen(false, "event")
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, r.fail(ErrWrongType, "event", "empty event array")
	}
	tag, _, err := r.rawStr(false, "event tag")
	if err != nil {
		return nil, err
	}
	i := 1
	var ev Event
	switch string(tag) {
	case TagBlockStored:
		if n < 5 {
			return nil, r.fail(ErrWrongType, "BlockStored", "%d elements, want at least 5", n)
		}
		var s BlockStored
		for ; i < n && i <= 11; i++ {
			if err := r.storedField(&s, i); err != nil {
				return nil, err
			}
		}
		ev = s
	case TagBlockRemoved:
		if n < 2 {
			return nil, r.fail(ErrWrongType, "BlockRemoved", "%d elements, want at least 2", n)
		}
		var rm BlockRemoved
		for ; i < n && i <= 3; i++ {
			if err := r.removedField(&rm, i); err != nil {
				return nil, err
			}
		}
		ev = rm
	case TagAllBlocksCleared:
		ev = AllBlocksCleared{}
	}
	for ; i < n; i++ {
		if err := r.skip(1, "event"); err != nil {
			return nil, err
		}
	}
	return ev, nil
}

// Wire positions (array layouts) of BlockStored's fields; map layouts use the names.
var storedNames = map[string]int{
	"block_hashes": 1, "parent_block_hash": 2, "token_ids": 3, "block_size": 4, "lora_id": 5, "medium": 6,
	"lora_name": 7, "extra_keys": 8, "group_idx": 9, "kv_cache_spec_kind": 10, "kv_cache_spec_sliding_window": 11,
	"metadata": 12,
}

var removedNames = map[string]int{"block_hashes": 1, "medium": 2, "group_idx": 3}

func (r *reader) storedField(s *BlockStored, pos int) error {
	var err error
	switch pos {
	case 1:
		s.BlockHashes, s.RawBlockHashes, err = r.hashes("BlockStored.block_hashes")
	case 2:
		if !r.tryNil() {
			var h EngineHash
			h, s.RawParentBlockHash, err = r.hash("BlockStored.parent_block_hash")
			var p *EngineHash
			if r.a != nil {
				p = &take(&r.a.hashes, 1)[0]
			} else {
				p = new(EngineHash)
			}
			*p = h
			s.ParentBlockHash = p
		}
	case 3:
		s.TokenIDs, err = r.tokens("BlockStored.token_ids")
	case 4:
		s.BlockSize, err = r.int("BlockStored.block_size")
		if err == nil && s.BlockSize < 0 {
			err = r.fail(ErrWrongType, "BlockStored.block_size", "negative block size %d", s.BlockSize)
		}
	case 5:
		s.LoRAID, err = r.optInt("BlockStored.lora_id")
	case 6:
		s.Medium, err = r.optStr("BlockStored.medium")
	case 7:
		// vLLM's lora_name, or SGLang's BlockStoredWithMetadata trailing metadata map.
		if c, _ := r.peek("BlockStored.lora_name"); (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf {
			return r.metadata(s)
		}
		s.LoRAName, err = r.optStr("BlockStored.lora_name")
	case 8:
		s.ExtraKeys, err = r.extraKeys("BlockStored.extra_keys")
	case 9:
		s.GroupIdx, err = r.optInt("BlockStored.group_idx")
	case 10:
		s.KVCacheSpecKind, err = r.optStr("BlockStored.kv_cache_spec_kind")
	case 11:
		s.KVCacheSpecSlidingWindow, err = r.optInt("BlockStored.kv_cache_spec_sliding_window")
	case 12:
		if r.tryNil() {
			return nil
		}
		return r.metadata(s)
	default:
		err = r.skip(1, "BlockStored")
	}
	return err
}

// metadata reads SGLang's {cache_salt: str|None, ...}.
func (r *reader) metadata(s *BlockStored) error {
	n, err := r.containerLen(true, "BlockStored.metadata")
	if err != nil {
		return err
	}
	for range n {
		k, _, err := r.rawStr(false, "BlockStored.metadata key")
		if err != nil {
			return err
		}
		if string(k) == "cache_salt" {
			if s.CacheSalt, err = r.optStr("BlockStored.metadata.cache_salt"); err != nil {
				return err
			}
			continue
		}
		if err := r.skip(1, "BlockStored.metadata"); err != nil {
			return err
		}
	}
	return nil
}

func (r *reader) removedField(rm *BlockRemoved, pos int) error {
	var err error
	switch pos {
	case 1:
		rm.BlockHashes, rm.RawBlockHashes, err = r.hashes("BlockRemoved.block_hashes")
	case 2:
		rm.Medium, err = r.optStr("BlockRemoved.medium")
	case 3:
		rm.GroupIdx, err = r.optInt("BlockRemoved.group_idx")
	default:
		err = r.skip(1, "BlockRemoved")
	}
	return err
}

// mapEvent decodes {"type": tag, field: value, ...} (the tag may come at any position).
func (r *reader) mapEvent() (Event, error) {
	start := r.off
	n, err := r.containerLen(true, "event")
	if err != nil {
		return nil, err
	}
	// msgspec writes the tag first: then one pass suffices.
	if n > 0 && r.off+6 <= len(r.b) && string(r.b[r.off:r.off+5]) == "\xa4type" {
		r.off += 5
		tag, _, err := r.rawStr(false, "event tag")
		if err != nil {
			return nil, err
		}
		return r.mapFields(tag, n-1, -1)
	}
	// Otherwise find the tag, then parse again.
	var tag []byte
	for range n {
		k, _, err := r.rawStr(false, "event key")
		if err != nil {
			return nil, err
		}
		if string(k) == "type" {
			if tag, _, err = r.rawStr(false, "event tag"); err != nil {
				return nil, err
			}
			continue
		}
		if err := r.skip(1, "event"); err != nil {
			return nil, err
		}
	}
	end := r.off
	if tag == nil {
		return nil, r.fail(ErrWrongType, "event", "map event without \"type\"")
	}
	r.off = start
	_, _ = r.containerLen(true, "event")
	return r.mapFields(tag, n, end)
}

// mapFields parses n key/value pairs of a map event with the given tag (a "type" key among them is
// skipped). end >= 0 is where the map ends when known (second pass), so an unknown tag skips to it.
func (r *reader) mapFields(tag []byte, n, end int) (Event, error) {
	var names map[string]int
	switch string(tag) {
	case TagBlockStored:
		names = storedNames
	case TagBlockRemoved:
		names = removedNames
	case TagAllBlocksCleared:
		if end >= 0 {
			r.off = end
			return AllBlocksCleared{}, nil
		}
		for range 2 * n {
			if err := r.skip(1, "event"); err != nil {
				return nil, err
			}
		}
		return AllBlocksCleared{}, nil
	default:
		if end >= 0 {
			r.off = end
			return nil, nil
		}
		for range 2 * n {
			if err := r.skip(1, "event"); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}
	stored := string(tag) == TagBlockStored
	var s BlockStored
	var rm BlockRemoved
	seen := 0
	for range n {
		k, _, err := r.rawStr(false, "event key")
		if err != nil {
			return nil, err
		}
		pos, ok := names[string(k)]
		if !ok {
			if err := r.skip(1, "event"); err != nil { // "type" included
				return nil, err
			}
			continue
		}
		seen |= 1 << pos
		if stored {
			err = r.storedField(&s, pos)
		} else {
			err = r.removedField(&rm, pos)
		}
		if err != nil {
			return nil, err
		}
	}
	if seen&(1<<1) == 0 {
		return nil, r.fail(ErrWrongType, string(tag), "map event without block_hashes")
	}
	if stored {
		return s, nil
	}
	return rm, nil
}
