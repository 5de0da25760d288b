package wasmmeter_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/kvgate/kvgate/plugins"
	"github.com/kvgate/kvgate/plugins/internal/wasmmeter"
	"github.com/kvgate/kvgate/sdk"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// errFuelDeadline is the sentinel the test refill panics with once the call's context is done.
var errFuelDeadline = errors.New("fuel refill refused: deadline passed")

// meter is the test host side of the refill import: it counts calls, refuses once the call's context
// is done, and otherwise grants Interval units.
type meter struct {
	Interval int32
	calls    atomic.Int64
}

func (m *meter) refill(ctx context.Context, _ api.Module, stack []uint64) {
	m.calls.Add(1)
	if err := ctx.Err(); err != nil {
		panic(fmt.Errorf("%w: %w", errFuelDeadline, err))
	}
	stack[0] = api.EncodeI32(m.Interval)
}

// newRuntime returns a compiler runtime WITHOUT WithCloseOnContextDone, with WASI and the meter import
// instantiated.
func newRuntime(tb testing.TB, m *meter) wazero.Runtime {
	tb.Helper()
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler())
	tb.Cleanup(func() { _ = rt.Close(ctx) })
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	if m != nil {
		_, err := rt.NewHostModuleBuilder(wasmmeter.ImportModule).NewFunctionBuilder().
			WithGoModuleFunction(api.GoModuleFunc(m.refill), nil, []api.ValueType{api.ValueTypeI32}).
			Export(wasmmeter.ImportName).Instantiate(ctx)
		if err != nil {
			tb.Fatal(err)
		}
	}
	return rt
}

// compileErr compiles wasm and returns wazero's error, or the panic wazero 1.12 raises on some invalid
// modules (plugins/testdata/compilerpanic.wasm) as an error.
func compileErr(ctx context.Context, rt wazero.Runtime, wasm []byte) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("wazero panicked: %v", r)
		}
	}()
	c, err := rt.CompileModule(ctx, wasm)
	if err == nil {
		_ = c.Close(ctx)
	}
	return err
}

// readModule reads a module from a path relative to this package; ".gz" files are decompressed.
func readModule(tb testing.TB, path string) []byte {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	if filepath.Ext(path) == ".gz" {
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			tb.Fatal(err)
		}
		if b, err = io.ReadAll(zr); err != nil {
			tb.Fatal(err)
		}
	}
	return b
}

func instrument(tb testing.TB, wasm []byte) []byte {
	tb.Helper()
	out, err := wasmmeter.Instrument(wasm)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// policy is one instance of an ABI v1 policy module (plugins/ABI.md), driven the way plugins'
// activation.go drives it: start function _initialize, init with a config, choose on the buffer.
type policy struct {
	mod    api.Module
	choose api.Function
	buf    uint32
	stack  []uint64
	enc    []byte
}

func newPolicy(ctx context.Context, tb testing.TB, rt wazero.Runtime, compiled wazero.CompiledModule) (*policy, error) {
	cfg := wazero.NewModuleConfig().WithName("").WithStartFunctions("_initialize").WithSysNanotime()
	mod, err := rt.InstantiateModule(ctx, compiled, cfg)
	if err != nil {
		return nil, err
	}
	tb.Cleanup(func() { _ = mod.Close(context.Background()) })
	p := &policy{mod: mod, choose: mod.ExportedFunction(sdk.ExportChoose), stack: make([]uint64, 1),
		enc: make([]byte, sdk.EncodedSize(64))}
	ptr, err := mod.ExportedFunction(sdk.ExportBuf).Call(ctx)
	if err != nil {
		return nil, err
	}
	p.buf = uint32(ptr[0])
	p.stack[0] = 0 // empty config: every parameter at its default
	if err := mod.ExportedFunction(sdk.ExportInit).CallWithStack(ctx, p.stack); err != nil {
		return nil, err
	}
	if code := api.DecodeI32(p.stack[0]); code != 0 {
		return nil, fmt.Errorf("init returned %d", code)
	}
	return p, nil
}

// rank encodes s into the guest buffer, calls choose and returns the guest's answer: the ranking, or
// the negative code.
func (p *policy) rank(ctx context.Context, s *sdk.Snapshot) ([]uint32, int32, error) {
	n, err := sdk.EncodeSnapshot(p.enc, s)
	if err != nil {
		return nil, 0, err
	}
	if !p.mod.Memory().Write(p.buf, p.enc[:n]) {
		return nil, 0, errors.New("buffer outside memory")
	}
	p.stack[0] = api.EncodeI32(int32(n))
	if err := p.choose.CallWithStack(ctx, p.stack); err != nil {
		return nil, 0, err
	}
	count := api.DecodeI32(p.stack[0])
	if count <= 0 {
		return nil, count, nil
	}
	res, ok := p.mod.Memory().Read(p.buf, uint32(4*count))
	if !ok {
		return nil, 0, errors.New("ranking outside memory")
	}
	out := make([]uint32, count)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(res[4*i:])
	}
	return out, count, nil
}

// randomSnapshot is plugins.RandomSnapshot: prompts of 0–4096 tokens in blocks of 16, GPU/CPU matches up to
// a shared prefix, loads 0–40, about one endpoint in eight unhealthy.
func randomSnapshot(seed uint64, n int) sdk.Snapshot { return plugins.RandomSnapshot(seed, n) }
