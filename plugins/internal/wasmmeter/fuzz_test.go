package wasmmeter_test

import (
	"context"
	"errors"
	"testing"

	"github.com/kvgate/kvgate/plugins/internal/wasmmeter"
	"github.com/tetratelabs/wazero"
)

// FuzzInstrument: Instrument never panics; its errors are *Error; when it succeeds on a module wazero
// compiles, wazero compiles the output too, and instrumenting the output again is ErrAlreadyMetered.
// Seeds: testdata/fuzz/FuzzInstrument (small valid modules, truncations and edge cases).
func FuzzInstrument(f *testing.F) {
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler())
	defer rt.Close(ctx)
	// wazero 1.12's CompileModule panics on some invalid modules (seed wazero-panics-on-input: a call
	// to a function whose type index is out of range); such an input counts as not compiling.
	compiles := func(wasm []byte) (ok bool) {
		defer func() {
			if recover() != nil {
				ok = false
			}
		}()
		c, err := rt.CompileModule(ctx, wasm)
		if err == nil {
			_ = c.Close(ctx)
		}
		return err == nil
	}
	f.Fuzz(func(t *testing.T, wasm []byte) {
		out, err := wasmmeter.Instrument(wasm)
		if err != nil {
			var e *wasmmeter.Error
			if !errors.As(err, &e) || e.Offset < 0 || e.Offset > len(wasm) {
				t.Fatalf("error %v (%T) is not an *Error with an offset in the input", err, err)
			}
			return
		}
		if compiles(wasm) && !compiles(out) {
			_, cerr := rt.CompileModule(ctx, out)
			t.Fatalf("input compiles, output does not: %v", cerr)
		}
		if _, err := wasmmeter.Instrument(out); !errors.Is(err, wasmmeter.ErrAlreadyMetered) {
			t.Fatalf("instrumenting the output again: %v, want ErrAlreadyMetered", err)
		}
	})
}
