package wasmmeter

// Static resource limits. wazero 1.12 sizes its allocations from what a module declares — a table's
// minimum at instantiation, a table.grow's delta at run time, the run-length-encoded local counts of a
// body at decode and compile, every vector count at decode — and neither WithMemoryLimitPages nor fuel
// bounds them, so an upload of a few hundred bytes could make the gateway allocate gigabytes (a fatal,
// unrecoverable "out of memory" in Go) or compile for minutes. Instrument rejects a module over any of
// these limits with an *Error wrapping ErrLimit, at the offset of the declaration or instruction.
//
// The values are the Web's agreed implementation limits (the WebAssembly JS API, "Limits"; V8's
// wasm-limits.h) where those are tight enough for an in-process gateway, and lower where a per-instance
// cost multiplied by the pool size or a compile time measured here called for it (RATIONALE.md, "Static
// resource limits"). Every real policy module (the Go built-in, the Go examples, the AssemblyScript
// example) is far below each one (TestInstrumentCompilesAll and TestPoliciesRankIdentically run them).
const (
	// MaxTableElements bounds the elements every table of a module can ever hold, summed over its
	// defined and imported tables: a table counts with its minimum, or with its maximum when the module
	// has a table.grow on it, and such a table must declare a maximum. 1<<20 entries are 8 MiB per
	// instance (wazero keeps a table as a []uintptr); Go's modules have one table of about 5,800 entries
	// and no maximum (they never grow it).
	MaxTableElements = 1 << 20
	// MaxTables bounds the number of tables (defined + imported). Go and AssemblyScript use at most one.
	MaxTables = 16
	// MaxElementEntries bounds the entries of all element segments together (each passive segment is
	// copied into every instance).
	MaxElementEntries = 1 << 20
	// MaxDataSegments bounds the data segments; Go's linker never writes more than 100,000 (the limit
	// browsers enforce); the built-in has about 28,000.
	MaxDataSegments = 100_000
	// MaxTypes bounds the type section's entries (JS API: 1,000,000; the built-in has 13).
	MaxTypes = 1 << 16
	// MaxParams and MaxResults bound one function type's parameters and results (JS API: 1,000 each).
	MaxParams  = 1000
	MaxResults = 1000
	// MaxImports bounds the imports (JS API: 100,000, later raised to 1,000,000; the host allows 15 WASI
	// functions).
	MaxImports = 1000
	// MaxExports bounds the exports (JS API: 100,000, later raised to 1,000,000).
	MaxExports = 10_000
	// MaxFunctions bounds defined + imported functions (JS API: 1,000,000). wazero compiles every
	// function up front at a fixed cost each: 2 million empty functions took 8.7 s and 1.1 GB here.
	MaxFunctions = 1 << 17
	// MaxGlobals bounds defined + imported globals (JS API: 1,000,000); each instance allocates one
	// object per global.
	MaxGlobals = 1 << 16
	// MaxLocals bounds one body's declared locals (JS API: 50,000): wazero allocates per local at
	// decode, compile and call (a frame), so `(local 100000000 i64)` — 5 bytes — took the process down.
	MaxLocals = 50_000
	// MaxModuleLocals bounds the declared locals of all bodies together.
	MaxModuleLocals = 1 << 22
	// MaxBodyBytes bounds one function body (JS API: 7,654,321 bytes); one body of 12 MB compiled
	// in 1.2 s with a 650 MB heap here.
	MaxBodyBytes = 1 << 20
	// MaxBlockDepth bounds the nesting of block, loop and if in one body: wazero's compiler is
	// quadratic in it (one million nested blocks, 3 MB, compiled for over 2 minutes).
	MaxBlockDepth = 1 << 12
	// MaxBrTableTargets bounds one br_table's label vector (V8: 65,520): 4 million targets compiled
	// for over 2 minutes here.
	MaxBrTableTargets = 1 << 14
	// MaxNestingWork bounds the sum, over every block, loop and if of the module, of the depth it is
	// nested at. wazero's compile time grows with it (4,096 nested blocks, 8.4 M: 77 ms; 65,536: 44 s),
	// and many functions each under MaxBlockDepth would add up. The built-in has 1.6 M.
	MaxNestingWork = 1 << 25
	// MaxBranchWork bounds the sum, over every label of the module, of the square of the number of
	// branches to it (br, br_if, br_table entries, return). wazero's compiler is quadratic in a
	// block's predecessors: 16,384 `br_if 0` in one block (64 KB) compiled for 4.5 s, 65,536 for over
	// 100 s. The built-in has 1.03 M (at most 217 branches to one label).
	MaxBranchWork = 1 << 24
	// MaxStackUnits bounds the call stack of a metered call, in units of about 64 bytes of frame: each
	// function that calls others adds 1 + (params + locals)/8 + (body bytes)/64 units at its entry and
	// gives them back at every exit; beyond the limit the guest traps (unreachable). wazero 1.12 grows a
	// call's stack by doubling up to a 50 MB ceiling and keeps it with the instance afterwards, so
	// unbounded recursion cost ~120 MB per call before the stack-overflow trap, and a call that recursed
	// a million frames deep and returned left each pooled instance holding ~80 MB. 1<<17 units are
	// ~8 MiB of frames; Go's runtime and the built-in stay far below (a Go frame costs 1–400 units).
	MaxStackUnits = 1 << 17
)

