package wasmmeter

import (
	"bytes"
	"fmt"
	"math"
)

// ImportModule is the module name of the refill function Instrument adds to every module.
const ImportModule = "kvgate_meter"

// ImportName is the field name of the refill function: type () -> i32. The guest calls it when its fuel
// is at or below zero and stores the result as its new fuel (a result <= 0 makes the next check call
// refill again). The host aborts the call by panicking with an error in it.
const ImportName = "refill"

// Section ids (WebAssembly core spec 2.0 §5.5.2).
const (
	secCustom    = 0
	secType      = 1
	secImport    = 2
	secFunction  = 3
	secTable     = 4
	secMemory    = 5
	secGlobal    = 6
	secExport    = 7
	secStart     = 8
	secElement   = 9
	secCode      = 10
	secData      = 11
	secDataCount = 12
	secTag       = 13 // exception handling: unsupported
)

// sectionRank is the position a non-custom section must take in a module (data count sits between
// element and code); 0 for ids that are not sections wazero 1.12 accepts.
var sectionRank = [...]int{secType: 1, secImport: 2, secFunction: 3, secTable: 4, secMemory: 5, secGlobal: 6,
	secExport: 7, secStart: 8, secElement: 9, secDataCount: 10, secCode: 11, secData: 12}

type section struct {
	id         byte
	start, end int // payload bounds in the input
}

// module holds what the rewrite needs to know about the input before it writes anything.
type module struct {
	in       []byte
	sections []section
	present  [13]bool

	numTypes      uint32
	refillType    uint32 // index of the () -> i32 type, numTypes when one must be appended
	funcImports   uint32 // function imports = index of the refill import in the output
	globalImports uint32
	definedFuncs  uint32 // entries of the function section
	definedGlobal uint32
	check         []byte   // the fuel check sequence, with the global and import indices filled in
	skipLeafEntry bool     // no entry check in bodies without call or call_indirect
	typeParams    []uint32 // parameter count of each type
	funcTypes     []uint32 // type index of each defined function
	fuel          uint32   // index of the fuel global
	scratch       []byte

	tables      []table    // imported then defined tables, with their table.grow sites
	importCosts []hostCost // per function import: how a call to it is charged
	limit       *Error     // the first limit exceeded in the sections analyze reads (reported after them)
	localsTotal uint64     // declared locals of all bodies
	elemEntries uint64     // entries of all element segments
	stack       uint32     // index of the stack-units global (after the fuel global)
	inserted    [][2]int   // [start, end) in the output of the current body's entry and exit sequences
	targets     []uint32   // br_table entries that leave the function
	labels      []uint64   // branches to each open label of the current body, outermost first
	branchWork  uint64     // sum over closed labels of (branches to the label)^2
	nestingWork uint64     // sum of the nesting depth at every block, loop and if
}

// Instrument returns a copy of wasm in which every defined function's entry and every `loop` header
// spends one unit of fuel; when the fuel global is <= 0 at such a point, the guest first calls the import
// (ImportModule.ImportName, type () -> i32) and stores its result as the new fuel (the host must return
// a value in [1, 2^30]; <= 0 means "ask again at the next point"). The fuel global is a new,
// non-exported mutable i32 appended to the global section with initial value 0, so the first check
// calls refill. A body that starts with `loop` (the loop header's check runs first) or contains no call
// or call_indirect (it runs a bounded time between loop headers) gets no entry check. Bulk operations
// (memory.init/copy/fill, table.init/copy/grow/fill) additionally spend one unit per KiB of their
// length, checked before they run (such bodies get one extra i32 local).
//
// The import is appended after the module's own imports, so every defined function's index grows by
// one; call, ref.func, exports, the start function, element segments and the "name" section's function
// and local maps are renumbered ("name" label maps are dropped, as are name entries naming no function;
// DWARF ".debug_*" and "sourceMappingURL" custom sections are dropped because code offsets change).
// wasm is not modified.
//
// Each function that calls others also adds its frame weight (1 + (params+locals)/8 + body bytes/64)
// to a second new global, the stack-units counter, at entry and subtracts it at every exit; above
// MaxStackUnits it executes unreachable (a trap). A body's memory.grow and its calls to the WASI
// functions random_get, fd_write and poll_oneoff are charged by their size operand before they run.
//
// Errors are *Error wrapping ErrMalformed (with the byte offset of the problem), ErrUnsupported (opcodes,
// sections or forms outside wazero 1.12's default CoreFeaturesV2), ErrLimit (a table, count, body size,
// nesting or branch budget over the Max* constants of limits.go) or ErrAlreadyMetered (the module
// already imports from ImportModule). Instrument does not validate types; wazero does that at compile.
func Instrument(wasm []byte) ([]byte, error) {
	m := &module{in: wasm, skipLeafEntry: true}
	if err := m.scan(); err != nil {
		return nil, err
	}
	if err := m.analyze(); err != nil {
		return nil, err
	}
	return m.emit()
}

