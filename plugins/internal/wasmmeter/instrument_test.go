package wasmmeter_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/plugins/internal/wasmmeter"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// policyModules are the real policies: the embedded built-in (Go), the AssemblyScript example, two Go
// examples committed here (built by `make policies` from examples/policies at the commit that added
// them), and whatever `make policies` last wrote to bin/policies.
func policyModules(t *testing.T) []string {
	paths := []string{
		"../../builtin/threetier.wasm",
		"../../../examples/policies/three-tier-as/three-tier-as.wasm",
		"testdata/sglang-cache-aware.wasm.gz",
		"testdata/llmd-weighted.wasm.gz",
	}
	built, _ := filepath.Glob("../../../bin/policies/*.wasm")
	return append(paths, built...)
}

func TestInstrumentCompilesAll(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t, &meter{Interval: 10000})
	tests, err := filepath.Glob("../../testdata/*.wasm")
	if err != nil || len(tests) < 10 {
		t.Fatalf("plugins/testdata modules: %v %v", tests, err)
	}
	for _, path := range append(tests, policyModules(t)...) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			in := readModule(t, path)
			if err := compileErr(ctx, rt, in); err != nil {
				t.Skipf("the original does not compile either: %v", err) // e.g. compilerpanic.wasm
			}
			if _, err := wasmmeter.Instrument(in); errors.Is(err, wasmmeter.ErrLimit) {
				t.Skipf("over a resource limit (plugins' TestResourceBombs expects it): %v", err) // table-min.wasm...
			}
			out := instrument(t, in)
			if len(out) <= len(in) {
				t.Fatalf("output %d bytes, input %d: nothing added", len(out), len(in))
			}
			c, err := rt.CompileModule(ctx, out)
			if err != nil {
				t.Fatalf("wazero rejects the instrumented module: %v", err)
			}
			var found bool
			for _, def := range c.ImportedFunctions() {
				mod, name, _ := def.Import()
				if mod == wasmmeter.ImportModule && name == wasmmeter.ImportName {
					found = len(def.ParamTypes()) == 0 && slices.Equal(def.ResultTypes(), []api.ValueType{api.ValueTypeI32})
				}
			}
			if !found {
				t.Fatal("no refill import of type () -> i32")
			}
		})
	}
}

// TestPoliciesRankIdentically: each real policy, instrumented and run without WithCloseOnContextDone,
// answers 300 random snapshots exactly as the original module does, and the refill is really called.
func TestPoliciesRankIdentically(t *testing.T) {
	ctx := context.Background()
	for _, path := range policyModules(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			in := readModule(t, path)
			plain := newRuntime(t, nil)
			m := &meter{Interval: 1000}
			metered := newRuntime(t, m)
			c0, err := plain.CompileModule(ctx, in)
			if err != nil {
				t.Fatal(err)
			}
			c1, err := metered.CompileModule(ctx, instrument(t, in))
			if err != nil {
				t.Fatal(err)
			}
			p0, err := newPolicy(ctx, t, plain, c0)
			if err != nil {
				t.Fatal(err)
			}
			p1, err := newPolicy(ctx, t, metered, c1)
			if err != nil {
				t.Fatal(err)
			}
			sizes := []int{1, 2, 3, 8, 16, 64}
			nonEmpty := 0
			for i := range 300 {
				s := randomSnapshot(uint64(i)*7919+1, sizes[i%len(sizes)])
				r0, code0, err0 := p0.rank(ctx, &s)
				r1, code1, err1 := p1.rank(ctx, &s)
				if err0 != nil || err1 != nil {
					t.Fatalf("snapshot %d: errors %v / %v", i, err0, err1)
				}
				if code0 != code1 || !slices.Equal(r0, r1) {
					t.Fatalf("snapshot %d: original %v (%d), instrumented %v (%d)", i, r0, code0, r1, code1)
				}
				if len(r0) > 0 {
					nonEmpty++
				}
			}
			if nonEmpty < 200 {
				t.Fatalf("only %d of 300 rankings non-empty: the comparison proves little", nonEmpty)
			}
			if m.calls.Load() < 2 {
				t.Fatalf("refill called %d times", m.calls.Load())
			}
			t.Logf("refill calls at interval %d over init and 300 calls: %d", m.Interval, m.calls.Load())
		})
	}
}