func limitErr(off int, format string, args ...any) *Error {
	e := malformed(off, format, args...)
	e.Kind = ErrLimit
	return e
}

// table is one table's limits, and where the module grows it (-1: never).
type table struct {
	at       int // offset of its declaration
	min      uint64
	max      uint64
	hasMax   bool
	growAt   int
	imported bool
}

// checkTableLimits enforces MaxTables and MaxTableElements once the code has been read (table.grow sites).
func (m *module) checkTableLimits() *Error {
	if len(m.tables) > MaxTables {
		return limitErr(m.tables[MaxTables].at, "%d tables (limit MaxTables = %d)", len(m.tables), MaxTables)
	}
	var sum uint64
	for i, t := range m.tables {
		n := t.min
		if n > MaxTableElements {
			return limitErr(t.at, "table %d: minimum of %d elements exceeds MaxTableElements = %d", i, n, MaxTableElements)
		}
		if t.growAt >= 0 {
			if !t.hasMax {
				return limitErr(t.growAt, "table.grow on table %d, which declares no maximum (a grown table must declare one ≤ MaxTableElements = %d)", i, MaxTableElements)
			}
			n = t.max
		}
		if n > MaxTableElements {
			return limitErr(t.growAt, "table %d: maximum (it is grown) of %d elements exceeds MaxTableElements = %d", i, n, MaxTableElements)
		}
		if sum += n; sum > MaxTableElements {
			return limitErr(t.at, "tables hold up to %d elements together (limit MaxTableElements = %d)", sum, MaxTableElements)
		}
	}
	return nil
}

// tableLimits reads a table type's reference type and limits.
func (r *reader) tableLimits(at int, imported bool) table {
	t := table{at: at, growAt: -1, imported: imported}
	r.refType()
	flags := r.byte()
	if r.err != nil {
		return t
	}
	if flags > 7 {
		r.pos--
		r.fail("limits flags %#x", flags)
		return t
	}
	read := func() uint64 {
		if flags&4 != 0 {
			return r.u64()
		}
		return uint64(r.u32())
	}
	t.min = read()
	if flags&1 != 0 {
		t.max, t.hasMax = read(), true
	}
	return t
}

// u64 reads an unsigned LEB128 of at most 10 bytes.
func (r *reader) u64() uint64 {
	var v uint64
	for shift := uint(0); shift < 70; shift += 7 {
		c := r.byte()
		if r.err != nil {
			return 0
		}
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v
		}
	}
	r.fail("bad u64 LEB128")
	return 0
}
