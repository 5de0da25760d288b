package plugins

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/kvgate/kvgate/plugins/internal/wasmmeter"
	"github.com/kvgate/kvgate/sdk"
)

// AllowedImports are the only imports a module may have: the WASI preview 1 functions Go's wasip1
// runtime links (measured with wasm-objdump on a Go 1.27 c-shared reactor). None of them reaches a file,
// socket or sleep here: the host mounts no filesystem, and wazero's WASI has no sockets.
var AllowedImports = []string{
	"wasi_snapshot_preview1.args_get",
	"wasi_snapshot_preview1.args_sizes_get",
	"wasi_snapshot_preview1.clock_time_get",
	"wasi_snapshot_preview1.environ_get",
	"wasi_snapshot_preview1.environ_sizes_get",
	"wasi_snapshot_preview1.fd_close",
	"wasi_snapshot_preview1.fd_fdstat_get",
	"wasi_snapshot_preview1.fd_fdstat_set_flags",
	"wasi_snapshot_preview1.fd_prestat_dir_name",
	"wasi_snapshot_preview1.fd_prestat_get",
	"wasi_snapshot_preview1.fd_write",
	"wasi_snapshot_preview1.poll_oneoff",
	"wasi_snapshot_preview1.proc_exit",
	"wasi_snapshot_preview1.random_get",
	"wasi_snapshot_preview1.sched_yield",
}

// ValidationReport is what Load found out about a module.
type ValidationReport struct {
	Version     Version        // name@sha256 of the module
	SizeBytes   int            // module size in bytes
	CompileTime time.Duration  // wazero compilation time (near zero from a warm cache)
	ABIMinor    int32          // the guest's minor ABI version (-1 if unknown)
	BufferCap   uint32         // bytes in the guest's buffer
	Imports     []string       // "module.name", sorted
	Exports     []string       // exported function names, sorted
	Samples     []SampleResult // one per SampleSnapshots entry, in order
	Problems    []string       // empty when the module was accepted
}

// SampleResult is one sample snapshot's outcome during validation.
type SampleResult struct {
	Name      string        // Sample.Name
	Endpoints int           // endpoints in the sample snapshot
	Ranking   []int         // the module's answer, indices into the snapshot's endpoints
	Duration  time.Duration // wall time of the call
	Problem   string        // empty when the answer was a valid ranking within the deadline
}

// OK reports whether the module was accepted.
func (r *ValidationReport) OK() bool { return len(r.Problems) == 0 }

// String renders the report for humans (kvgate policy validate).
func (r *ValidationReport) String() string {
	var b strings.Builder
	status := "ACCEPTED"
	if !r.OK() {
		status = "REJECTED"
	}
	fmt.Fprintf(&b, "%s %s\n", status, r.Version)
	abi := "unknown"
	if r.ABIMinor >= 0 {
		abi = fmt.Sprintf("v%d.%d", sdk.ABIMajor, r.ABIMinor)
	}
	fmt.Fprintf(&b, "size: %d bytes, compile: %s, ABI: %s, buffer: %d bytes\n", r.SizeBytes,
		r.CompileTime.Round(time.Microsecond), abi, r.BufferCap)
	fmt.Fprintf(&b, "imports (%d): %s\n", len(r.Imports), strings.Join(r.Imports, ", "))
	fmt.Fprintf(&b, "exports (%d): %s\n", len(r.Exports), strings.Join(r.Exports, ", "))
	for _, s := range r.Samples {
		res := fmt.Sprint(s.Ranking)
		if s.Problem != "" {
			res = "PROBLEM: " + s.Problem
		}
		fmt.Fprintf(&b, "sample %-28s %3d endpoints %10s  %s\n", s.Name, s.Endpoints, s.Duration.Round(time.Microsecond), res)
	}
	for _, p := range r.Problems {
		fmt.Fprintf(&b, "problem: %s\n", p)
	}
	return b.String()
}

type sig struct {
	params, results []api.ValueType
}