// TestRenumber runs testdata/renumber.wasm (imports, start function, element segments of all eight
// forms, ref.func in a global and in code, two tables, name section) before and after instrumenting.
func TestRenumber(t *testing.T) {
	ctx := context.Background()
	in := readModule(t, "testdata/renumber.wasm")
	genv := readModule(t, "testdata/genv.wasm")
	type result struct {
		logs []int32
		out  map[string]uint64
	}
	run := func(wasm []byte, m *meter) result {
		rt := newRuntime(t, m)
		var res result
		_, err := rt.NewHostModuleBuilder("env").
			NewFunctionBuilder().WithFunc(func(a, b int32) int32 { return a + b }).Export("add").
			NewFunctionBuilder().WithFunc(func(v int32) { res.logs = append(res.logs, v) }).Export("log").
			Instantiate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rt.InstantiateWithConfig(ctx, genv, wazero.NewModuleConfig().WithName("genv")); err != nil {
			t.Fatal(err)
		}
		c, err := rt.CompileModule(ctx, wasm)
		if err != nil {
			t.Fatal(err)
		}
		names := c.ExportedFunctions()
		if names["fib"] == nil || names["fib"].Name() != "fib" {
			t.Fatalf("name section: fib's name is %q", names["fib"].Name())
		}
		if pn := names["call_t"].ParamNames(); !slices.Equal(pn, []string{"i", "x"}) { // local names (subsection 2)
			t.Fatalf("name section: call_t's parameter names are %q", pn)
		}
		if names["call_t"].Name() != "call_t" || names["started"].Name() != "" {
			t.Fatalf("name section: call_t named %q, the unnamed export %q", names["call_t"].Name(), names["started"].Name())
		}
		mod, err := rt.InstantiateModule(ctx, c, wazero.NewModuleConfig())
		if err != nil {
			t.Fatal(err)
		}
		res.out = map[string]uint64{}
		call := func(key, fn string, args ...uint64) {
			r, err := mod.ExportedFunction(fn).Call(ctx, args...)
			if err != nil {
				t.Fatalf("%s: %v", key, err)
			}
			if len(r) > 0 {
				res.out[key] = r[0]
			}
		}
		call("started", "started")
		call("t0", "call_t", 0, 5)
		call("t1", "call_t", 1, 5)
		call("t2", "call_t", 2, 5)
		call("t2_0", "call_t2", 0, 5)
		call("t2_1", "call_t2", 1, 5)
		call("init", "init_passive")
		call("t4", "call_t", 4, 5)
		call("t5", "call_t", 5, 5)
		call("t6", "call_t", 6, 5)
		call("global", "call_global", 5)
		call("declared0", "call_declared", 0, 5)
		call("declared1", "call_declared", 1, 5)
		call("sum", "sum", 100)
		call("fib", "fib", 20)
		return res
	}
	want := map[string]uint64{"started": 42, "t0": 10, "t1": 15, "t2": 6, "t2_0": 25, "t2_1": 10, "t4": 6,
		"t5": 4, "t6": 4, "global": 15, "declared0": 1005, "declared1": 2005, "sum": 4950, "fib": 6765}
	m := &meter{Interval: 7}
	for name, r := range map[string]result{"original": run(in, nil), "instrumented": run(instrument(t, in), m)} {
		for k, v := range want {
			if got := r.out[k]; got != v {
				t.Errorf("%s: %s = %d, want %d", name, k, got, v)
			}
		}
		if !slices.Equal(r.logs, []int32{1}) {
			t.Errorf("%s: start function logged %v, want [1]", name, r.logs)
		}
	}
	// fib(20) alone makes 21,891 calls: with 7 units per refill the meter must have run thousands of times.
	if m.calls.Load() < 21891/7 {
		t.Errorf("refill called %d times, want at least %d", m.calls.Load(), 21891/7)
	}
}

