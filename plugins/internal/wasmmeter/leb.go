package wasmmeter

// LEB128 helpers over an input slice with an explicit end. They never read at or past end; on a
// truncated or over-long encoding they return a negative position, which callers turn into ErrMalformed.

// readU32 decodes an unsigned LEB128 of at most 5 bytes at b[p:end] and returns the value and the
// position after it, or (0, -1).
func readU32(b []byte, p, end int) (uint32, int) {
	if p < end && b[p] < 0x80 {
		return uint32(b[p]), p + 1
	}
	var v uint32
	for shift := uint(0); shift < 35; shift += 7 {
		if p >= end {
			return 0, -1
		}
		c := b[p]
		p++
		v |= uint32(c&0x7f) << shift
		if c < 0x80 {
			if shift == 28 && c > 0x0f {
				return 0, -1 // bits beyond 32
			}
			return v, p
		}
	}
	return 0, -1
}

// skipLEB skips a LEB128 (signed or unsigned) of at most maxBytes bytes and returns the position after
// it, or -1.
func skipLEB(b []byte, p, end, maxBytes int) int {
	for i := 0; i < maxBytes; i++ {
		if p >= end {
			return -1
		}
		c := b[p]
		p++
		if c < 0x80 {
			return p
		}
	}
	return -1
}

// readS33 decodes a signed LEB128 of at most 5 bytes (a block type's type index) and returns the value
// and the position after it, or (0, -1).
func readS33(b []byte, p, end int) (int64, int) {
	var v int64
	for shift := uint(0); shift < 35; shift += 7 {
		if p >= end {
			return 0, -1
		}
		c := b[p]
		p++
		v |= int64(c&0x7f) << shift
		if c < 0x80 {
			if shift+7 < 64 && c&0x40 != 0 {
				v |= -1 << (shift + 7)
			}
			return v, p
		}
	}
	return 0, -1
}

// appendU32 appends v as a minimal unsigned LEB128.
func appendU32(out []byte, v uint32) []byte {
	for v >= 0x80 {
		out = append(out, byte(v)|0x80)
		v >>= 7
	}
	return append(out, byte(v))
}

// appendS32 appends v as a minimal signed LEB128 (i32.const immediates).
func appendS32(out []byte, v int32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(out, c)
		}
		out = append(out, c|0x80)
	}
}
