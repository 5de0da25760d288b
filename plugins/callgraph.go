package plugins

import (
	"errors"
	"fmt"
)

// Static defence against the one guest wazero cannot interrupt: a call tree that never enters a loop.
// wazero checks for a closed module at loop headers only, so a function whose body enters a `loop`
// before any branch or call (every Go function with a call, and AssemblyScript's loops) is interrupted
// on entry; the others ("unchecked") must not call each other in a cycle, and the calls one of them can
// make without reaching a check must stay below maxUncheckedCalls. call_indirect is not followed (Go's
// closures would make a sound treatment reject every Go module, see RATIONALE.md), so this check narrows
// the hole; the goroutine-and-deadline handling in Rank still covers the rest.

// maxUncheckedCalls bounds the direct calls reachable from one unchecked function without passing a
// loop header (about a millisecond of work). Go's runtime peaks at 224.
const maxUncheckedCalls = 1 << 20

var errWasmDecode = errors.New("wasm decode")

type wasmReader struct {
	b   []byte
	pos int
	err error
}

func (r *wasmReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w at byte %d: %s", errWasmDecode, r.pos, fmt.Sprintf(format, args...))
	}
	r.pos = len(r.b)
}

func (r *wasmReader) byte() byte {
	if r.pos >= len(r.b) {
		r.fail("unexpected end")
		return 0
	}
	c := r.b[r.pos]
	r.pos++
	return c
}

func (r *wasmReader) skip(n int) {
	if n < 0 || r.pos+n > len(r.b) {
		r.fail("unexpected end")
		return
	}
	r.pos += n
}

// leb reads an unsigned or signed LEB128 of at most maxBits bits and returns the unsigned value.
func (r *wasmReader) leb(maxBits int) uint64 {
	var v uint64
	for shift := 0; ; shift += 7 {
		if shift >= maxBits+7 {
			r.fail("LEB128 too long")
			return 0
		}
		c := r.byte()
		if r.err != nil {
			return 0
		}
		if shift < 64 {
			v |= uint64(c&0x7f) << shift
		}
		if c&0x80 == 0 {
			return v
		}
	}
}

func (r *wasmReader) u32() uint32 { return uint32(r.leb(32)) }

func (r *wasmReader) name() { r.skip(int(r.u32())) }

func (r *wasmReader) limits() {
	flags := r.byte()
	r.leb(64)
	if flags&1 != 0 {
		r.leb(64)
	}
}

func (r *wasmReader) memarg() {
	if align := r.u32(); align&0x40 != 0 {
		r.u32() // memory index (multi-memory)
	}
	r.leb(64)
}

func (r *wasmReader) blockType() {
	if r.pos >= len(r.b) {
		r.fail("unexpected end")
		return
	}
	switch c := r.b[r.pos]; {
	case c == 0x40 || c >= 0x6f && c <= 0x7f:
		r.pos++
	default:
		r.leb(33)
	}
}

// funcShape is what the check needs of one defined function.
type funcShape struct {
	checked bool     // enters a loop before any branch or call
	calls   []uint32 // direct callees (function index space), one entry per call site
}

// analyzeFunctions decodes the import and code sections: the number of imported functions and the
// shape of every defined function.
func analyzeFunctions(wasm []byte) (int, []funcShape, error) {
	r := &wasmReader{b: wasm}
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return 0, nil, fmt.Errorf("%w: not a wasm module", errWasmDecode)
	}
	r.pos = 8
	imported := 0
	var funcs []funcShape
	for r.pos < len(r.b) && r.err == nil {
		id := r.byte()
		size := int(r.u32())
		if r.err != nil || size > len(r.b)-r.pos {
			r.fail("section size")
			break
		}
		end := r.pos + size
		sec := &wasmReader{b: r.b[:end], pos: r.pos}
		switch id {
		case 2: // imports
			for n := sec.u32(); n > 0 && sec.err == nil; n-- {
				sec.name()
				sec.name()
				switch kind := sec.byte(); kind {
				case 0:
					sec.u32()
					imported++
				case 1:
					sec.byte()
					sec.limits()
				case 2:
					sec.limits()
				case 3:
					sec.byte()
					sec.byte()
				default:
					sec.fail("import kind %d", kind)
				}
			}
		case 10: // code
			n := sec.u32()
			if int(n) > size { // each body takes at least one byte
				sec.fail("function count")
				n = 0
			}
			funcs = make([]funcShape, 0, n)
			for ; n > 0 && sec.err == nil; n-- {
				bodySize := int(sec.u32())
				if sec.err != nil || bodySize > end-sec.pos {
					sec.fail("body size")
					break
				}
				body := &wasmReader{b: sec.b[:sec.pos+bodySize], pos: sec.pos}
				funcs = append(funcs, decodeBody(body))
				if body.err != nil {
					sec.err = body.err
				}
				sec.pos += bodySize
			}
		}
		if sec.err != nil {
			return 0, nil, sec.err
		}
		r.pos = end
	}
	return imported, funcs, r.err
}