func malformed(off int, format string, args ...any) *Error {
	return &Error{Offset: off, Kind: ErrMalformed, Detail: fmt.Sprintf(format, args...)}
}

func unsupported(off int, format string, args ...any) *Error {
	return &Error{Offset: off, Kind: ErrUnsupported, Detail: fmt.Sprintf(format, args...)}
}

// scan checks the header and splits the input into sections in spec order.
func (m *module) scan() *Error {
	b := m.in
	if len(b) < 8 || !bytes.Equal(b[:4], []byte("\x00asm")) {
		return malformed(0, "no \\0asm magic")
	}
	if !bytes.Equal(b[4:8], []byte{1, 0, 0, 0}) {
		return unsupported(4, "binary version %x (only 1 is supported)", b[4:8])
	}
	last := 0
	for p := 8; p < len(b); {
		id := b[p]
		size, q := readU32(b, p+1, len(b))
		if q < 0 || int(size) > len(b)-q {
			return malformed(p, "section %d size", id)
		}
		switch {
		case id == secCustom:
		case id == secTag:
			return unsupported(p, "tag section (exception handling)")
		case int(id) >= len(sectionRank):
			return unsupported(p, "section id %d", id)
		default:
			r := sectionRank[id]
			if r <= last {
				return malformed(p, "section %d out of order or repeated", id)
			}
			last = r
			m.present[id] = true
		}
		m.sections = append(m.sections, section{id: id, start: q, end: q + int(size)})
		p = q + int(size)
	}
	return nil
}

