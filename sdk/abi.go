package sdk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"unsafe"
)

// littleEndian is true on the platforms where Endpoint can be copied from a record as is.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// ABI v1 constants. The layout is specified in plugins/ABI.md; this file is its one Go encoder and
// decoder, shared by the host (plugins) and the guest SDK.
const (
	// ABIMajor is the major ABI version; a guest declares it with the export ExportMarker.
	ABIMajor = 1
	// ABIMinor is the minor version this SDK and host implement; later minors only append fields (v1.1:
	// the header's rank_limit, Request.RankLimit).
	ABIMinor = 1
	// Magic is the first header word, the bytes "KVGP" read as a little-endian uint32.
	Magic uint32 = 0x5047564b
	// HeaderSize is the v1.0 header size in bytes (the header states its own size; readers skip extra).
	HeaderSize = 64
	// RecordSize is the v1.0 per-endpoint record size in bytes (stated in the header; readers skip extra).
	RecordSize = 48
	// BufferSize is the size in bytes of the buffer this SDK exports (snapshot in, ranking or config in).
	BufferSize = 1 << 16
	// MaxEndpoints is the most endpoint records a v1.0 snapshot fits into BufferSize.
	MaxEndpoints = (BufferSize - HeaderSize) / RecordSize
)

// Names of the guest exports required by ABI v1.
const (
	ExportMarker   = "kvgate_policy_abi_v1"    // () -> (): never called; marks the major version
	ExportMinor    = "kvgate_policy_abi_minor" // () -> i32: the guest's minor version
	ExportBuf      = "kvgate_policy_buf"       // () -> i32: guest address of the shared buffer
	ExportBufCap   = "kvgate_policy_buf_cap"   // () -> i32: its size in bytes
	ExportInit     = "kvgate_policy_init"      // (config_len i32) -> i32: 0 or a negative ErrCode
	ExportChoose   = "kvgate_policy_choose"    // (snapshot_len i32) -> i32: ranking count or negative
	ExportMemory   = "memory"
	ExportInitWASI = "_initialize" // Go c-shared reactors export it; the host runs it as start function
)

// Error codes a guest returns from init or choose (negative i32). The host treats every negative value
// as a failed call and falls back; codes below ErrCodeUser are the policy's own.
const (
	ErrCodeMalformed      int32 = -1 // snapshot header or length invalid
	ErrCodeTooMany        int32 = -2 // more endpoints than the guest's buffer or tables hold
	ErrCodeConfig         int32 = -3 // init: the config JSON was rejected
	ErrCodeNotRegistered  int32 = -4 // no policy was registered (sdk.Register not called)
	ErrCodePolicy         int32 = -5 // the policy's Choose returned an error
	ErrCodeInvalidRanking int32 = -6 // the policy produced an out-of-range or duplicate index
	ErrCodePanic          int32 = -9 // the policy panicked; the SDK recovered
	ErrCodeUser           int32 = -100
)

// FlagHealthy is bit 0 of Endpoint.Flags: the endpoint passes health checks. Other bits are reserved (0).
const FlagHealthy uint32 = 1

// Request is the per-request part of the snapshot header.
type Request struct {
	Seq          uint64 // request sequence number, increasing per model on one gateway (round-robin)
	PromptTokens uint32 // prompt length in tokens (0 for an empty prompt)
	PromptBlocks uint32 // full blocks in the prompt: PromptTokens / BlockSize
	BlockSize    uint32 // tokens per block (16 by default)
	ModelHash    uint64 // 64-bit hash of model name and LoRA name
	Seed         uint64 // host-supplied random seed; the only randomness a policy may use
	// RankLimit (ABI v1.1, header offset 36) is how many ranking entries the host reads now: 0 means the
	// whole ranking; L > 0 lets a policy return only the first L entries of the ranking it returns with
	// RankLimit 0 (the host asks again with 0 if it needs more). A policy may ignore it.
	RankLimit uint32
}

// Endpoint is one candidate endpoint's record.
type Endpoint struct {
	Index              uint32  // position in the host's snapshot; rankings refer to it
	Flags              uint32  // FlagHealthy and reserved bits
	GPUBlocks          uint32  // prompt blocks matched consecutively from block 0 and held on GPU
	CPUBlocks          uint32  // further consecutive matched blocks held only in CPU (offload) memory
	Waiting            uint32  // requests queued in the engine (engine metric)
	Running            uint32  // requests running in the engine (engine metric)
	InFlightRequests   uint32  // requests reserved by gateways and not yet finished
	KVCacheUtilization float32 // fraction of the engine's KV cache in use, [0,1]
	InFlightTokens     uint64  // prompt+output tokens reserved by gateways
	// The record's reserved bytes 40..47: with them Endpoint is exactly a v1.0 record (48 bytes), so
	// the guest SDK reads the snapshot buffer's records in place (recordsInPlace).
	_ uint64
}

