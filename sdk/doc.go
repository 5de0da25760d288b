// Package sdk is the guest-side Go SDK for kvgate routing policies (ABI v1, see plugins/ABI.md).
//
// A policy author implements Policy (Init takes the policy's JSON config once per instance; Choose ranks
// the endpoints of one request, best first) and calls Register once, from init(), in a main package with
// an empty main. Built with
//
//	GOOS=wasip1 GOARCH=wasm go build -trimpath -buildmode=c-shared -o policy.wasm ./path/to/policy
//
// the package exports the ABI v1 functions with //go:wasmexport and hides the flat binary layout: the host
// writes the snapshot into a fixed buffer the guest exports, the SDK decodes it into a reused Snapshot (no
// allocation per call; a v1.0 snapshot's endpoint records are used in place, since Endpoint has the
// record's 48-byte layout), calls Choose, checks the Ranking and writes it back. A panic inside Init or Choose
// is recovered and returned to the host as ErrCodePanic, so the instance stays usable.
//
// The same code builds natively (the exports are only compiled for wasip1), so a policy can be unit-tested
// with plain `go test`; sdk/sdktest runs the same cases natively and as Wasm through the real host.
//
// Shapes and units: endpoint counts and block counts are uint32; KV-cache utilization is a fraction in
// [0,1]; the ranking holds Endpoint.Index values, best first, each at most once. This package imports only
// the standard library and is not safe for concurrent use inside one instance (a Wasm instance runs one
// call at a time; the host pools instances for concurrency).
package sdk