var requiredExports = map[string]sig{
	sdk.ExportMarker: {nil, nil},
	sdk.ExportMinor:  {nil, []api.ValueType{api.ValueTypeI32}},
	sdk.ExportBuf:    {nil, []api.ValueType{api.ValueTypeI32}},
	sdk.ExportBufCap: {nil, []api.ValueType{api.ValueTypeI32}},
	sdk.ExportInit:   {[]api.ValueType{api.ValueTypeI32}, []api.ValueType{api.ValueTypeI32}},
	sdk.ExportChoose: {[]api.ValueType{api.ValueTypeI32}, []api.ValueType{api.ValueTypeI32}},
}

func (h *Host) validate(ctx context.Context, ver *version, wasm []byte) *ValidationReport {
	rep := &ValidationReport{Version: ver.v, SizeBytes: len(wasm), ABIMinor: -1}
	problem := func(format string, args ...any) { rep.Problems = append(rep.Problems, fmt.Sprintf(format, args...)) }
	start := time.Now()
	code := wasm
	if !ver.trusted {
		// Uploaded modules run metered (meter.go): the rewrite adds the import kvgate_meter.refill.
		metered, err := wasmmeter.Instrument(wasm)
		if err != nil {
			problem("%v", err)
			return rep
		}
		code = metered
	}
	compiled, err := compileModule(ctx, ver.rt, code)
	rep.CompileTime = time.Since(start)
	if err != nil {
		problem("compile: %v", err)
		return rep
	}
	ver.compiled = compiled
	for _, f := range compiled.ImportedFunctions() {
		mod, name, _ := f.Import()
		if !ver.trusted && mod == wasmmeter.ImportModule {
			continue // ours, added by Instrument (a module importing it itself is rejected there)
		}
		full := mod + "." + name
		rep.Imports = append(rep.Imports, full)
		if !slices.Contains(AllowedImports, full) {
			problem("import %s is not allowed", full)
		}
	}
	for _, m := range compiled.ImportedMemories() {
		mod, name, _ := m.Import()
		problem("memory import %s.%s is not allowed (the module must export its memory)", mod, name)
	}
	slices.Sort(rep.Imports)
	exports := compiled.ExportedFunctions()
	for name := range exports {
		rep.Exports = append(rep.Exports, name)
	}
	slices.Sort(rep.Exports)
	for _, name := range sortedKeys(requiredExports) {
		want := requiredExports[name]
		f, ok := exports[name]
		if !ok {
			problem("missing export %s", name)
			continue
		}
		if !slices.Equal(f.ParamTypes(), want.params) || !slices.Equal(f.ResultTypes(), want.results) {
			problem("export %s has signature %s, want %s", name, sigString(f.ParamTypes(), f.ResultTypes()),
				sigString(want.params, want.results))
		}
	}
	if _, ok := compiled.ExportedMemories()[sdk.ExportMemory]; !ok {
		problem("missing memory export %q", sdk.ExportMemory)
	}
	if len(rep.Problems) > 0 {
		return rep
	}
	inst, err := h.newInstance(ctx, ver, nil)
	if err != nil {
		problem("instantiate with an empty config: %v", err)
		return rep
	}
	defer func() {
		if inst != nil {
			inst.close()
		}
	}()
	rep.BufferCap = inst.bufCap
	mctx, cancel := context.WithTimeout(ctx, h.opts.InitTimeout)
	minor, err := inst.mod.ExportedFunction(sdk.ExportMinor).Call(mctx)
	cancel()
	if err != nil {
		problem("%s: %v", sdk.ExportMinor, err)
		return rep
	}
	rep.ABIMinor = api.DecodeI32(minor[0])
	if rep.ABIMinor < 0 || rep.ABIMinor > sdk.ABIMinor {
		problem("guest ABI v%d.%d is newer than the host's v%d.%d", sdk.ABIMajor, rep.ABIMinor, sdk.ABIMajor, sdk.ABIMinor)
		return rep
	}
	// One warm-up call (a Go guest's first call is slower) under 10 × ValidationTimeout, then the
	// sample snapshots, each under ValidationTimeout. A miss discards the instance.
	warm := SampleSnapshots()[2].Snapshot
	switch _, reason, _ := h.sampleCall(ctx, ver, inst, &warm, 10*h.opts.ValidationTimeout); reason {
	case ReasonTimeout:
		problem("warm-up call: no answer within %s", 10*h.opts.ValidationTimeout)
		return rep
	case ReasonTrap: // the instance is broken; the warm-up snapshot is also a sample, so this is final
		problem("warm-up call: trap: %s", trapText(inst))
		return rep
	}
	for _, smp := range SampleSnapshots() {
		res := SampleResult{Name: smp.Name, Endpoints: len(smp.Snapshot.Endpoints)}
		s := smp.Snapshot
		s.Endpoints = slices.Clone(s.Endpoints)
		t0 := time.Now()
		out, reason, code := h.sampleCall(ctx, ver, inst, &s, h.opts.ValidationTimeout)
		res.Duration = time.Since(t0)
		switch reason {
		case ReasonNone:
			res.Ranking = out
			if want := healthyCount(&s); want > 0 && len(out) == 0 {
				res.Problem = "empty ranking with healthy endpoints"
			}
		case ReasonGuestError:
			res.Problem = fmt.Sprintf("guest error code %d", code)
			if out := strings.TrimSpace(inst.out.String()); out != "" {
				res.Problem += " (output: " + out + ")"
			}
		case ReasonTimeout:
			res.Problem = fmt.Sprintf("no answer within the %s deadline", h.opts.ValidationTimeout)
			inst = nil // closed by sampleCall
		case ReasonTrap:
			res.Problem = "trap: " + trapText(inst)
			inst.close()
			inst, err = h.newInstance(ctx, ver, nil)
			if err != nil {
				problem("re-instantiate after a trap: %v", err)
			}
		default:
			res.Problem = reason.String()
		}
		rep.Samples = append(rep.Samples, res)
		if res.Problem != "" {
			problem("sample %s: %s", smp.Name, res.Problem)
		}
		if inst == nil {
			break
		}
	}
	return rep
}

