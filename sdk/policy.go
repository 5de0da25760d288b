package sdk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"unsafe"
)

// Policy ranks the endpoints of one request. One value serves one Wasm instance, which the host calls
// from one goroutine at a time, so implementations may keep scratch state without locks.
type Policy interface {
	// Init receives the policy's JSON config (possibly empty) once, before any Choose. A non-nil error
	// makes the host reject the activation.
	Init(config []byte) error
	// Choose appends Endpoint.Index values to r, best first. It should skip unhealthy endpoints, must not
	// add an index twice and should not allocate (a Go guest's GC shows up in tail latency).
	Choose(s *Snapshot, r *Ranking) error
}

// BasePolicy can be embedded to get an Init that accepts only an empty config ("", "{}", whitespace).
type BasePolicy struct{}

// Init accepts an empty config and rejects anything else with a *ConfigError.
func (BasePolicy) Init(config []byte) error { return DecodeConfig(config) }

// Ranking is the ordered answer of Choose: endpoint indices, best first, each at most once.
type Ranking struct {
	idx []uint32
}

// NewRanking returns an empty ranking with room for n indices.
func NewRanking(n int) *Ranking { return &Ranking{idx: make([]uint32, 0, n)} }

// Add appends an endpoint index (an Endpoint.Index value).
func (r *Ranking) Add(index uint32) { r.idx = append(r.idx, index) }

// Len returns the number of ranked endpoints.
func (r *Ranking) Len() int { return len(r.idx) }

// Indices returns the ranked indices, best first. The slice is reused by the next Reset.
func (r *Ranking) Indices() []uint32 { return r.idx }

// Reset empties the ranking, keeping its capacity.
func (r *Ranking) Reset() { r.idx = r.idx[:0] }

// AppendTo lets a policy append indices to the ranking's own storage without a copy:
// r.Set(appendMine(r.AppendTo())). The returned slice is empty, with the ranking's capacity.
func (r *Ranking) AppendTo() []uint32 { return r.idx[:0] }

// Set replaces the ranking by idx (typically the slice AppendTo returned, grown by the policy).
func (r *Ranking) Set(idx []uint32) { r.idx = idx }

// ErrInvalidRanking is returned by Ranking.Check for an index out of range or present twice.
var ErrInvalidRanking = errors.New("sdk: invalid ranking")

// Check verifies that every index is below n and appears at most once. seen is scratch of length ≥ n
// (it is cleared on return); pass nil to let Check allocate.
func (r *Ranking) Check(n int, seen []bool) error {
	if len(r.idx) > n {
		return fmt.Errorf("%w: %d entries for %d endpoints", ErrInvalidRanking, len(r.idx), n)
	}
	if len(seen) < n {
		seen = make([]bool, n)
	}
	var err error
	for _, v := range r.idx {
		if int64(v) >= int64(n) {
			err = fmt.Errorf("%w: index %d out of range [0,%d)", ErrInvalidRanking, v, n)
			break
		}
		if seen[v] {
			err = fmt.Errorf("%w: index %d twice", ErrInvalidRanking, v)
			break
		}
		seen[v] = true
	}
	for _, v := range r.idx {
		if int64(v) < int64(len(seen)) {
			seen[v] = false
		}
	}
	return err
}

// guest is the registered policy plus the per-instance scratch the ABI entry points reuse.
type guest struct {
	policy  Policy
	snap    Snapshot
	own     []Endpoint // records copied out of the buffer when they cannot be used in place
	ranking Ranking
	// seen[v] == gen marks index v as used by the current call; gen advances per call, so the marks
	// need no clearing pass (one guest loop fewer per call; cleared only when gen wraps).
	seen []uint32
	gen  uint32
}

var registered guest

// RankLimited is implemented by a policy that honours Request.RankLimit (ABI v1.1): it may return only the
// first RankLimit entries of its ranking, which must be the first entries of its whole ranking. A module
// whose registered policy implements it declares ABI minor 1 (kvgate_policy_abi_minor), so the host sends it
// the limit; hosts before v1.1 refuse such a module. Every other policy declares minor 0 and is loaded by
// every v1 host, which then sends RankLimit 0 (rank everything). plugins/ABI.md, "v1.1".
type RankLimited interface {
	Policy
	HonorsRankLimit()
}

// declaredMinor is the ABI minor version the registered policy declares (see RankLimited).
func declaredMinor() int32 {
	if _, ok := registered.policy.(RankLimited); ok {
		return ABIMinor
	}
	return 0
}

// Register installs the policy this module exports. Call it exactly once, from init() of the policy's
// main package. A second call panics: a module exports one policy.
func Register(p Policy) {
	if registered.policy != nil {
		panic("sdk: Register called twice")
	}
	if p == nil {
		panic("sdk: Register(nil)")
	}
	registered = guest{
		policy:  p,
		own:     make([]Endpoint, 64),
		ranking: Ranking{idx: make([]uint32, 0, 64)},
		seen:    make([]uint32, 64),
	}
}

// handleInit runs Init on config; it is the body of the init export.
func (g *guest) handleInit(config []byte) (code int32) {
	if g.policy == nil {
		return ErrCodeNotRegistered
	}
	defer func() {
		if r := recover(); r != nil {
			report("init panicked", r)
			code = ErrCodePanic
		}
	}()
	if err := g.policy.Init(config); err != nil {
		report("init rejected the config", err)
		return ErrCodeConfig
	}
	return 0
}

