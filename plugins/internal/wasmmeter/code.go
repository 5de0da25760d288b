package wasmmeter

import "math"

// code rewrites the code section: each body gets the fuel check after its locals (unless it starts with
// `loop` or makes no call), after every loop's block type, and a length charge plus check before every
// bulk operation; its call and ref.func indices are renumbered. Unchanged instruction bytes are copied
// in runs.
func (m *module) code(out []byte, s section) ([]byte, *Error) {
	b := m.in[:s.end]
	n, p := readU32(b, s.start, s.end)
	if p < 0 {
		return nil, malformed(s.start, "bad code count")
	}
	if n != m.definedFuncs {
		return nil, malformed(s.start, "%d bodies for %d functions", n, m.definedFuncs)
	}
	out = append(out, secCode)
	sizeAt := len(out)
	out = append(out, 0, 0, 0, 0, 0) // section size, fixed up below
	out = appendU32(out, n)
	for i := uint32(0); i < n; i++ {
		at := p
		size, q := readU32(b, p, s.end)
		if q < 0 || int(size) > s.end-q {
			return nil, malformed(at, "body %d size", i)
		}
		bodyAt := len(out)
		out = append(out, 0, 0, 0, 0, 0)
		var err *Error
		if out, err = m.body(out, b, q, q+int(size), m.typeParams[m.funcTypes[i]]); err != nil {
			return nil, err
		}
		out = fixSize(out, bodyAt)
		p = q + int(size)
	}
	if p != s.end {
		return nil, malformed(p, "%d bytes after the last body", s.end-p)
	}
	return fixSize(out, sizeAt), nil
}

// fixSize writes the length of out[at+5:] as a minimal LEB128 at out[at:] and moves the content down
// over the unused bytes of the 5 reserved.
func fixSize(out []byte, at int) []byte {
	size := len(out) - at - 5
	enc := appendU32(make([]byte, 0, 5), uint32(size))
	copy(out[at:], enc)
	copy(out[at+len(enc):], out[at+5:])
	return out[:len(out)-(5-len(enc))]
}