func decodeBody(r *wasmReader) funcShape {
	var f funcShape
	for n := r.u32(); n > 0 && r.err == nil; n-- {
		r.u32()
		r.byte()
	}
	decided := false
	for r.pos < len(r.b) && r.err == nil {
		op := r.byte()
		switch {
		case op == 0x03: // loop
			if !decided {
				f.checked, decided = true, true
			}
			r.blockType()
		case op == 0x02: // block: entered unconditionally
			r.blockType()
		case op == 0x04: // if
			decided = true
			r.blockType()
		case op == 0x00 || op == 0x05 || op == 0x0b || op == 0x0f:
			if op != 0x0b || r.pos < len(r.b) { // the final end does not decide anything
				decided = true
			}
		case op == 0x01 || op == 0x1a || op == 0x1b || op == 0xd1 || op >= 0x45 && op <= 0xc4:
		case op == 0x0c || op == 0x0d: // br, br_if
			decided = true
			r.u32()
		case op == 0x0e: // br_table
			decided = true
			for n := r.u32(); n > 0 && r.err == nil; n-- {
				r.u32()
			}
			r.u32()
		case op == 0x10 || op == 0x12: // call, return_call
			decided = true
			f.calls = append(f.calls, r.u32())
		case op == 0x11 || op == 0x13: // call_indirect, return_call_indirect
			decided = true
			r.u32()
			r.u32()
		case op == 0x1c: // select t*
			for n := r.u32(); n > 0 && r.err == nil; n-- {
				r.byte()
			}
		case op >= 0x20 && op <= 0x26, op == 0x3f, op == 0x40, op == 0xd2:
			r.u32()
		case op >= 0x28 && op <= 0x3e:
			r.memarg()
		case op == 0x41:
			r.leb(32)
		case op == 0x42:
			r.leb(64)
		case op == 0x43:
			r.skip(4)
		case op == 0x44:
			r.skip(8)
		case op == 0xd0:
			r.byte()
		case op == 0xfc:
			switch sub := r.u32(); {
			case sub <= 7:
			case sub == 8, sub == 10, sub == 12, sub == 14:
				r.u32()
				r.u32()
			case sub <= 17:
				r.u32()
			default:
				r.fail("opcode 0xfc %d", sub)
			}
		case op == 0xfd:
			switch sub := r.u32(); {
			case sub <= 11 || sub == 92 || sub == 93:
				r.memarg()
			case sub == 12 || sub == 13:
				r.skip(16)
			case sub >= 21 && sub <= 34:
				r.byte()
			case sub >= 84 && sub <= 91:
				r.memarg()
				r.byte()
			}
		default:
			r.fail("opcode %#x", op)
		}
	}
	return f
}

// checkCallGraph returns the problems of the static check: cycles among unchecked functions and
// unchecked call trees above maxUncheckedCalls.
func checkCallGraph(wasm []byte) []string {
	imported, funcs, err := analyzeFunctions(wasm)
	if err != nil {
		return []string{"call-graph check: " + err.Error()}
	}
	n := len(funcs)
	unchecked := func(callee uint32) int { // defined index of an unchecked callee, or -1
		i := int(callee) - imported
		if i < 0 || i >= n || funcs[i].checked {
			return -1
		}
		return i
	}
	// Iterative DFS over unchecked functions: colour 1 = on stack, 2 = done; size = calls reachable.
	colour := make([]uint8, n)
	size := make([]uint64, n)
	type frame struct{ f, next int }
	var problems []string
	for root := 0; root < n && len(problems) == 0; root++ {
		if funcs[root].checked || colour[root] != 0 {
			continue
		}
		stack := []frame{{root, 0}}
		colour[root] = 1
		for len(stack) > 0 && len(problems) == 0 {
			top := &stack[len(stack)-1]
			calls := funcs[top.f].calls
			if top.next < len(calls) {
				c := unchecked(calls[top.next])
				top.next++
				switch {
				case c < 0:
				case colour[c] == 1 && c == top.f:
					problems = append(problems, fmt.Sprintf(
						"function %d calls itself without a loop (recursion wazero cannot interrupt)", c+imported))
				case colour[c] == 1:
					problems = append(problems, fmt.Sprintf(
						"functions %d and %d call each other without a loop (recursion wazero cannot interrupt)",
						top.f+imported, c+imported))
				case colour[c] == 0:
					colour[c] = 1
					stack = append(stack, frame{c, 0})
				}
				continue
			}
			var s uint64 = 1
			for _, callee := range calls {
				if c := unchecked(callee); c >= 0 {
					s += size[c]
				} else {
					s++
				}
				s = min(s, maxUncheckedCalls+1)
			}
			size[top.f], colour[top.f] = s, 2
			if s > maxUncheckedCalls {
				problems = append(problems, fmt.Sprintf(
					"function %d can make more than %d calls without a loop (a call tree wazero cannot interrupt)",
					top.f+imported, maxUncheckedCalls))
			}
			stack = stack[:len(stack)-1]
		}
	}
	return problems
}