// analyze reads the type, import, function and global sections' counts, which fix the indices the rewrite
// uses, and checks that the module does not import from ImportModule already.
func (m *module) analyze() *Error {
	m.refillType = math.MaxUint32
	for _, s := range m.sections {
		var err *Error
		switch s.id {
		case secType:
			err = m.readTypes(s)
		case secImport:
			err = m.readImports(s)
		case secFunction:
			r := &reader{b: m.in[:s.end], pos: s.start}
			n := r.count(1)
			m.funcTypes = make([]uint32, 0, n)
			for i := uint32(0); i < n && r.err == nil; i++ {
				at := r.pos
				t := r.u32()
				if r.err == nil && t >= m.numTypes {
					return malformed(at, "type index %d out of range", t)
				}
				m.funcTypes = append(m.funcTypes, t)
			}
			m.definedFuncs = n
			err = r.finish()
		case secTable:
			err = m.readTables(s)
		case secGlobal:
			r := &reader{b: m.in[:s.end], pos: s.start}
			m.definedGlobal = r.count(3)
			err = r.err
		case secExport:
			r := &reader{b: m.in[:s.end], pos: s.start}
			n := r.count(4)
			m.limitAt(n > MaxExports, s.start, "%d exports (limit MaxExports = %d)", n, MaxExports)
			err = r.err
		case secData:
			// wazero allocates a slice of the declared count before reading any segment.
			r := &reader{b: m.in[:s.end], pos: s.start}
			n := r.count(2)
			m.limitAt(n > MaxDataSegments, s.start, "%d data segments (limit MaxDataSegments = %d)", n, MaxDataSegments)
			err = r.err
		}
		if err != nil {
			return err
		}
	}
	if m.refillType == math.MaxUint32 {
		m.refillType = m.numTypes
		if m.numTypes == math.MaxUint32 {
			return malformed(0, "too many types")
		}
	}
	if uint64(m.funcImports)+uint64(m.definedFuncs) >= math.MaxUint32 ||
		uint64(m.globalImports)+uint64(m.definedGlobal) >= math.MaxUint32-1 {
		return malformed(0, "too many functions or globals")
	}
	if m.limit != nil {
		return m.limit
	}
	if n := uint64(m.funcImports) + uint64(m.definedFuncs); n > MaxFunctions {
		return limitErr(m.sectionStart(secFunction), "%d functions (limit MaxFunctions = %d)", n, MaxFunctions)
	}
	if n := uint64(m.globalImports) + uint64(m.definedGlobal); n > MaxGlobals {
		return limitErr(m.sectionStart(secGlobal), "%d globals (limit MaxGlobals = %d)", n, MaxGlobals)
	}
	fuel := m.globalImports + m.definedGlobal
	m.fuel, m.stack = fuel, fuel+1
	// if (fuel <= 0) { fuel = refill() }; fuel--
	c := []byte{0x23}
	c = appendU32(c, fuel)
	c = append(c, 0x41, 0x00, 0x4c, 0x04, 0x40, 0x10) // i32.const 0; i32.le_s; if (empty); call
	c = appendU32(c, m.funcImports)
	c = append(c, 0x24)
	c = appendU32(c, fuel)
	c = append(c, 0x0b, 0x23) // end; global.get
	c = appendU32(c, fuel)
	c = append(c, 0x41, 0x01, 0x6b, 0x24) // i32.const 1; i32.sub; global.set
	m.check = appendU32(c, fuel)
	return nil
}

func (m *module) readTypes(s section) *Error {
	r := &reader{b: m.in[:s.end], pos: s.start}
	m.numTypes = r.count(3)
	m.limitAt(m.numTypes > MaxTypes, s.start, "%d types (limit MaxTypes = %d)", m.numTypes, MaxTypes)
	for i := uint32(0); i < m.numTypes && r.err == nil; i++ {
		start := r.pos
		switch form := r.byte(); form {
		case 0x60:
		case 0x5e, 0x5f, 0x50, 0x4e, 0x4f:
			return unsupported(start, "GC type form %#x", form)
		default:
			if r.err == nil {
				return malformed(start, "type form %#x", form)
			}
		}
		for k := 0; k < 2 && r.err == nil; k++ { // params, results
			at := r.pos
			n := r.count(1)
			if k == 0 {
				m.typeParams = append(m.typeParams, n)
				m.limitAt(n > MaxParams, at, "type %d has %d parameters (limit MaxParams = %d)", i, n, MaxParams)
			} else {
				m.limitAt(n > MaxResults, at, "type %d has %d results (limit MaxResults = %d)", i, n, MaxResults)
			}
			for ; n > 0 && r.err == nil; n-- {
				r.valType()
			}
		}
		if r.err == nil && m.refillType == math.MaxUint32 && bytes.Equal(m.in[start:r.pos], []byte{0x60, 0x00, 0x01, 0x7f}) {
			m.refillType = i
		}
	}
	return r.finish()
}

func (m *module) readImports(s section) *Error {
	r := &reader{b: m.in[:s.end], pos: s.start}
	n := r.count(4)
	m.limitAt(n > MaxImports, s.start, "%d imports (limit MaxImports = %d)", n, MaxImports)
	for ; n > 0 && r.err == nil; n-- {
		start := r.pos
		mod := r.name()
		name := r.name()
		if r.err == nil && string(mod) == ImportModule {
			return &Error{Offset: start, Kind: ErrAlreadyMetered, Detail: "import from " + ImportModule}
		}
		kindAt := r.pos
		switch kind := r.byte(); kind {
		case 0:
			r.u32()
			m.funcImports++
			m.importCosts = append(m.importCosts, hostCosts[string(mod)+"."+string(name)])
		case 1:
			m.tables = append(m.tables, r.tableLimits(start, true))
		case 2:
			r.limits()
		case 3:
			r.valType()
			r.mutability()
			m.globalImports++
		case 4:
			return unsupported(kindAt, "tag import (exception handling)")
		default:
			if r.err == nil {
				return malformed(kindAt, "import kind %d", kind)
			}
		}
	}
	return r.finish()
}