// body rewrites one function body b[p:end] onto out; params is the function's parameter count.
func (m *module) body(out []byte, b []byte, p, end int, params uint32) ([]byte, *Error) {
	start := p
	outStart := len(out)
	if end-start > MaxBodyBytes {
		return nil, limitErr(start, "function body of %d bytes (limit MaxBodyBytes = %d)", end-start, MaxBodyBytes)
	}
	groups, p := readU32(b, p, end)
	if p < 0 || uint64(groups)*2 > uint64(end-p) {
		return nil, malformed(start, "bad local declarations")
	}
	numGroups, countEnd := groups, p
	locals := uint64(params) // index of the scratch local bulk-operation charges use
	for ; groups > 0; groups-- {
		at := p
		var n uint32
		if n, p = readU32(b, p, end); p < 0 || p >= end {
			return nil, malformed(at, "bad local declaration")
		}
		if locals += uint64(n); locals >= math.MaxUint32 {
			return nil, malformed(at, "too many locals")
		}
		switch t := b[p]; t {
		case 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f:
		case 0x63, 0x64:
			return nil, unsupported(p, "typed reference local %#x (function references)", t)
		default:
			return nil, malformed(p, "local type %#x", t)
		}
		p++
	}
	localsEnd := p
	if declared := locals - uint64(params); declared > MaxLocals {
		return nil, limitErr(start, "%d locals in one function (limit MaxLocals = %d)", declared, MaxLocals)
	} else if m.localsTotal += declared; m.localsTotal > MaxModuleLocals {
		return nil, limitErr(start, "%d locals in the module's functions (limit MaxModuleLocals = %d)", m.localsTotal, MaxModuleLocals)
	}
	scratch := uint32(locals) // bulk-operation and host-call charges use scratch and scratch+1
	out = append(out, b[start:p]...)
	run := p
	// Stack units of this function's frame (MaxStackUnits): its entry adds them, every exit subtracts.
	weight := uint32(1 + (locals >> 3) + uint64(end-start)>>6)
	m.inserted = m.inserted[:0]
	entry := len(out) // the entry sequence: stack units, then the fuel check unless the body starts with loop
	out = m.stackEnter(out, weight)
	if p < end && b[p] != 0x03 {
		out = append(out, m.check...)
	}
	m.inserted = append(m.inserted, [2]int{entry, len(out)})
	exit := func(at int) { // subtract the frame's units before the exit at b[at]
		out = append(out, b[run:at]...)
		i := len(out)
		out = m.stackLeave(out, weight)
		m.inserted = append(m.inserted, [2]int{i, len(out)})
		run = at
	}
	calls := false                     // the body has a call or call_indirect: it keeps its entry check
	bulk := false                      // a bulk operation was charged: the scratch local must be declared
	bulk2 := false                     // a host call's inner argument was charged: a second scratch local is needed
	depth := 0                         // nesting of block, loop and if
	run = p                            // start of the bytes not yet copied
	m.labels = append(m.labels[:0], 0) // the function's own label
	for p < end {
		at := p
		op := b[p]
		p++
		if op >= 0x45 && op <= 0xc4 { // numeric instructions without immediates: the most frequent
			continue
		}
		switch op {
		case 0x00, 0x01, 0x05, 0x1a, 0x1b, 0xd1:
		case 0x0b:
			if depth == 0 { // the body's own end
				exit(at)
			}
			depth--
			if err := m.closeLabel(at); err != nil {
				return nil, err
			}
		case 0x02, 0x04: // block, if
			if err := m.openLabel(at, depth); err != nil {
				return nil, err
			}
			if depth++; depth > MaxBlockDepth {
				return nil, limitErr(at, "blocks nested %d deep (limit MaxBlockDepth = %d)", depth, MaxBlockDepth)
			}
			p = m.blockType(b, p, end)
		case 0x03: // loop
			if err := m.openLabel(at, depth); err != nil {
				return nil, err
			}
			if depth++; depth > MaxBlockDepth {
				return nil, limitErr(at, "blocks nested %d deep (limit MaxBlockDepth = %d)", depth, MaxBlockDepth)
			}
			if p = m.blockType(b, p, end); p >= 0 {
				out = append(out, b[run:p]...)
				out = append(out, m.check...)
				run = p
			}
		case 0x0c, 0x0d: // br, br_if
			l, q := readU32(b, p, end)
			m.branch(l)
			if q >= 0 && int64(l) == int64(depth) { // to the function's label: an exit
				if op == 0x0c {
					exit(at)
				} else {
					// local.tee S; if; <leave>; end; local.get S; br_if
					out = append(out, b[run:at]...)
					i := len(out)
					out = append(out, 0x22)
					out = appendU32(out, scratch)
					out = append(out, 0x04, 0x40)
					out = m.stackLeave(out, weight)
					out = append(out, 0x0b, 0x20)
					out = appendU32(out, scratch)
					m.inserted = append(m.inserted, [2]int{i, len(out)})
					run, bulk = at, true
				}
			}
			p = q
		case 0x0f: // return: a branch to the function's label
			m.branch(uint32(len(m.labels) - 1))
			exit(at)
		case 0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x3f:
			// local/global access, table.get/set, memory.size
			p = skipLEB(b, p, end, 5)
		case 0x40: // memory.grow: charged one unit per KiB of its delta, like a bulk operation
			if p = skipLEB(b, p, end, 5); p >= 0 {
				out = append(out, b[run:at]...)
				out = m.chargePages(out, scratch)
				run, bulk = at, true
			}
		case 0x0e: // br_table
			var n uint32
			if n, p = readU32(b, p, end); p >= 0 {
				if uint64(n) >= uint64(end-p) {
					p = -1
				} else if n > MaxBrTableTargets {
					return nil, limitErr(at, "br_table with %d targets (limit MaxBrTableTargets = %d)", n, MaxBrTableTargets)
				}
				m.targets = m.targets[:0]
				for k := uint32(0); k <= n && p >= 0; k++ {
					var l uint32
					l, p = readU32(b, p, end)
					m.branch(l)
					if int64(l) == int64(depth) {
						m.targets = append(m.targets, k)
					}
				}
				if p >= 0 && len(m.targets) > 0 {
					// Some entries leave the function: local.tee S; <S selects one of them>; if; <leave>; end
					out = append(out, b[run:at]...)
					i := len(out)
					out = append(out, 0x22)
					out = appendU32(out, scratch)
					for j, k := range m.targets {
						out = append(out, 0x20)
						out = appendU32(out, scratch)
						out = append(out, 0x41)
						out = appendS32(out, int32(k))
						if k == n {
							out = append(out, 0x4f) // the default: S >= n (i32.ge_u)
						} else {
							out = append(out, 0x46) // i32.eq
						}
						if j > 0 {
							out = append(out, 0x72) // i32.or
						}
					}
					out = append(out, 0x04, 0x40)
					out = m.stackLeave(out, weight)
					out = append(out, 0x0b)
					m.inserted = append(m.inserted, [2]int{i, len(out)})
					run, bulk = at, true
				}
			}
		case 0x10, 0xd2: // call, ref.func
			f, q := readU32(b, p, end)
			if q < 0 {
				p = -1
				break
			}
			idx, err := m.remap(f, p)
			if err != nil {
				return nil, err
			}
			calls = calls || op == 0x10
			if c := m.hostCost(op, f); c.shift > 0 {
				// A host function whose work grows with an operand: charge it before the call.
				out = append(out, b[run:at]...)
				if c.arg == 0 {
					out = m.charge(out, scratch, c.shift)
				} else {
					out = append(out, 0x21)
					out = appendU32(out, scratch+1)
					out = m.charge(out, scratch, c.shift)
					out = append(out, 0x20)
					out = appendU32(out, scratch+1)
					bulk2 = true
				}
				out = append(out, op)
				bulk = true
			} else {
				out = append(out, b[run:p]...)
			}
			out = appendU32(out, idx)
			p, run = q, q
		case 0x28, 0x29, 0x2a, 0x2b, 0x2c, 0x2d, 0x2e, 0x2f, 0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38,
			0x39, 0x3a, 0x3b, 0x3c, 0x3d, 0x3e: // loads and stores
			p = memarg(b, p, end)
		case 0x11: // call_indirect typeidx tableidx
			calls = true
			if p = skipLEB(b, p, end, 5); p >= 0 {
				p = skipLEB(b, p, end, 5)
			}
		case 0x1c: // select t*
			var n uint32
			if n, p = readU32(b, p, end); p >= 0 {
				if uint64(n) > uint64(end-p) {
					p = -1
					break
				}
				for k := uint32(0); k < n; k++ {
					switch b[p] {
					case 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f:
					default:
						return nil, malformed(p, "select type %#x", b[p])
					}
					p++
				}
			}
		case 0x41: // i32.const
			p = skipLEB(b, p, end, 5)
		case 0x42: // i64.const
			p = skipLEB(b, p, end, 10)
		case 0x43:
			p = skipN(p, end, 4)
		case 0x44:
			p = skipN(p, end, 8)
		case 0xd0: // ref.null t
			if p >= end {
				p = -1
			} else if t := b[p]; t == 0x70 || t == 0x6f {
				p++
			} else {
				return nil, unsupported(p, "ref.null heap type %#x", t)
			}
		case 0xfc:
			var err *Error
			var sub uint32
			if p, sub, err = miscOp(b, p, end); err != nil {
				return nil, err
			}
			if sub == 15 && p >= 0 { // table.grow: its table must declare a maximum (checkTableLimits)
				_, q := readU32(b, at+1, end)
				if t, _ := readU32(b, q, end); int64(t) < int64(len(m.tables)) && m.tables[t].growAt < 0 {
					m.tables[t].growAt = at
				}
			}
			if shift := bulkShift(sub); shift > 0 && p >= 0 {
				out = append(out, b[run:at]...)
				out = m.charge(out, scratch, shift)
				run, bulk = at, true
			}
		case 0xfd:
			var err *Error
			if p, err = simdOp(b, p, end); err != nil {
				return nil, err
			}
		case 0x06, 0x07, 0x08, 0x09, 0x0a, 0x18, 0x19, 0x1f:
			return nil, unsupported(at, "opcode %#x (exception handling)", op)
		case 0x12, 0x13:
			return nil, unsupported(at, "opcode %#x (tail calls)", op)
		case 0x14, 0x15, 0xd3, 0xd4, 0xd5, 0xd6:
			return nil, unsupported(at, "opcode %#x (function references)", op)
		case 0xfb:
			return nil, unsupported(at, "opcode 0xfb (GC)")
		case 0xfe:
			return nil, unsupported(at, "opcode 0xfe (threads)")
		default:
			return nil, malformed(at, "unknown opcode %#x", op)
		}
		if p < 0 {
			return nil, malformed(at, "truncated or bad immediate of opcode %#x", op)
		}
	}
	out = append(out, b[run:end]...)
	if !calls && m.skipLeafEntry {
		// A body without calls runs a bounded time between its entry and its loop headers, and its frame
		// is always the innermost: drop the entry check and the stack accounting (RATIONALE.md, "Which
		// points are metered", "Call stack").
		w := m.inserted[0][0]
		for j, r := range m.inserted {
			next := len(out)
			if j+1 < len(m.inserted) {
				next = m.inserted[j+1][0]
			}
			w += copy(out[w:], out[r[1]:next])
		}
		out = out[:w]
	}
	if bulk {
		// Declare the scratch local: the group count grows by one and a group (1 x i32) follows the
		// existing ones; the instructions after them move.
		tail := append([]byte(nil), out[outStart+(localsEnd-start):]...)
		out = appendU32(out[:outStart], numGroups+1)
		out = append(out, b[countEnd:localsEnd]...)
		if bulk2 {
			out = append(out, 0x02, 0x7f)
		} else {
			out = append(out, 0x01, 0x7f)
		}
		out = append(out, tail...)
	}
	return out, nil
}

