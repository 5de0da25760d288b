// Package wasmmeter rewrites a WebAssembly module so that it meters its own execution with fuel, the
// technique wasmtime calls "fuel": every defined function's entry and every `loop` header spends one unit
// from a new mutable i32 global, and when the global is at or below zero the guest calls the imported host
// function ImportModule.ImportName, whose i32 result becomes the new fuel.
//
// The host function is Go code. It can check the call's deadline and abort the call by panicking with an
// error (wazero returns that error from the export's Call), and, being Go, it is a point where the Go
// scheduler and garbage collector can stop the goroutine. Any unbounded execution passes a loop header or
// a function entry, and bulk memory and table operations spend one unit per KiB of their length, so a
// metered call runs at most about one fuel interval past the moment its refill first refuses (plus one
// bulk operation in flight) — including loop-free call trees, which wazero's WithCloseOnContextDone
// cannot interrupt.
//
// Instrument also closes what fuel cannot see: it rejects modules whose declarations would make wazero
// allocate or compile without bound (tables, locals, section counts, body size, nesting and branch
// budgets: ErrLimit, limits.go), charges memory.grow and the size-dependent WASI calls, and meters the
// call stack (MaxStackUnits) so recursion traps long before wazero's 50 MB stack ceiling.
//
// Instrument accepts what wazero 1.12 accepts by default (api.CoreFeaturesV2: MVP, sign extension,
// non-trapping conversions, bulk memory, reference types, multi-value, SIMD). Other proposals (threads,
// tail calls, exception handling, GC and typed function references, extended constants in code) are
// rejected with an *Error wrapping ErrUnsupported. See README.md for the rewritten layout and RATIONALE.md
// for the choices made.
package wasmmeter
