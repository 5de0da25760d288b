package wasmmeter_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/plugins/internal/wasmmeter"
	"github.com/kvgate/kvgate/sdk"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// BenchmarkInstrument rewrites the embedded built-in policy (a 2.5 MB Go wasip1 module).
func BenchmarkInstrument(b *testing.B) {
	in := readModule(b, "../../builtin/threetier.wasm")
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		if _, err := wasmmeter.Instrument(in); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRank16 measures one choose call of the built-in policy on 16 endpoints: "plain" is the
// module as is and "metered" the instrumented module (refill interval 10,000), both in a compiler
// runtime without WithCloseOnContextDone; "interrupt" is the plain module in a runtime WITH it (the
// uploaded-module path before metering). p50-ns and p99-ns are per-call percentiles over the run.
func BenchmarkRank16(b *testing.B) {
	in := readModule(b, "../../builtin/threetier.wasm")
	for _, v := range []string{"plain", "metered", "interrupt"} {
		b.Run(v, func(b *testing.B) {
			ctx := context.Background()
			wasm := in
			var rt wazero.Runtime
			switch v {
			case "plain":
				rt = newRuntime(b, nil)
			case "metered":
				rt = newRuntime(b, &meter{Interval: 10000})
				wasm = instrument(b, in)
			case "interrupt":
				rt = wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler().WithCloseOnContextDone(true))
				b.Cleanup(func() { _ = rt.Close(ctx) })
				wasi_snapshot_preview1.MustInstantiate(ctx, rt)
			}
			c, err := rt.CompileModule(ctx, wasm)
			if err != nil {
				b.Fatal(err)
			}
			p, err := newPolicy(ctx, b, rt, c)
			if err != nil {
				b.Fatal(err)
			}
			cctx, cancel := context.WithTimeout(ctx, time.Hour) // a deadline, as a real call has
			defer cancel()
			snap := make([]sdk.Snapshot, 64)
			for i := range snap {
				snap[i] = randomSnapshot(uint64(i)+1, 16)
			}
			lat := make([]time.Duration, 0, 1<<16)
			i := 0
			for b.Loop() {
				t0 := time.Now()
				if _, _, err := p.rank(cctx, &snap[i%len(snap)]); err != nil {
					b.Fatal(err)
				}
				if len(lat) < cap(lat) {
					lat = append(lat, time.Since(t0))
				}
				i++
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
		})
	}
}

// BenchmarkLoopIteration measures what one guest loop iteration costs (ns/op is per iteration, over
// spin(100000)): "plain" unmetered without interruption, "interrupt" with WithCloseOnContextDone,
// "metered" instrumented at refill interval 10,000, and "metered-1" at interval 1 (a refill, i.e. a
// host call, every iteration: what one refill costs).
func BenchmarkLoopIteration(b *testing.B) {
	const n = 100000
	in := readModule(b, "testdata/spin.wasm")
	for _, v := range []struct {
		name     string
		interval int32 // 0: not instrumented
		intr     bool
	}{{"plain", 0, false}, {"interrupt", 0, true}, {"metered", 10000, false}, {"metered-1", 1, false}} {
		b.Run(v.name, func(b *testing.B) {
			ctx := context.Background()
			cfg := wazero.NewRuntimeConfigCompiler().WithCloseOnContextDone(v.intr)
			rt := wazero.NewRuntimeWithConfig(ctx, cfg)
			defer rt.Close(ctx)
			wasm := in
			if v.interval > 0 {
				m := &meter{Interval: v.interval}
				_, err := rt.NewHostModuleBuilder(wasmmeter.ImportModule).NewFunctionBuilder().
					WithGoModuleFunction(api.GoModuleFunc(m.refill), nil, []api.ValueType{api.ValueTypeI32}).
					Export(wasmmeter.ImportName).Instantiate(ctx)
				if err != nil {
					b.Fatal(err)
				}
				wasm = instrument(b, in)
			}
			mod, err := rt.Instantiate(ctx, wasm)
			if err != nil {
				b.Fatal(err)
			}
			spin := mod.ExportedFunction("spin")
			stack := make([]uint64, 1)
			cctx, cancel := context.WithTimeout(ctx, time.Hour)
			defer cancel()
			var runs int
			for b.Loop() {
				stack[0] = n
				if err := spin.CallWithStack(cctx, stack); err != nil || stack[0] != n {
					b.Fatal(err, stack[0])
				}
				runs++
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(runs*n), "ns/iter")
		})
	}
}