// remap returns the output index of input function index f, or an error when f is out of range.
func (m *module) remap(f uint32, off int) (uint32, *Error) {
	if f < m.funcImports {
		return f, nil
	}
	if f-m.funcImports >= m.definedFuncs {
		return 0, malformed(off, "function index %d out of range", f)
	}
	return f + 1, nil
}

// emit writes the output module section by section, inserting the sections the input lacks at their
// spec position.
func (m *module) emit() ([]byte, error) {
	out := make([]byte, 0, len(m.in)+len(m.in)/4+64)
	out = append(out, m.in[:8]...)
	pending := []byte{secType, secImport, secGlobal} // sections to create if absent, in rank order
	flush := func(before int) {
		for len(pending) > 0 && sectionRank[pending[0]] < before {
			if !m.present[pending[0]] {
				out = m.emitSection(out, pending[0], m.synthesize(pending[0]))
			}
			pending = pending[1:]
		}
	}
	for _, s := range m.sections {
		if s.id != secCustom {
			flush(sectionRank[s.id])
		}
		var err *Error
		switch s.id {
		case secCustom:
			out, err = m.custom(out, s)
		case secType:
			out = m.emitSection(out, secType, m.types(s))
		case secImport:
			out = m.emitSection(out, secImport, m.imports(s))
		case secGlobal:
			var body []byte
			if body, err = m.globals(s); err == nil {
				out = m.emitSection(out, secGlobal, body)
			}
		case secExport:
			var body []byte
			if body, err = m.exports(s); err == nil {
				out = m.emitSection(out, secExport, body)
			}
		case secStart:
			r := &reader{b: m.in[:s.end], pos: s.start}
			f := r.u32()
			var idx uint32
			if err = r.finish(); err == nil {
				if idx, err = m.remap(f, s.start); err == nil {
					out = m.emitSection(out, secStart, appendU32(nil, idx))
				}
			}
		case secElement:
			var body []byte
			if body, err = m.elements(s); err == nil {
				out = m.emitSection(out, secElement, body)
			}
		case secTable:
			out = m.copySection(out, s) // read by analyze (readTables)
		case secCode:
			out, err = m.code(out, s)
		default: // function, memory, data count, data: no function indices
			out = m.copySection(out, s)
		}
		if err != nil {
			return nil, err
		}
	}
	flush(math.MaxInt)
	if err := m.checkTableLimits(); err != nil {
		return nil, err
	}
	return out, nil
}

func (m *module) emitSection(out []byte, id byte, body []byte) []byte {
	out = append(out, id)
	out = appendU32(out, uint32(len(body)))
	return append(out, body...)
}

func (m *module) copySection(out []byte, s section) []byte {
	return m.emitSection(out, s.id, m.in[s.start:s.end])
}

// refillImport is the import entry of the refill function.
func (m *module) refillImport(out []byte) []byte {
	out = appendU32(out, uint32(len(ImportModule)))
	out = append(out, ImportModule...)
	out = appendU32(out, uint32(len(ImportName)))
	out = append(out, ImportName...)
	out = append(out, 0x00)
	return appendU32(out, m.refillType)
}

// fuelGlobal is the global entry of the fuel counter: mutable i32, initial value 0.
var fuelGlobal = []byte{0x7f, 0x01, 0x41, 0x00, 0x0b}

var refillFuncType = []byte{0x60, 0x00, 0x01, 0x7f}

// synthesize returns the payload of a section the input lacks.
func (m *module) synthesize(id byte) []byte {
	switch id {
	case secType:
		return append([]byte{1}, refillFuncType...)
	case secImport:
		return m.refillImport([]byte{1})
	default: // secGlobal: fuel, stack units
		return append(append([]byte{2}, fuelGlobal...), fuelGlobal...)
	}
}