// bulkShift returns how many bits to shift a 0xFC instruction's length operand to get its fuel (one unit
// per KiB: bytes >> 10 for memory.init/copy/fill, 8-byte entries >> 7 for table.init/copy/grow/fill), or
// 0 for the other 0xFC instructions.
func bulkShift(sub uint32) byte {
	switch sub {
	case 8, 10, 11: // memory.init, memory.copy, memory.fill
		return 10
	case 12, 14, 15, 17: // table.init, table.copy, table.grow, table.fill
		return 7
	}
	return 0
}

// charge appends, before a bulk operation whose length n is on top of the stack:
// local.set L; fuel -= n >> shift; <check>; local.get L.
func (m *module) charge(out []byte, scratch uint32, shift byte) []byte {
	out = append(out, 0x21)
	out = appendU32(out, scratch)
	out = append(out, 0x23)
	out = appendU32(out, m.fuel)
	out = append(out, 0x20)
	out = appendU32(out, scratch)
	out = append(out, 0x41, shift, 0x76, 0x6b, 0x24) // i32.const shift; i32.shr_u; i32.sub; global.set
	out = appendU32(out, m.fuel)
	out = append(out, m.check...)
	out = append(out, 0x20)
	return appendU32(out, scratch)
}

// chargePages appends, before a memory.grow whose delta d (pages) is on top of the stack:
// local.set L; fuel -= min(d, 65536) << 6; <check>; local.get L (one unit per KiB; a delta above 65536
// pages fails anyway, and the clamp keeps the charge from wrapping).
func (m *module) chargePages(out []byte, scratch uint32) []byte {
	out = append(out, 0x21)
	out = appendU32(out, scratch)
	out = append(out, 0x23)
	out = appendU32(out, m.fuel)
	out = append(out, 0x20)
	out = appendU32(out, scratch)
	out = append(out, 0x41, 0x80, 0x80, 0x04, 0x20) // i32.const 65536; local.get L
	out = appendU32(out, scratch)
	out = append(out, 0x41, 0x80, 0x80, 0x04, 0x49, 0x1b) // i32.const 65536; i32.lt_u; select
	out = append(out, 0x41, 0x06, 0x74, 0x6b, 0x24)       // i32.const 6; i32.shl; i32.sub; global.set
	out = appendU32(out, m.fuel)
	out = append(out, m.check...)
	out = append(out, 0x20)
	return appendU32(out, scratch)
}