// TestSynthesizedSections: a module with no type, import or global section gets all three, in order.
func TestSynthesizedSections(t *testing.T) {
	// (module (func (export "f") (result i32) (i32.const 7))) without a type section is invalid, so use a
	// module with only a memory and a data segment, then one with a single () -> i32 type to reuse.
	bare := []byte("\x00asm\x01\x00\x00\x00" + "\x05\x03\x01\x00\x01" + "\x0b\x07\x01\x00\x41\x00\x0b\x01\x2a")
	out := instrument(t, bare)
	ctx := context.Background()
	rt := newRuntime(t, &meter{Interval: 1})
	if _, err := rt.CompileModule(ctx, out); err != nil {
		t.Fatalf("%v\n% x", err, out)
	}
	ids := sectionIDs(t, out)
	if want := []byte{1, 2, 5, 6, 11}; !slices.Equal(ids, want) {
		t.Fatalf("sections %v, want %v", ids, want)
	}
	// One type () -> i32, one function returning 7 in a loop-free body: the type is reused (still one).
	withType := []byte("\x00asm\x01\x00\x00\x00" + "\x01\x05\x01\x60\x00\x01\x7f" + "\x03\x02\x01\x00" +
		"\x07\x05\x01\x01f\x00\x00" + "\x0a\x06\x01\x04\x00\x41\x07\x0b")
	out = instrument(t, withType)
	if out[8] != 1 || out[9] != 5 || out[10] != 1 {
		t.Fatalf("type section not reused unchanged: % x", out[:16])
	}
	c, err := rt.CompileModule(ctx, out)
	if err != nil {
		t.Fatal(err)
	}
	mod, err := rt.InstantiateModule(ctx, c, wazero.NewModuleConfig())
	if err != nil {
		t.Fatal(err)
	}
	if r, err := mod.ExportedFunction("f").Call(ctx); err != nil || r[0] != 7 {
		t.Fatalf("f() = %v, %v", r, err)
	}
}

func sectionIDs(t *testing.T, wasm []byte) []byte {
	var ids []byte
	for p := 8; p < len(wasm); {
		id := wasm[p]
		var size, shift uint
		p++
		for {
			c := wasm[p]
			p++
			size |= uint(c&0x7f) << shift
			shift += 7
			if c < 0x80 {
				break
			}
		}
		ids = append(ids, id)
		p += int(size)
	}
	return ids
}

