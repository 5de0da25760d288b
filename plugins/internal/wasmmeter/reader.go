package wasmmeter

import "slices"

// reader decodes the non-code sections. b ends at the current section's (or subsection's) end, so reads
// never cross it; the first error sticks and moves pos to the end so loops stop.
type reader struct {
	b   []byte
	pos int
	err *Error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = malformed(r.pos, format, args...)
	}
	r.pos = len(r.b)
}

func (r *reader) byte() byte {
	if r.pos >= len(r.b) {
		r.fail("unexpected end")
		return 0
	}
	c := r.b[r.pos]
	r.pos++
	return c
}

func (r *reader) u32() uint32 {
	v, p := readU32(r.b, r.pos, len(r.b))
	if p < 0 {
		r.fail("bad u32 LEB128")
		return 0
	}
	r.pos = p
	return v
}

// count reads a vector length whose entries take at least minBytes each, rejecting lengths the rest of
// the section cannot hold (so a forged count cannot make a loop spin or an allocation grow).
func (r *reader) count(minBytes int) uint32 {
	at := r.pos
	n := r.u32()
	if r.err == nil && uint64(n)*uint64(minBytes) > uint64(len(r.b)-r.pos) {
		r.pos = at
		r.fail("vector length %d exceeds its section", n)
		return 0
	}
	return n
}

// name reads a length-prefixed byte string (UTF-8 is left to wazero).
func (r *reader) name() []byte {
	n := r.u32()
	if r.err != nil {
		return nil
	}
	if int(n) > len(r.b)-r.pos {
		r.fail("name length %d", n)
		return nil
	}
	s := r.b[r.pos : r.pos+int(n)]
	r.pos += int(n)
	return s
}

// valType reads a value type: i32, i64, f32, f64, v128, funcref or externref.
func (r *reader) valType() { r.typeByte("value type", 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f) }

// typeByte reads one type byte that must be among allowed; a typed reference (function references
// proposal) is ErrUnsupported, anything else malformed ("what %#x").
func (r *reader) typeByte(what string, allowed ...byte) {
	at := r.pos
	t := r.byte()
	switch {
	case r.err != nil || slices.Contains(allowed, t):
	case t == 0x63 || t == 0x64:
		r.err = unsupported(at, "typed reference %#x (function references)", t)
		r.pos = len(r.b)
	default:
		r.pos = at
		r.fail(what+" %#x", t)
	}
}

func (r *reader) mutability() {
	if m := r.byte(); m > 1 && r.err == nil {
		r.pos--
		r.fail("global mutability %#x", m)
	}
}

// limits reads memory or table limits: a flags byte (bit 0 max present, bit 1 shared, bit 2 64-bit),
// then min and optional max. The values are left to wazero.
func (r *reader) limits() {
	flags := r.byte()
	if flags > 7 && r.err == nil {
		r.pos--
		r.fail("limits flags %#x", flags)
		return
	}
	maxBytes := 5
	if flags&4 != 0 {
		maxBytes = 10
	}
	for k := 0; k < 1+int(flags&1) && r.err == nil; k++ {
		if p := skipLEB(r.b, r.pos, len(r.b), maxBytes); p < 0 {
			r.fail("bad limits LEB128")
		} else {
			r.pos = p
		}
	}
}

// refType reads a table's reference type: funcref or externref.
func (r *reader) refType() { r.typeByte("table reference type", 0x70, 0x6f) }

// posAfterIndex returns the position after the u32 LEB128 at at (already read successfully once).
func (r *reader) posAfterIndex(at int) int {
	_, p := readU32(r.b, at, len(r.b))
	return p
}

// finish returns the sticky error, or a malformed error when the section has bytes left over.
func (r *reader) finish() *Error {
	if r.err == nil && r.pos != len(r.b) {
		r.fail("%d bytes left over", len(r.b)-r.pos)
	}
	return r.err
}