// hostCost describes how a call to an imported (host) function is charged: fuel = operand >> shift,
// where the operand is the call's argument arg places below the top of the stack (0: the last one).
type hostCost struct {
	arg   uint8
	shift byte // 0: not charged beyond the caller's own metering
}

// hostCosts are the imports whose work grows with an operand and that the host links (the WASI
// functions of plugins.AllowedImports): without a charge, a loop calling random_get on 32 MiB ran for
// minutes between two refills (one unit per loop iteration).
var hostCosts = map[string]hostCost{
	"wasi_snapshot_preview1.random_get":  {arg: 0, shift: 10}, // (buf, len): one unit per KiB filled
	"wasi_snapshot_preview1.fd_write":    {arg: 1, shift: 1},  // (fd, iovs, iovs_len, nwritten): one unit per 2 iovecs
	"wasi_snapshot_preview1.poll_oneoff": {arg: 1, shift: 1},  // (in, out, nsubscriptions, nevents): one unit per 2 subscriptions
}

// hostCost returns the charge of `call f` (op 0x10) when f is a charged import.
func (m *module) hostCost(op byte, f uint32) hostCost {
	if op != 0x10 || f >= uint32(len(m.importCosts)) {
		return hostCost{}
	}
	return m.importCosts[f]
}

// stackEnter appends: stack += w; if stack >u MaxStackUnits { unreachable }.
func (m *module) stackEnter(out []byte, w uint32) []byte {
	out = append(out, 0x23)
	out = appendU32(out, m.stack)
	out = append(out, 0x41)
	out = appendS32(out, int32(w))
	out = append(out, 0x6a, 0x24) // i32.add; global.set
	out = appendU32(out, m.stack)
	out = append(out, 0x23)
	out = appendU32(out, m.stack)
	out = append(out, 0x41)
	out = appendS32(out, MaxStackUnits)
	return append(out, 0x4b, 0x04, 0x40, 0x00, 0x0b) // i32.gt_u; if; unreachable; end
}

