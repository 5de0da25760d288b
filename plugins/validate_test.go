package plugins

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestCompilerPanicIsRejected: a module on which wazero 1.12's compiler panics (found by wasmmeter's
// fuzzer) is rejected with a problem, instead of taking the process down.
func TestCompilerPanicIsRejected(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger()})
	wasm := readWasm(t, "compilerpanic")
	if _, err := compileModule(context.Background(), h.rt, wasm); err == nil || !strings.Contains(err.Error(), "the compiler panicked") {
		t.Fatalf("compile: %v, want the recovered panic", err)
	}
	if _, rep, err := h.Load("panic", wasm); !errors.Is(err, ErrInvalidModule) || rep.OK() {
		t.Fatalf("%v %v", err, rep.Problems)
	}
}

// TestTrapReported: a sample that traps shows the runtime's message in the report, not only the guest's
// output (bomb.wasm traps with unreachable on sequence 1003; the samples do not, so call it directly).
func TestTrapReported(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger()})
	_, bomb := activateBomb(t, h, "m", "bomb-trap")
	ver := h.versions[bomb]
	inst, err := h.newInstance(context.Background(), ver, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, reason, _ := h.sampleCall(context.Background(), ver, inst, bombSnapshot(1003), time.Second); reason != ReasonTrap {
		t.Fatalf("reason %v", reason)
	}
	if got := trapText(inst); !strings.HasPrefix(got, "wasm error: unreachable") {
		t.Fatalf("trap text %q", got)
	}
	inst.close()
}

// TestInitErrorCarriesGuestReason: an uploaded SDK module whose Init rejects the config fails Activate with
// the SDK's reason (written to stderr by the guest), not only the error code.
func TestInitErrorCarriesGuestReason(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger()})
	v, _, err := h.Load("three-tier-uploaded", BuiltinWasm)
	if err != nil {
		t.Fatal(err)
	}
	err = h.Activate("m", v, []byte(`{"imbalance_treshold":4}`))
	if !errors.Is(err, ErrInitFailed) || !strings.Contains(err.Error(), "kvgate_policy_init returned -3: kvgate policy: init rejected the config") ||
		!strings.Contains(err.Error(), "imbalance_treshold") {
		t.Fatalf("activate with a typo: %v", err)
	}
}
