package plugins

import (
	"context"
	"errors"
	"testing"
)

// TestCompilerPanicIsRejected: a module on which wazero 1.12's compiler panics (found by wasmmeter's
// fuzzer) is rejected with a problem, instead of taking the process down.
func TestCompilerPanicIsRejected(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger()})
	wasm := readWasm(t, "compilerpanic")
	if _, err := compileModule(context.Background(), h.rt, wasm); err == nil {
		t.Fatal("compiled")
	}
	if _, rep, err := h.Load("panic", wasm); !errors.Is(err, ErrInvalidModule) || rep.OK() {
		t.Fatalf("%v %v", err, rep.Problems)
	}
}