// stackLeave appends: stack -= w.
func (m *module) stackLeave(out []byte, w uint32) []byte {
	out = append(out, 0x23)
	out = appendU32(out, m.stack)
	out = append(out, 0x41)
	out = appendS32(out, int32(w))
	out = append(out, 0x6b, 0x24) // i32.sub; global.set
	return appendU32(out, m.stack)
}

// openLabel pushes the label of a block, loop or if opened at nesting depth and charges the depth to
// the module's nesting work.
func (m *module) openLabel(at, depth int) *Error {
	m.labels = append(m.labels, 0)
	if m.nestingWork += uint64(depth); m.nestingWork > MaxNestingWork {
		return limitErr(at, "nesting work %d (sum of block depths; limit MaxNestingWork = %d)", m.nestingWork, MaxNestingWork)
	}
	return nil
}

// closeLabel pops the innermost label (at its `end`) and adds the square of the branches to it to the
// module's branch work.
func (m *module) closeLabel(at int) *Error {
	if len(m.labels) == 0 {
		return nil // an `end` too many: wazero rejects the module
	}
	n := m.labels[len(m.labels)-1]
	m.labels = m.labels[:len(m.labels)-1]
	if m.branchWork += n * n; m.branchWork > MaxBranchWork {
		return limitErr(at, "branch work %d (sum over labels of the square of the branches to each; limit MaxBranchWork = %d)", m.branchWork, MaxBranchWork)
	}
	return nil
}

// branch counts a branch to relative label l (out-of-range labels are left to wazero).
func (m *module) branch(l uint32) {
	if uint64(l) < uint64(len(m.labels)) {
		m.labels[len(m.labels)-1-int(l)]++
	}
}

func skipN(p, end, n int) int {
	if p < 0 || n > end-p {
		return -1
	}
	return p + n
}

