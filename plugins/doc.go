// Package plugins runs kvgate's routing policies: WebAssembly modules speaking ABI v1 (ABI.md in this
// folder; the Go encoder is package sdk) on wazero, with the built-in three-tier policy embedded.
//
// A Host owns one wazero runtime in compiler mode with a compilation cache (in memory, plus an optional
// directory). Load compiles and validates a module (exports and signatures, ABI version, WASI imports from
// an allowlist, valid answers to sample snapshots within the call deadline) and names it Version
// "name@sha256hex". An uploaded module is first rewritten by package wasmmeter so that every function
// entry and loop iteration spends fuel and, every Options.FuelInterval units, calls back into the host,
// which checks the call's deadline; the embedded built-in runs as shipped. Activate builds a fixed pool of
// initialised instances for one model and swaps it in atomically; in-flight calls finish on the old pool,
// which is closed once drained. Follow makes a model run what a fleet's store names (the top of its
// activation stack, the entry below kept warm); the host keeps no history of its own. Rollback swaps the
// warm previous activation back in (one step). Unload forgets a version no model runs or keeps warm.
//
// Rank never fails: on a trap, a missed deadline, a guest error code or an invalid ranking it returns the
// native three-tier ranking (package threetier, same code as the built-in module) and counts why. Calls
// run on the caller's goroutine. An uploaded call is stopped at the first refill after its deadline,
// whatever it runs (loop, loop-free call tree, start function), and the Go runtime can stop its goroutine
// there, so a runaway guest neither outlives its deadline by more than one fuel interval nor holds up a
// garbage collection. A call still computing at its deadline (Options.RunawayRefills) disables its
// version at once, as do Options.MaxConsecutiveMisses misses in a row; its models go back to their
// previous activation (Stats, kvgate_policy_interrupted_calls_total, _overrun_seconds_total).
//
// Instances have no filesystem, network or sleep; only the real monotonic clock (Go's GC needs it) and
// wazero's deterministic fake wall clock and random source; stdout/stderr are capped; memory is limited
// per instance. A Host is safe for concurrent use.
package plugins
