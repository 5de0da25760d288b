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
	// simd, misc, $id, $step and $peek make no calls and have no loop. Bulk operations (all < 1 KiB)
	// cost one unit each: memory.init in simd, memory.fill and memory.copy in misc, table.grow and
	// table.fill in refs. 17 units at 3 per refill, the first refill at fuel 0: exactly 6 refills.
	if m.calls.Load() != 6 {
		t.Errorf("refill called %d times, want 6", m.calls.Load())
	}
	t.Logf("results %v, refills %d", want, m.calls.Load())
}

// TestBulkCharged: fill(100) passes its loop header 101 times (the last pass exits) and runs 100 times
// a 64 KiB memory.fill (64 + 1 units) and a 64 KiB memory.copy (64 + 1): 101 + 100*130 = 13,101 units;
// the body has no call, so no entry check. At 1,310 units per refill: 11 refills (10 would cover 13,100).
func TestBulkCharged(t *testing.T) {
	ctx := context.Background()
	in := readModule(t, "testdata/bulk.wasm")
	m := &meter{Interval: 1310}
	rt := newRuntime(t, m)
	mod, err := rt.InstantiateWithConfig(ctx, instrument(t, in), wazero.NewModuleConfig())
	if err != nil {
		t.Fatal(err)
	}
	r, err := mod.ExportedFunction("fill").Call(ctx, 100)
	if err != nil || r[0] != 99 { // the last fill wrote byte 99, copied to 65537
		t.Fatalf("fill(100) = %v, %v; want 99", r, err)
	}
	if got := m.calls.Load(); got != 11 {
		t.Fatalf("refill called %d times, want 11", got)
	}
}