// blockType skips a block type: empty (0x40), a value type, or a non-negative s33 type index.
func (m *module) blockType(b []byte, p, end int) int {
	if p >= end {
		return -1
	}
	switch b[p] {
	case 0x40, 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f:
		return p + 1
	}
	v, q := readS33(b, p, end)
	if v < 0 {
		return -1
	}
	return q
}

// memarg skips align (bit 6: a memory index follows, multi-memory) and offset.
func memarg(b []byte, p, end int) int {
	align, p := readU32(b, p, end)
	if p >= 0 && align&0x40 != 0 {
		p = skipLEB(b, p, end, 5)
	}
	if p < 0 {
		return -1
	}
	return skipLEB(b, p, end, 10)
}

// miscOp skips a 0xFC instruction: saturating truncations (0–7), bulk memory and table operations
// (8–17).
func miscOp(b []byte, p, end int) (int, uint32, *Error) {
	at := p
	sub, p := readU32(b, p, end)
	if p < 0 {
		return -1, 0, nil
	}
	switch {
	case sub <= 7:
		return p, sub, nil
	case sub == 8 || sub == 10 || sub == 12 || sub == 14: // two indices
		if p = skipLEB(b, p, end, 5); p < 0 {
			return -1, sub, nil
		}
		return skipLEB(b, p, end, 5), sub, nil
	case sub <= 17:
		return skipLEB(b, p, end, 5), sub, nil
	}
	return -1, sub, unsupported(at-1, "opcode 0xfc %d", sub)
}

// simdOp skips a 0xFD instruction's immediates (fixed-width SIMD, opcodes 0–255).
func simdOp(b []byte, p, end int) (int, *Error) {
	at := p
	sub, p := readU32(b, p, end)
	if p < 0 {
		return -1, nil
	}
	switch {
	case sub <= 11 || sub == 92 || sub == 93: // loads, store, load_zero: memarg
		return memarg(b, p, end), nil
	case sub == 12 || sub == 13: // v128.const, i8x16.shuffle
		return skipN(p, end, 16), nil
	case sub >= 21 && sub <= 34: // extract/replace lane
		return skipN(p, end, 1), nil
	case sub >= 84 && sub <= 91: // load/store lane: memarg, lane
		return skipN(memarg(b, p, end), end, 1), nil
	case sub <= 255:
		return p, nil
	}
	return -1, unsupported(at-1, "opcode 0xfd %d (relaxed SIMD or unknown)", sub)
}

// constExpr copies a constant expression from r onto out, renumbering ref.func.
func (m *module) constExpr(r *reader, out []byte) []byte {
	b := r.b
	for r.err == nil {
		at := r.pos
		op := r.byte()
		if r.err != nil {
			return out
		}
		p := r.pos
		switch op {
		case 0x0b:
			return append(out, op)
		case 0x41:
			p = skipLEB(b, p, len(b), 5)
		case 0x42:
			p = skipLEB(b, p, len(b), 10)
		case 0x43:
			p = skipN(p, len(b), 4)
		case 0x44:
			p = skipN(p, len(b), 8)
		case 0x23:
			p = skipLEB(b, p, len(b), 5)
		case 0xd0:
			if p < len(b) && (b[p] == 0x70 || b[p] == 0x6f) {
				p++
			} else {
				p = -1
			}
		case 0xd2:
			f, q := readU32(b, p, len(b))
			if q < 0 {
				p = -1
				break
			}
			idx, err := m.remap(f, p)
			if err != nil {
				r.err, r.pos = err, len(b)
				return out
			}
			out = append(out, op)
			out = appendU32(out, idx)
			r.pos = q
			continue
		case 0xfd:
			var sub uint32
			if sub, p = readU32(b, p, len(b)); p >= 0 && sub == 12 {
				p = skipN(p, len(b), 16)
			} else {
				p = -1
			}
		case 0x6a, 0x6b, 0x6c, 0x7c, 0x7d, 0x7e: // extended constant expressions: left to wazero
		default:
			r.pos = at
			r.fail("opcode %#x in a constant expression", op)
			return out
		}
		if p < 0 {
			r.pos = at
			r.fail("bad constant expression")
			return out
		}
		out = append(out, b[at:p]...)
		r.pos = p
	}
	return out
}