// Healthy reports whether FlagHealthy is set.
func (e *Endpoint) Healthy() bool { return e.Flags&FlagHealthy != 0 }

// Snapshot is what a policy sees for one request: the request and every candidate endpoint.
type Snapshot struct {
	Request   Request    // the request being routed
	Endpoints []Endpoint // the candidates; Endpoint.Index is each one's position here
}

// ErrMalformed is returned by DecodeSnapshot for a buffer that does not hold a valid v1 snapshot.
var ErrMalformed = errors.New("sdk: malformed snapshot")

// ErrTooLarge is returned by EncodeSnapshot when the snapshot does not fit the buffer.
var ErrTooLarge = errors.New("sdk: snapshot larger than buffer")

// EncodedSize returns the encoded v1.0 size in bytes of a snapshot with n endpoints.
func EncodedSize(n int) int { return HeaderSize + n*RecordSize }

// EncodeSnapshot writes s into buf in the v1 layout and returns the number of bytes written; the header's
// abi_minor is 1 when Request.RankLimit (the one v1.1 field) is set, else 0 (the v1.0 bytes).
// KV-cache utilization is clamped to [0,1] (NaN becomes 0). Endpoint.Index is written as given.
func EncodeSnapshot(buf []byte, s *Snapshot) (int, error) {
	n := len(s.Endpoints)
	size := EncodedSize(n)
	if size > len(buf) || n > math.MaxUint32 {
		return 0, fmt.Errorf("%w: %d endpoints need %d bytes, have %d", ErrTooLarge, n, size, len(buf))
	}
	le := binary.LittleEndian
	h := buf[:HeaderSize]
	le.PutUint32(h[0:], Magic)
	// A snapshot without a v1.1 field set is a v1.0 snapshot byte for byte, and says so: a v1.0 guest
	// sees exactly what it always saw.
	minor := uint16(0)
	if s.Request.RankLimit != 0 {
		minor = 1
	}
	le.PutUint16(h[4:], minor)
	le.PutUint16(h[6:], HeaderSize)
	le.PutUint16(h[8:], RecordSize)
	le.PutUint16(h[10:], 0)
	le.PutUint32(h[12:], uint32(n))
	r := &s.Request
	le.PutUint64(h[16:], r.Seq)
	le.PutUint32(h[24:], r.PromptTokens)
	le.PutUint32(h[28:], r.PromptBlocks)
	le.PutUint32(h[32:], r.BlockSize)
	le.PutUint32(h[36:], r.RankLimit)
	le.PutUint64(h[40:], r.ModelHash)
	le.PutUint64(h[48:], r.Seed)
	le.PutUint64(h[56:], 0)
	off := HeaderSize
	if littleEndian && n > 0 {
		// Endpoint is a v1.0 record in memory (TestEndpointLayout): one copy for all records, then
		// the clamp and the reserved word per record (the host encodes on every routing decision).
		copy(buf[off:size], unsafe.Slice((*byte)(unsafe.Pointer(&s.Endpoints[0])), n*RecordSize))
		if uintptr(unsafe.Pointer(&buf[off]))%unsafe.Alignof(Endpoint{}) == 0 {
			// The records just copied, as Endpoints (buf[off:size] holds exactly n of them): no
			// bounds check or byte-slice header per record (256 endpoints: 0.78 → 0.50 µs).
			recs := unsafe.Slice((*Endpoint)(unsafe.Pointer(&buf[off])), n)
			for i := range recs {
				e := &recs[i]
				if u := e.KVCacheUtilization; !(u >= 0 && u <= 1) {
					e.KVCacheUtilization = clampUtil(u)
				}
				*(*uint64)(unsafe.Add(unsafe.Pointer(e), 40)) = 0 // the reserved word (Endpoint's blank field)
			}
			return size, nil
		}
		for i := range s.Endpoints {
			b := buf[off : off+RecordSize]
			if u := s.Endpoints[i].KVCacheUtilization; !(u >= 0 && u <= 1) {
				le.PutUint32(b[28:], math.Float32bits(clampUtil(u)))
			}
			le.PutUint64(b[40:], 0)
			off += RecordSize
		}
		return size, nil
	}
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		b := buf[off : off+RecordSize]
		le.PutUint32(b[0:], e.Index)
		le.PutUint32(b[4:], e.Flags)
		le.PutUint32(b[8:], e.GPUBlocks)
		le.PutUint32(b[12:], e.CPUBlocks)
		le.PutUint32(b[16:], e.Waiting)
		le.PutUint32(b[20:], e.Running)
		le.PutUint32(b[24:], e.InFlightRequests)
		le.PutUint32(b[28:], math.Float32bits(clampUtil(e.KVCacheUtilization)))
		le.PutUint64(b[32:], e.InFlightTokens)
		le.PutUint64(b[40:], 0)
		off += RecordSize
	}
	return size, nil
}

