package sdk

import (
	"encoding/binary"
	"errors"
	"go/build"
	"math"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// golden is a 2-endpoint v1.0 snapshot written out by hand from ABI.md's tables (not by our encoder).
func golden() []byte {
	b := make([]byte, 64+2*48)
	le := binary.LittleEndian
	copy(b[0:], "KVGP")
	le.PutUint16(b[4:], 0)  // minor
	le.PutUint16(b[6:], 64) // header size
	le.PutUint16(b[8:], 48) // record size
	le.PutUint32(b[12:], 2) // n
	le.PutUint64(b[16:], 77)
	le.PutUint32(b[24:], 40)
	le.PutUint32(b[28:], 2)
	le.PutUint32(b[32:], 16)
	le.PutUint64(b[40:], 0xabcdef)
	le.PutUint64(b[48:], 0x1234)
	r := b[64:]
	le.PutUint32(r[0:], 0)
	le.PutUint32(r[4:], 1)
	le.PutUint32(r[8:], 2)
	le.PutUint32(r[12:], 0)
	le.PutUint32(r[16:], 3)
	le.PutUint32(r[20:], 4)
	le.PutUint32(r[24:], 5)
	le.PutUint32(r[28:], 0x3f000000) // 0.5f
	le.PutUint64(r[32:], 6000)
	r = b[112:]
	le.PutUint32(r[0:], 1)
	le.PutUint32(r[8:], 0)
	le.PutUint32(r[12:], 1)
	le.PutUint32(r[28:], 0x3f800000) // 1.0f
	return b
}

func goldenSnapshot() Snapshot {
	return Snapshot{
		Request: Request{Seq: 77, PromptTokens: 40, PromptBlocks: 2, BlockSize: 16, ModelHash: 0xabcdef, Seed: 0x1234},
		Endpoints: []Endpoint{
			{Index: 0, Flags: FlagHealthy, GPUBlocks: 2, Waiting: 3, Running: 4, InFlightRequests: 5, KVCacheUtilization: 0.5, InFlightTokens: 6000},
			{Index: 1, CPUBlocks: 1, KVCacheUtilization: 1},
		},
	}
}

func TestEncodeGolden(t *testing.T) {
	s := goldenSnapshot()
	buf := make([]byte, 1024)
	n, err := EncodeSnapshot(buf, &s)
	if err != nil || n != 160 {
		t.Fatalf("n=%d err=%v", n, err)
	}
	if want := golden(); !slices.Equal(buf[:n], want) {
		t.Fatalf("encoded\n%x\nwant\n%x", buf[:n], want)
	}
}

func TestDecodeGolden(t *testing.T) {
	var s Snapshot
	if err := DecodeSnapshot(golden(), &s); err != nil {
		t.Fatal(err)
	}
	want := goldenSnapshot()
	if s.Request != want.Request || !slices.Equal(s.Endpoints, want.Endpoints) {
		t.Fatalf("decoded %+v\nwant %+v", s, want)
	}
}

// TestRankLimitGolden: a snapshot with Request.RankLimit set is a v1.1 snapshot: abi_minor 1 and the
// limit at header offset 36 (ABI.md), the rest the v1.0 golden's bytes; it decodes back.
func TestRankLimitGolden(t *testing.T) {
	s := goldenSnapshot()
	s.Request.RankLimit = 8
	want := golden()
	binary.LittleEndian.PutUint16(want[4:], 1)
	binary.LittleEndian.PutUint32(want[36:], 8)
	buf := make([]byte, 1024)
	n, err := EncodeSnapshot(buf, &s)
	if err != nil || !slices.Equal(buf[:n], want) {
		t.Fatalf("encoded (%v)\n%x\nwant\n%x", err, buf[:n], want)
	}
	var d Snapshot
	if err := DecodeSnapshot(want, &d); err != nil || d.Request != s.Request {
		t.Fatalf("decoded %+v (%v), want %+v", d.Request, err, s.Request)
	}
}

// TestDecodeNewerMinor: a later minor appends header and record fields; a v1.0 reader skips them.
func TestDecodeNewerMinor(t *testing.T) {
	old := golden()
	const hs, rs = 72, 56
	b := make([]byte, hs+2*rs)
	copy(b, old[:64])
	binary.LittleEndian.PutUint16(b[4:], 3)
	binary.LittleEndian.PutUint16(b[6:], hs)
	binary.LittleEndian.PutUint16(b[8:], rs)
	for i := range 2 {
		copy(b[hs+i*rs:], old[64+i*48:64+(i+1)*48])
		binary.LittleEndian.PutUint64(b[hs+i*rs+48:], math.MaxUint64) // a new field
	}
	var s Snapshot
	if err := DecodeSnapshot(b, &s); err != nil {
		t.Fatal(err)
	}
	if want := goldenSnapshot(); !slices.Equal(s.Endpoints, want.Endpoints) {
		t.Fatalf("%+v", s.Endpoints)
	}
}

func TestDecodeMalformed(t *testing.T) {
	g := golden()
	for name, b := range map[string][]byte{
		"short":         g[:63],
		"bad magic":     append([]byte("KVGQ"), g[4:]...),
		"truncated":     g[:159],
		"small header":  func() []byte { c := slices.Clone(g); binary.LittleEndian.PutUint16(c[6:], 32); return c }(),
		"small record":  func() []byte { c := slices.Clone(g); binary.LittleEndian.PutUint16(c[8:], 40); return c }(),
		"huge n":        func() []byte { c := slices.Clone(g); binary.LittleEndian.PutUint32(c[12:], math.MaxUint32); return c }(),
		"header > size": func() []byte { c := slices.Clone(g); binary.LittleEndian.PutUint16(c[6:], 4000); return c }(),
	} {
		var s Snapshot
		if err := DecodeSnapshot(b, &s); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestEncodeClampsAndRejects(t *testing.T) {
	s := Snapshot{Endpoints: []Endpoint{{KVCacheUtilization: float32(math.NaN())}, {KVCacheUtilization: 7}, {KVCacheUtilization: -1}}}
	buf := make([]byte, EncodedSize(3))
	if _, err := EncodeSnapshot(buf, &s); err != nil {
		t.Fatal(err)
	}
	var d Snapshot
	if err := DecodeSnapshot(buf, &d); err != nil {
		t.Fatal(err)
	}
	if d.Endpoints[0].KVCacheUtilization != 0 || d.Endpoints[1].KVCacheUtilization != 1 || d.Endpoints[2].KVCacheUtilization != 0 {
		t.Fatalf("%+v", d.Endpoints)
	}
	if _, err := EncodeSnapshot(buf[:EncodedSize(3)-1], &s); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("short buffer: %v", err)
	}
}

type panicky struct{ BasePolicy }

func (panicky) Choose(*Snapshot, *Ranking) error { panic("boom") }

type dup struct{ BasePolicy }

func (dup) Choose(_ *Snapshot, r *Ranking) error { r.Add(0); r.Add(0); return nil }

// adds ranks exactly its own indices, valid or not.
type adds []uint32

func (adds) Init([]byte) error { return nil }

func (a adds) Choose(_ *Snapshot, r *Ranking) error {
	for _, v := range a {
		r.Add(v)
	}
	return nil
}

type failing struct{ BasePolicy }

func (failing) Choose(*Snapshot, *Ranking) error { return errors.New("no") }

type reverse struct{ BasePolicy }

func (reverse) Choose(s *Snapshot, r *Ranking) error {
	for i := len(s.Endpoints) - 1; i >= 0; i-- {
		r.Add(s.Endpoints[i].Index)
	}
	return nil
}

func TestChooseABI(t *testing.T) {
	for name, c := range map[string]struct {
		p    Policy
		code int32
		want []uint32
	}{
		"panic":     {panicky{}, ErrCodePanic, nil},
		"duplicate": {dup{}, ErrCodeInvalidRanking, nil},
		"index = n": {adds{1, 2}, ErrCodeInvalidRanking, nil},
		"index max": {adds{math.MaxUint32}, ErrCodeInvalidRanking, nil},
		"too many":  {adds{0, 1, 0}, ErrCodeInvalidRanking, nil},
		"partial":   {adds{1}, 1, []uint32{1}},
		"error":     {failing{}, ErrCodePolicy, nil},
		"ok":        {reverse{}, 2, []uint32{1, 0}},
	} {
		buf := golden()
		code, got := ChooseABI(c.p, buf, len(buf))
		if code != c.code || !slices.Equal(got, c.want) {
			t.Errorf("%s: code %d ranking %v", name, code, got)
		}
	}
	buf := golden()
	if code, _ := ChooseABI(reverse{}, buf, 10); code != ErrCodeMalformed {
		t.Errorf("short input: %d", code)
	}
}

// TestChooseAllocationFree: the guest hot path (decode, Choose, check, write) does not allocate once its
// scratch has grown.
func TestChooseAllocationFree(t *testing.T) {
	g := guest{policy: reverse{}}
	buf := golden()
	g.handleChoose(slices.Clone(buf), len(buf))
	work := make([]byte, len(buf))
	allocs := testing.AllocsPerRun(100, func() {
		copy(work, buf)
		if g.handleChoose(work, len(buf)) != 2 {
			t.Fatal("choose failed")
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per call", allocs)
	}
}

func TestDecodeConfig(t *testing.T) {
	var a, b float64 = 1, 2
	fields := []Field{{Name: "a", Dst: &a, Min: 0, Max: 10}, {Name: "b", Dst: &b, Min: -1, Max: 1}}
	for _, ok := range []string{"", "  ", "{}", ` { "a" : 3.5e0 , "b":-1 } `} {
		if err := DecodeConfig([]byte(ok), fields...); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	if a != 3.5 || b != -1 {
		t.Fatalf("a=%v b=%v", a, b)
	}
	for in, key := range map[string]string{
		`{"c": 1}`:          "c",
		`{"a": 11}`:         "a",
		`{"a": 1, "a": 2}`:  "a",
		`{"a": true}`:       "a",
		`{"a": "1"}`:        "a",
		`{"a": 1e999}`:      "a",
		`{"a": 1,}`:         "",
		`{"a": 1} x`:        "",
		`[1]`:               "",
		`{"a\u0062": 1}`:    "",
		`{"a": 1`:           "",
		`{"a": {"b": 1}}`:   "a",
		`{"a": 0x10}`:       "",
		`{"a": +1}`:         "a",
		`{"a": 1, "b": 2}`:  "b",
		"{\"a\": 1}\x00":    "",
		`{"a": --1}`:        "a",
		`{"a": 1.2.3}`:      "a",
		`{"a": Infinity}`:   "a",
		`{"a": NaN}`:        "a",
		`{"a": -0, "b": 0}`: "none",
	} {
		err := DecodeConfig([]byte(in), fields...)
		var ce *ConfigError
		if key == "none" {
			if err != nil {
				t.Errorf("%q: %v", in, err)
			}
			continue
		}
		if !errors.As(err, &ce) || ce.Key != key {
			t.Errorf("%q: err %v, want a ConfigError for key %q", in, err, key)
		}
	}
}

func TestRand(t *testing.T) {
	// SplitMix64 reference outputs for seed 0 (Vigna's splitmix64.c; also used by Java's
	// SplittableRandom): 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f.
	r := NewRand(0)
	for _, want := range []uint64{0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f} {
		if got := r.Uint64(); got != want {
			t.Fatalf("got %#x want %#x", got, want)
		}
	}
	r = NewRand(99)
	for range 1000 {
		if v := r.Intn(3); v < 0 || v >= 3 {
			t.Fatal(v)
		}
	}
}

// TestStandardLibraryOnly: sdk (what guests link) imports nothing outside the standard library.
func TestStandardLibraryOnly(t *testing.T) {
	for _, goos := range []string{"", "wasip1"} {
		ctx := build.Default
		if goos != "" {
			ctx.GOOS, ctx.GOARCH = goos, "wasm"
		}
		pkg, err := ctx.ImportDir(".", 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range pkg.Imports {
			if strings.Contains(strings.Split(imp, "/")[0], ".") {
				t.Errorf("GOOS=%q: sdk imports %s", goos, imp)
			}
		}
	}
}

// TestEndpointLayout: Endpoint's fields sit at the record offsets of ABI.md and its size is a v1.0
// record's, which DecodeSnapshot's single-copy path and the guest's in-place records rely on.
func TestEndpointLayout(t *testing.T) {
	var e Endpoint
	got := []uintptr{unsafe.Offsetof(e.Index), unsafe.Offsetof(e.Flags), unsafe.Offsetof(e.GPUBlocks),
		unsafe.Offsetof(e.CPUBlocks), unsafe.Offsetof(e.Waiting), unsafe.Offsetof(e.Running),
		unsafe.Offsetof(e.InFlightRequests), unsafe.Offsetof(e.KVCacheUtilization), unsafe.Offsetof(e.InFlightTokens)}
	want := []uintptr{0, 4, 8, 12, 16, 20, 24, 28, 32}
	if !slices.Equal(got, want) || unsafe.Sizeof(e) != RecordSize {
		t.Fatalf("offsets %v size %d", got, unsafe.Sizeof(e))
	}
}

// TestDecodePortable: the field-by-field decoder (big-endian hosts) gives the same result.
func TestDecodePortable(t *testing.T) {
	defer func(v bool) { littleEndian = v }(littleEndian)
	littleEndian = false
	TestDecodeGolden(t)
	TestDecodeNewerMinor(t)
}

// TestEncodePortable: the field-by-field encoder (big-endian hosts) writes the same bytes as the
// single-copy one.
func TestEncodePortable(t *testing.T) {
	defer func(v bool) { littleEndian = v }(littleEndian)
	littleEndian = false
	TestEncodeGolden(t)
	TestEncodeClampsAndRejects(t)
	TestEncodeZeroesReserved(t)
}

// TestEncodeZeroesReserved: an Endpoint decoded from a record whose reserved bytes are set (its blank
// field then holds them) is encoded with the reserved bytes 0, as ABI.md requires.
func TestEncodeZeroesReserved(t *testing.T) {
	b := golden()
	for i := 40; i < 48; i++ {
		b[64+i], b[112+i] = 0xff, 0xee
	}
	var s Snapshot
	if err := DecodeSnapshot(b, &s); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, EncodedSize(2))
	if _, err := EncodeSnapshot(out, &s); err != nil {
		t.Fatal(err)
	}
	if want := golden(); !slices.Equal(out, want) {
		t.Fatalf("encoded\\n%x\\nwant\\n%x", out, want)
	}
}

// TestChooseSeenGenerations: the duplicate check's per-call marks stay correct across many calls on one
// guest and across the generation counter's wrap (an old call's marks must not reject a valid ranking,
// and a duplicate must still be caught).
func TestChooseSeenGenerations(t *testing.T) {
	ok := &guest{policy: reverse{}}
	bad := &guest{policy: dup{}}
	buf := golden()
	for _, start := range []uint32{0, 1<<32 - 3} {
		ok.gen, bad.gen = start, start
		for call := range 6 {
			work := slices.Clone(buf)
			if code := ok.handleChoose(work, len(buf)); code != 2 {
				t.Fatalf("gen start %d call %d: valid ranking got code %d", start, call, code)
			}
			work = slices.Clone(buf)
			if code := bad.handleChoose(work, len(buf)); code != ErrCodeInvalidRanking {
				t.Fatalf("gen start %d call %d: duplicate got code %d", start, call, code)
			}
		}
	}
}

// recorder keeps a copy of the endpoints it was given and ranks them in order.
type recorder struct {
	BasePolicy
	got []Endpoint
}

func (p *recorder) Choose(s *Snapshot, r *Ranking) error {
	p.got = slices.Clone(s.Endpoints)
	for _, e := range s.Endpoints {
		r.Add(e.Index)
	}
	return nil
}

// TestChooseInPlaceThenCopied: one guest serves a v1.0 snapshot (records used in place, sharing the
// buffer) and then a newer minor's (records copied): the second call must neither write into the first
// buffer nor see stale records, and both rankings are written back.
func TestChooseInPlaceThenCopied(t *testing.T) {
	p := &recorder{}
	g := &guest{policy: p}
	want := goldenSnapshot().Endpoints
	first := golden()
	firstCopy := slices.Clone(first)
	if code := g.handleChoose(first, len(first)); code != 2 || !slices.Equal(p.got, want) {
		t.Fatalf("v1.0: code %d, endpoints %+v", code, p.got)
	}
	if !littleEndian || len(g.snap.Endpoints) == 0 || unsafe.Pointer(&g.snap.Endpoints[0]) != unsafe.Pointer(&first[64]) {
		t.Fatalf("v1.0 records were not used in place")
	}
	if binary.LittleEndian.Uint32(first[0:]) != 0 || binary.LittleEndian.Uint32(first[4:]) != 1 {
		t.Fatalf("ranking not written: % x", first[:8])
	}
	const hs, rs = 72, 56
	b := make([]byte, hs+2*rs)
	copy(b, firstCopy[:64])
	binary.LittleEndian.PutUint16(b[6:], hs)
	binary.LittleEndian.PutUint16(b[8:], rs)
	for i := range 2 {
		copy(b[hs+i*rs:], firstCopy[64+i*48:64+(i+1)*48])
	}
	b[hs+rs+16] = 9 // endpoint 1 now has 9 waiting requests
	before := slices.Clone(first)
	if code := g.handleChoose(b, len(b)); code != 2 || p.got[0] != want[0] || p.got[1].Waiting != 9 {
		t.Fatalf("newer minor: code %d, endpoints %+v", code, p.got)
	}
	if !slices.Equal(first, before) {
		t.Fatalf("the copied call wrote into the previous call's buffer")
	}
}

// TestChooseOutOfRangeThenValid: an out-of-range index marks seen's spare slot; the next calls on the
// same guest (valid rankings that use every index) must still pass, and a later duplicate still fails.
func TestChooseOutOfRangeThenValid(t *testing.T) {
	p := &adds{}
	g := &guest{policy: p}
	for i, c := range []struct {
		rank []uint32
		code int32
	}{{[]uint32{0, 7}, ErrCodeInvalidRanking}, {[]uint32{1, 0}, 2}, {[]uint32{0, 1}, 2}, {[]uint32{1, 1}, ErrCodeInvalidRanking}, {[]uint32{0}, 1}} {
		*p = c.rank
		buf := golden()
		if code := g.handleChoose(buf, len(buf)); code != c.code {
			t.Fatalf("call %d %v: code %d, want %d", i, c.rank, code, c.code)
		}
		if c.code > 0 {
			for k, v := range c.rank {
				if got := binary.LittleEndian.Uint32(buf[4*k:]); got != v {
					t.Fatalf("call %d: entry %d = %d", i, k, got)
				}
			}
		}
	}
}
