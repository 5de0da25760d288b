package wasmmeter

import (
	"errors"
	"fmt"
)

// ErrMalformed is wrapped by an *Error when the input is not a well-formed WebAssembly binary (truncated,
// bad LEB128, section or body sizes that do not add up, indices out of range, sections out of order).
var ErrMalformed = errors.New("malformed wasm")

// ErrUnsupported is wrapped by an *Error when the input uses an opcode, section or form outside
// wazero 1.12's default feature set (threads 0xFE, exception handling, tail calls, GC, typed function
// references, tag sections, unknown non-custom sections).
var ErrUnsupported = errors.New("unsupported wasm")

// ErrLimit is wrapped by an *Error when the module is well formed but declares more than the gateway
// lets an uploaded module allocate or compile: tables, table.grow, locals, section entry counts, body
// size, block nesting, br_table width (the Max* constants in limits.go).
var ErrLimit = errors.New("resource limit exceeded")

// ErrAlreadyMetered is wrapped by an *Error when the input already imports from ImportModule: metering
// twice would make the guest provide the import itself or shadow the host's.
var ErrAlreadyMetered = errors.New("module already imports " + ImportModule)

// Error is the error Instrument returns: what went wrong and where in the input.
type Error struct {
	// Offset is the byte offset in the input module where the problem was found.
	Offset int
	// Kind is ErrMalformed, ErrUnsupported, ErrLimit or ErrAlreadyMetered; errors.Is(err, Kind) holds.
	Kind error
	// Detail says what was found, e.g. "opcode 0xfe".
	Detail string
}

// Error returns "<kind> at byte <offset>: <detail>".
func (e *Error) Error() string { return fmt.Sprintf("%v at byte %d: %s", e.Kind, e.Offset, e.Detail) }

// Unwrap returns Kind.
func (e *Error) Unwrap() error { return e.Kind }