func TestErrors(t *testing.T) {
	hdr := "\x00asm\x01\x00\x00\x00"
	cases := []struct {
		name string
		wasm string
		kind error
		off  int
	}{
		{"empty", "", wasmmeter.ErrMalformed, 0},
		{"magic", "\x00wasm\x01\x00\x00", wasmmeter.ErrMalformed, 0},
		{"version", "\x00asm\x02\x00\x00\x00", wasmmeter.ErrUnsupported, 4},
		{"section size", hdr + "\x01\x10\x00", wasmmeter.ErrMalformed, 8},
		{"order", hdr + "\x03\x01\x00\x01\x01\x00", wasmmeter.ErrMalformed, 11},
		{"tag section", hdr + "\x0d\x01\x00", wasmmeter.ErrUnsupported, 8},
		{"unknown section", hdr + "\x0e\x00", wasmmeter.ErrUnsupported, 8},
		{"already metered", hdr + "\x01\x04\x01\x60\x00\x00" + "\x02\x15\x01\x0ckvgate_meter\x06refill\x00\x00",
			wasmmeter.ErrAlreadyMetered, 17},
		// one function () -> () whose body is `atomic.fence` (0xfe 0x03 0x00)
		{"threads", hdr + "\x01\x04\x01\x60\x00\x00\x03\x02\x01\x00\x0a\x07\x01\x05\x00\xfe\x03\x00\x0b",
			wasmmeter.ErrUnsupported, 23},
		// return_call 0
		{"tail call", hdr + "\x01\x04\x01\x60\x00\x00\x03\x02\x01\x00\x0a\x06\x01\x04\x00\x12\x00\x0b",
			wasmmeter.ErrUnsupported, 23},
		// call 5 with one function
		{"call out of range", hdr + "\x01\x04\x01\x60\x00\x00\x03\x02\x01\x00\x0a\x06\x01\x04\x00\x10\x05\x0b",
			wasmmeter.ErrMalformed, 24},
		// i32.const with a truncated LEB
		{"truncated immediate", hdr + "\x01\x04\x01\x60\x00\x00\x03\x02\x01\x00\x0a\x05\x01\x03\x00\x41\x80",
			wasmmeter.ErrMalformed, 23},
		// a table with an initializer expression (function references proposal)
		{"table init expr", hdr + "\x04\x09\x01\x40\x00\x70\x00\x01\xd0\x70\x0b", wasmmeter.ErrUnsupported, 11},
		// a function of type 5 with one type: wazero 1.12 panics on such modules when they call it
		{"type index", hdr + "\x01\x04\x01\x60\x00\x00\x03\x02\x01\x05", wasmmeter.ErrMalformed, 17},
		// two bodies declared, one function
		{"body count", hdr + "\x01\x04\x01\x60\x00\x00\x03\x02\x01\x00\x0a\x04\x02\x02\x00\x0b",
			wasmmeter.ErrMalformed, 20},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := wasmmeter.Instrument([]byte(c.wasm))
			var e *wasmmeter.Error
			if !errors.As(err, &e) || !errors.Is(err, c.kind) {
				t.Fatalf("got %v (%T), want *Error wrapping %v", err, err, c.kind)
			}
			if e.Offset != c.off {
				t.Errorf("offset %d, want %d (%v)", e.Offset, c.off, err)
			}
			if out != nil {
				t.Error("output returned with an error")
			}
		})
	}
}

// TestInstrumentDoesNotModifyInput guards the copy semantics.
func TestInstrumentDoesNotModifyInput(t *testing.T) {
	in := readModule(t, "../../builtin/threetier.wasm")
	keep := slices.Clone(in)
	start := time.Now()
	instrument(t, in)
	t.Logf("instrumented %d bytes in %v", len(in), time.Since(start))
	if !slices.Equal(in, keep) {
		t.Fatal("input modified")
	}
}

// TestNameMapStaleEntry: a function-name entry naming no function (wazero does not check them) is
// dropped; the valid entry is renumbered with its function.
func TestNameMapStaleEntry(t *testing.T) {
	wasm := []byte("\x00asm\x01\x00\x00\x00" + "\x01\x04\x01\x60\x00\x00" + "\x03\x02\x01\x00" +
		"\x07\x05\x01\x01f\x00\x00" + "\x0a\x04\x01\x02\x00\x0b" +
		"\x00\x14\x04name" + "\x01\x0d\x02" + "\x00\x04main" + "\x05\x04gone")
	ctx := context.Background()
	rt := newRuntime(t, &meter{Interval: 1})
	if err := compileErr(ctx, rt, wasm); err != nil {
		t.Fatalf("hand-built input does not compile: %v", err)
	}
	c, err := rt.CompileModule(ctx, instrument(t, wasm))
	if err != nil {
		t.Fatal(err)
	}
	if name := c.ExportedFunctions()["f"].Name(); name != "main" {
		t.Fatalf("f is named %q, want main", name)
	}
}