// types appends () -> i32 unless an identical type exists.
func (m *module) types(s section) []byte {
	if m.refillType < m.numTypes {
		return m.in[s.start:s.end]
	}
	r := &reader{b: m.in[:s.end], pos: s.start}
	r.u32()
	out := appendU32(make([]byte, 0, s.end-s.start+8), m.numTypes+1)
	out = append(out, m.in[r.pos:s.end]...)
	return append(out, refillFuncType...)
}

func (m *module) imports(s section) []byte {
	r := &reader{b: m.in[:s.end], pos: s.start}
	n := r.u32()
	out := appendU32(make([]byte, 0, s.end-s.start+32), n+1)
	out = append(out, m.in[r.pos:s.end]...)
	return m.refillImport(out)
}

func (m *module) globals(s section) ([]byte, *Error) {
	r := &reader{b: m.in[:s.end], pos: s.start}
	n := r.count(3)
	out := appendU32(make([]byte, 0, s.end-s.start+16), n+2)
	for ; n > 0 && r.err == nil; n-- {
		start := r.pos
		r.valType()
		r.mutability()
		out = append(out, m.in[start:r.pos]...)
		out = m.constExpr(r, out)
	}
	if err := r.finish(); err != nil {
		return nil, err
	}
	return append(append(out, fuelGlobal...), fuelGlobal...), nil // fuel, stack units
}

func (m *module) exports(s section) ([]byte, *Error) {
	r := &reader{b: m.in[:s.end], pos: s.start}
	n := r.count(4)
	out := appendU32(make([]byte, 0, s.end-s.start+16), n)
	for ; n > 0 && r.err == nil; n-- {
		start := r.pos
		r.name()
		kindAt := r.pos
		kind := r.byte()
		out = append(out, m.in[start:r.pos]...)
		idx := r.u32()
		if r.err != nil {
			break
		}
		switch kind {
		case 0:
			var err *Error
			if idx, err = m.remap(idx, kindAt); err != nil {
				return nil, err
			}
		case 1, 2, 3:
		case 4:
			return nil, unsupported(kindAt, "tag export (exception handling)")
		default:
			return nil, malformed(kindAt, "export kind %d", kind)
		}
		out = appendU32(out, idx)
	}
	return out, r.finish()
}

// elements rewrites the element section: every segment form 0..7 (spec 2.0 §5.5.12).
func (m *module) elements(s section) ([]byte, *Error) {
	r := &reader{b: m.in[:s.end], pos: s.start}
	n := r.count(2)
	out := appendU32(make([]byte, 0, s.end-s.start+16), n)
	for ; n > 0 && r.err == nil; n-- {
		flagsAt := r.pos
		flags := r.u32()
		if r.err != nil {
			break
		}
		if flags > 7 {
			return nil, malformed(flagsAt, "element segment flags %d", flags)
		}
		out = appendU32(out, flags)
		if flags&2 != 0 && flags&1 == 0 { // explicit table index
			start := r.pos
			r.u32()
			out = append(out, m.in[start:r.pos]...)
		}
		if flags&1 == 0 { // active: offset expression
			out = m.constExpr(r, out)
		}
		if flags&3 != 0 { // elemkind (funcref vector forms) or reftype (expression forms)
			at := r.pos
			k := r.byte()
			switch {
			case r.err != nil:
			case flags&4 == 0 && k != 0x00:
				return nil, malformed(at, "element kind %#x", k)
			case flags&4 != 0 && k != 0x70 && k != 0x6f:
				if k == 0x63 || k == 0x64 {
					return nil, unsupported(at, "typed reference %#x (function references)", k)
				}
				return nil, malformed(at, "element reference type %#x", k)
			}
			out = append(out, k)
		}
		cntAt := r.pos
		cnt := r.count(1)
		if m.elemEntries += uint64(cnt); m.elemEntries > MaxElementEntries {
			return nil, limitErr(cntAt, "element segments hold %d entries together (limit MaxElementEntries = %d)", m.elemEntries, MaxElementEntries)
		}
		out = appendU32(out, cnt)
		for ; cnt > 0 && r.err == nil; cnt-- {
			if flags&4 == 0 {
				at := r.pos
				f := r.u32()
				if r.err != nil {
					break
				}
				idx, err := m.remap(f, at)
				if err != nil {
					return nil, err
				}
				out = appendU32(out, idx)
			} else {
				out = m.constExpr(r, out)
			}
		}
	}
	return out, r.finish()
}