// sampleCall runs one validation call like a live call: metered under timeout for an uploaded module,
// directly for the trusted built-in. A call stopped at its deadline closes inst.
func (h *Host) sampleCall(ctx context.Context, ver *version, inst *instance, s *Snapshot, timeout time.Duration) ([]int, Reason, int32) {
	for i := range s.Endpoints {
		s.Endpoints[i].Index = uint32(i)
	}
	if !ver.trusted {
		ctx = inst.dl.start(time.Now().Add(timeout))
	}
	out, reason, code, _ := inst.run(ctx, s)
	if reason == ReasonTimeout {
		inst.close()
	}
	return out, reason, code
}

// compileModule is rt.CompileModule with its panics turned into errors: wazero 1.12 panics on some invalid
// modules (a call to a function whose type index is out of range: plugins/internal/wasmmeter's fuzz corpus), and an
// upload must not take the gateway down.
func compileModule(ctx context.Context, rt wazero.Runtime, wasm []byte) (c wazero.CompiledModule, err error) {
	defer func() {
		if r := recover(); r != nil {
			c, err = nil, fmt.Errorf("invalid module (the compiler panicked: %v)", r)
		}
	}()
	return rt.CompileModule(ctx, wasm)
}

// trapText is the first line of inst's last error (e.g. "wasm error: unreachable") and the guest's output.
func trapText(inst *instance) string {
	msg := "unknown"
	if inst.lastErr != nil {
		msg, _, _ = strings.Cut(inst.lastErr.Error(), "\n")
	}
	if out := strings.TrimSpace(inst.out.String()); out != "" {
		msg += " (output: " + out + ")"
	}
	return msg
}

func healthyCount(s *Snapshot) int {
	n := 0
	for i := range s.Endpoints {
		if s.Endpoints[i].Healthy() {
			n++
		}
	}
	return n
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func sigString(params, results []api.ValueType) string {
	name := func(ts []api.ValueType) string {
		s := make([]string, len(ts))
		for i, t := range ts {
			s[i] = api.ValueTypeName(t)
		}
		return "(" + strings.Join(s, ",") + ")"
	}
	return name(params) + "->" + name(results)
}