// report writes why init or choose failed to stderr, which the host keeps (the first few KiB per instance)
// and shows in validation reports and init errors.
func report(what string, why any) {
	fmt.Fprintf(os.Stderr, "kvgate policy: %s: %v\n", what, why)
}

// handleChoose decodes the snapshot in buf[:n], runs Choose and writes the ranking at buf[0:]. It returns
// the ranking length or a negative error code; it is the body of the choose export.
func (g *guest) handleChoose(buf []byte, n int) (code int32) {
	if g.policy == nil {
		return ErrCodeNotRegistered
	}
	if n < 0 || n > len(buf) {
		return ErrCodeMalformed
	}
	defer func() {
		if r := recover(); r != nil {
			report("choose panicked", r)
			code = ErrCodePanic
		}
	}()
	// The work around Choose is in small functions: Go's wasm code spills every register a function
	// uses at each jump, and a smaller hot path is less code to fetch again after the CPU was taken away.
	ne, code := g.load(buf, n)
	if code != 0 {
		return code
	}
	if err := g.policy.Choose(&g.snap, &g.ranking); err != nil {
		return ErrCodePolicy
	}
	idx := g.ranking.idx
	if len(idx) > ne {
		return ErrCodeInvalidRanking
	}
	return putChecked(buf[:4*len(idx)], idx, g.seen[:ne+1], g.gen)
}

// load decodes the snapshot in buf[:n] into g.snap, readies the ranking and the duplicate marks for a
// call and returns the endpoint count, or a negative error code.
//
//go:noinline
func (g *guest) load(buf []byte, n int) (int, int32) {
	hs, rs, ne, err := decodeHeader(buf[:n], &g.snap.Request)
	if err != nil {
		return 0, ErrCodeMalformed
	}
	if 4*ne > len(buf) {
		return 0, ErrCodeTooMany
	}
	// A v1.0 snapshot's records are used in place; the policy sees them until it returns, and the
	// ranking is written over the buffer only after that.
	if eps := recordsInPlace(buf[:n], hs, rs, ne); eps != nil {
		g.snap.Endpoints = eps
	} else {
		g.copyRecords(buf[:n], hs, rs, ne)
	}
	if cap(g.ranking.idx) < ne || len(g.seen) <= ne {
		g.grow(ne)
	}
	g.gen++
	if g.gen == 0 {
		clear(g.seen)
		g.gen = 1
	}
	g.ranking.Reset()
	return ne, 0
}

// copyRecords decodes the ne records at buf[hs:] (stride rs) into the guest's own endpoint array.
func (g *guest) copyRecords(buf []byte, hs, rs, ne int) {
	if cap(g.own) < ne {
		g.own = make([]Endpoint, ne)
	}
	g.snap.Endpoints = g.own[:ne]
	decodeRecords(buf, hs, rs, g.snap.Endpoints)
}

// grow makes room for a ranking of ne indices and their duplicate marks (one spare slot).
func (g *guest) grow(ne int) {
	if cap(g.ranking.idx) < ne {
		g.ranking.idx = make([]uint32, 0, ne)
	}
	if len(g.seen) <= ne {
		g.seen = make([]uint32, ne+1)
	}
}

// putChecked writes idx as the ABI's ranking (little-endian uint32 values) over buf and returns its
// length, or ErrCodeInvalidRanking when an index is ≥ len(seen)−1 (the endpoint count) or repeats;
// seen[v] == gen marks index v used by this call, and seen's last slot absorbs out-of-range values.
// buf holds exactly 4·len(idx) bytes.
//
// Check and write back are one pass without a branch or a bounds check in the loop: in Go's wasm code
// every jump goes through the function's dispatch loop, and with interruption on every loop iteration
// also exits to the host, so the SDK keeps its loops few and straight.
//
//go:noinline
func putChecked(buf []byte, idx, seen []uint32, gen uint32) int32 {
	ne := uint32(len(seen) - 1)
	buf = buf[:4*len(idx)]
	seenp := unsafe.Pointer(unsafe.SliceData(seen))
	var bad uint32
	for k, v := range idx {
		// j = min(v, ne) ≤ ne < len(seen), in arithmetic: the compiler will not use a select for a
		// value that addresses memory, and a branch is a jump through the dispatch loop.
		d := int64(v) - int64(ne)
		m := uint64(d >> 63) // all ones when v < ne
		j := uint64(ne) + uint64(d)&m
		s := (*uint32)(unsafe.Add(seenp, uintptr(j)*4))
		var b, c uint32
		if v >= ne {
			b = 1
		}
		if *s == gen {
			c = 1
		}
		bad |= b | c
		*s = gen
		if wasmGuest {
			// Wasm has no alignment rule and is little-endian: one 32-bit store.
			*(*uint32)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(buf)), uintptr(k)*4)) = v
		} else {
			binary.LittleEndian.PutUint32(buf[4*k:], v)
		}
	}
	if bad != 0 {
		return ErrCodeInvalidRanking
	}
	return int32(len(idx))
}

// wasmGuest is true when this package is compiled into a Wasm guest.
const wasmGuest = runtime.GOARCH == "wasm"

// ChooseABI runs p on an encoded snapshot exactly as the Wasm exports would (decode, Choose, check,
// write the ranking at buf[0:]), natively. It returns the ranking length or a negative ErrCode. Test
// harnesses use it to exercise the ABI path without Wasm; it allocates per call.
func ChooseABI(p Policy, buf []byte, n int) (int32, []uint32) {
	g := guest{policy: p}
	code := g.handleChoose(buf, n)
	if code < 0 {
		return code, nil
	}
	out := make([]uint32, code)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(buf[4*i:])
	}
	return code, out
}
