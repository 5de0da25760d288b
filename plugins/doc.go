// Package plugins runs kvgate's routing policies: WebAssembly modules speaking ABI v1 (ABI.md in this
// folder; the Go encoder is package sdk) on wazero, with the built-in three-tier policy embedded.
//
// A Host owns two wazero runtimes in compiler mode sharing one compilation cache (in memory, plus an
// optional directory): a trusted one without interruption for the embedded built-in, and one with
// WithCloseOnContextDone(true) for uploaded modules. Load compiles and validates a module (exports and
// signatures, ABI version, WASI imports from an allowlist, valid answers to sample snapshots within the
// call deadline, and a static call-graph check for call trees wazero could not interrupt) and names it
// Version "name@sha256hex". Activate builds a fixed pool of initialised
// instances for one model and swaps it in atomically; in-flight calls finish on the old pool, which is
// closed once drained. Rollback restores the model's previous activation (kept warm).
//
// Rank never fails: on a trap, a missed deadline, a guest error code or an invalid ranking it returns the
// native three-tier ranking (package threetier, same code as the built-in module) and counts why. A call
// to an uploaded module runs on its own goroutine so the request gets its answer at the deadline even
// when wazero cannot interrupt the guest (a loop-free exponential call tree). A call still running
// Options.StuckAfter past its deadline disables its version at that moment (as do MaxConsecutiveMisses
// missed deadlines in a row); its models go back to their previous activation, the stuck instance is
// never reused, and the abandoned calls still running are capped (Options.MaxAbandoned) and measured
// (Stats, kvgate_policy_abandoned_*).
//
// Instances have no filesystem, network or sleep; only the real monotonic clock (Go's GC needs it) and
// wazero's deterministic fake wall clock and random source; stdout/stderr are capped; memory is limited
// per instance. A Host is safe for concurrent use.
package plugins