func clampUtil(u float32) float32 {
	switch {
	case !(u >= 0): // also NaN
		return 0
	case u > 1:
		return 1
	}
	return u
}

// DecodeSnapshot reads a v1 snapshot of any minor version from buf into s, reusing s.Endpoints' backing
// array (it allocates only when the capacity is too small). Header and record sizes are taken from the
// header; fields a newer minor appends are skipped. It fails with ErrMalformed on a bad magic, sizes
// smaller than v1.0's, or a buffer shorter than the header says.
func DecodeSnapshot(buf []byte, s *Snapshot) error {
	hs, rs, n, err := decodeHeader(buf, &s.Request)
	if err != nil {
		return err
	}
	if cap(s.Endpoints) < n {
		s.Endpoints = make([]Endpoint, n)
	}
	s.Endpoints = s.Endpoints[:n]
	decodeRecords(buf, hs, rs, s.Endpoints)
	return nil
}

// decodeHeader checks buf's header, decodes the request into req and returns the header size, the
// record size and the record count (the records lie within buf).
func decodeHeader(buf []byte, req *Request) (hs, rs, n int, err error) {
	if len(buf) < HeaderSize {
		return 0, 0, 0, ErrMalformed
	}
	le := binary.LittleEndian
	if le.Uint32(buf[0:]) != Magic {
		return 0, 0, 0, ErrMalformed
	}
	hs = int(le.Uint16(buf[6:]))
	rs = int(le.Uint16(buf[8:]))
	n = int(le.Uint32(buf[12:]))
	if hs < HeaderSize || rs < RecordSize || n < 0 || n > (len(buf)-hs)/rs || hs > len(buf) {
		return 0, 0, 0, ErrMalformed
	}
	*req = Request{
		Seq:          le.Uint64(buf[16:]),
		PromptTokens: le.Uint32(buf[24:]),
		PromptBlocks: le.Uint32(buf[28:]),
		BlockSize:    le.Uint32(buf[32:]),
		ModelHash:    le.Uint64(buf[40:]),
		Seed:         le.Uint64(buf[48:]),
		RankLimit:    le.Uint32(buf[36:]),
	}
	return hs, rs, n, nil
}

// recordsInPlace returns the n records at buf[hs:] as Endpoints sharing buf's memory, or nil when the
// layout does not allow it (big-endian machine, a record size other than v1.0's, misaligned buffer).
// The header must have passed decodeHeader.
func recordsInPlace(buf []byte, hs, rs, n int) []Endpoint {
	if !littleEndian || rs != RecordSize || n == 0 || uintptr(unsafe.Pointer(&buf[hs]))%unsafe.Alignof(Endpoint{}) != 0 {
		return nil
	}
	return unsafe.Slice((*Endpoint)(unsafe.Pointer(&buf[hs])), n)
}

// decodeRecords copies the len(eps) records at buf[hs:] (stride rs) into eps.
func decodeRecords(buf []byte, hs, rs int, eps []Endpoint) {
	le := binary.LittleEndian
	off := hs
	if littleEndian {
		// Endpoint's memory layout is the record's first 48 bytes (TestEndpointLayout), so on
		// little-endian machines (wasm, amd64, arm64) a record is one copy.
		for i := range eps {
			b := buf[off : off+RecordSize]
			eps[i] = *(*Endpoint)(unsafe.Pointer(&b[0]))
			off += rs
		}
		return
	}
	for i := range eps {
		b := buf[off : off+RecordSize]
		eps[i] = Endpoint{
			Index:              le.Uint32(b[0:]),
			Flags:              le.Uint32(b[4:]),
			GPUBlocks:          le.Uint32(b[8:]),
			CPUBlocks:          le.Uint32(b[12:]),
			Waiting:            le.Uint32(b[16:]),
			Running:            le.Uint32(b[20:]),
			InFlightRequests:   le.Uint32(b[24:]),
			KVCacheUtilization: math.Float32frombits(le.Uint32(b[28:])),
			InFlightTokens:     le.Uint64(b[32:]),
		}
		off += rs
	}
}

// PutRanking writes idx as little-endian uint32 values at the start of buf (the ABI's ranking layout) and
// returns the byte count. buf must hold 4·len(idx) bytes.
func PutRanking(buf []byte, idx []uint32) int {
	for i, v := range idx {
		binary.LittleEndian.PutUint32(buf[4*i:], v)
	}
	return 4 * len(idx)
}
