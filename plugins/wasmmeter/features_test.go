package wasmmeter_test

import (
	"context"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// TestFeatures runs testdata/features.wasm (SIMD, 0xFC, reference types, typed select, sign extension,
// a multi-value loop) before and after instrumenting: every export returns the same value.
func TestFeatures(t *testing.T) {
	ctx := context.Background()
	in := readModule(t, "testdata/features.wasm")
	run := func(wasm []byte, m *meter) map[string]uint64 {
		rt := newRuntime(t, m)
		mod, err := rt.InstantiateWithConfig(ctx, wasm, wazero.NewModuleConfig())
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]uint64{}
		for _, c := range []struct {
			name string
			args []uint64
		}{{"simd", nil}, {"misc", nil}, {"refs", []uint64{api.EncodeExternref(0x1234)}}, {"multiloop", []uint64{10}}} {
			name, args := c.name, c.args // misc drops the data segment simd initializes from: simd first
			r, err := mod.ExportedFunction(name).Call(ctx, args...)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			out[name] = r[0]
		}
		return out
	}
	m := &meter{Interval: 3}
	want, got := run(in, nil), run(instrument(t, in), m)
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s: instrumented %d, original %d", name, got[name], v)
		}
	}
	if want["multiloop"] != 55 { // 10+9+...+1
		t.Errorf("multiloop(10) = %d, want 55", want["multiloop"])
	}
	// Metered points: refs' entry (it has a call_indirect), multiloop's entry and its 10 loop headers;
	// simd, misc, $id, $step and $peek make no calls and have no loop. 12 units at 3 per refill, the
	// first refill at fuel 0: exactly 4 refills.
	if m.calls.Load() != 4 {
		t.Errorf("refill called %d times, want 4", m.calls.Load())
	}
	t.Logf("results %v, refills %d", want, m.calls.Load())
}