// readTables reads the table section's limits; tables with initializer expressions or typed references
// (function references proposal), whose ref.func would need renumbering, are rejected.
func (m *module) readTables(s section) *Error {
	r := &reader{b: m.in[:s.end], pos: s.start}
	for n := r.count(2); n > 0 && r.err == nil; n-- {
		if r.pos < len(r.b) && r.b[r.pos] == 0x40 {
			return unsupported(r.pos, "table with initializer expression (function references)")
		}
		m.tables = append(m.tables, r.tableLimits(r.pos, false))
	}
	return r.finish()
}

// limitAt records a limit error at off (the first one found) when over is true.
func (m *module) limitAt(over bool, off int, format string, args ...any) {
	if over && m.limit == nil {
		m.limit = limitErr(off, format, args...)
	}
}

// sectionStart returns the payload offset of the first section with id, or 0.
func (m *module) sectionStart(id byte) int {
	for _, s := range m.sections {
		if s.id == id {
			return s.start
		}
	}
	return 0
}

// custom copies a custom section, rewrites "name", and drops sections whose code offsets the rewrite
// invalidates.
func (m *module) custom(out []byte, s section) ([]byte, *Error) {
	r := &reader{b: m.in[:s.end], pos: s.start}
	name := r.name()
	if r.err != nil {
		return nil, r.err
	}
	switch {
	case string(name) == "name":
		body, err := m.names(r, s)
		if err != nil {
			return nil, err
		}
		return m.emitSection(out, secCustom, body), nil
	case bytes.HasPrefix(name, []byte(".debug_")), string(name) == "sourceMappingURL":
		return out, nil
	}
	return m.copySection(out, s), nil
}

// names rewrites the "name" section (extended name section layout): function names (1) and local names
// (2) are renumbered, label names (3) are dropped (the check sequence adds an `if` label), the others are
// copied.
func (m *module) names(r *reader, s section) ([]byte, *Error) {
	out := make([]byte, 0, s.end-s.start+16)
	out = append(out, m.in[s.start:r.pos]...)
	for r.pos < s.end && r.err == nil {
		subStart := r.pos
		id := r.byte()
		size := r.u32()
		if r.err != nil {
			break
		}
		if int(size) > s.end-r.pos {
			return nil, malformed(r.pos, "name subsection %d size", id)
		}
		end := r.pos + int(size)
		sub := &reader{b: m.in[:end], pos: r.pos}
		r.pos = end
		switch id {
		case 1, 2:
			// wazero does not check these indices: an entry naming no function is dropped, not an error.
			body := m.scratch[:0]
			kept := uint32(0)
			for n := sub.count(2); n > 0 && sub.err == nil; n-- {
				at := sub.pos
				f := sub.u32()
				if sub.err != nil {
					break
				}
				if id == 1 {
					sub.name()
				} else {
					for k := sub.count(2); k > 0 && sub.err == nil; k-- {
						sub.u32()
						sub.name()
					}
				}
				if idx, err := m.remap(f, at); err == nil {
					body = appendU32(body, idx)
					body = append(body, m.in[sub.posAfterIndex(at):sub.pos]...)
					kept++
				}
			}
			if err := sub.finish(); err != nil {
				return nil, err
			}
			m.scratch = body
			count := appendU32(nil, kept)
			out = append(out, id)
			out = appendU32(out, uint32(len(count)+len(body)))
			out = append(out, count...)
			out = append(out, body...)
		case 3:
		default:
			out = append(out, m.in[subStart:end]...)
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	return out, nil
}
