package plugins

import (
	"context"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"

	"github.com/kvgate/kvgate/plugins/internal/wasmmeter"
)

// Uploaded modules are metered (plugins/internal/wasmmeter): every function entry and loop header spends fuel, and
// when it runs out the guest calls refill. refill is Go code, so it is where the call's deadline is
// enforced and where the Go scheduler and garbage collector can stop the goroutine. Nothing a guest can
// run (loop, loop-free call tree, start function) goes more than one fuel interval without reaching it.

// callDeadline is the context of one metered call: no values, never cancelled, only a deadline, plus
// what refill counts during the call. Each instance owns one, so a call allocates nothing for it.
type callDeadline struct {
	context.Context // context.Background()
	at              time.Time
	refills         int  // refills during this call
	expired         bool // refill stopped the call at its deadline
}

// Deadline implements context.Context.
func (d *callDeadline) Deadline() (time.Time, bool) { return d.at, true }

func (d *callDeadline) start(at time.Time) *callDeadline {
	d.Context, d.at, d.refills, d.expired = context.Background(), at, 0, false
	return d
}

// instantiateMeter adds the refill import to rt.
func (h *Host) instantiateMeter(ctx context.Context, rt wazero.Runtime) error {
	_, err := rt.NewHostModuleBuilder(wasmmeter.ImportModule).NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(h.refill), nil, []api.ValueType{api.ValueTypeI32}).
		WithName(wasmmeter.ImportName).Export(wasmmeter.ImportName).
		Instantiate(ctx)
	return err
}

// refill is the guest's import kvgate_meter.refill () -> i32: it aborts the call once its deadline has
// passed (marking the callDeadline expired, which invoke maps to ReasonTimeout) and otherwise returns the
// next fuel interval.
func (h *Host) refill(ctx context.Context, _ api.Module, stack []uint64) {
	h.refills.Add(1)
	d, ok := ctx.(*callDeadline)
	var at time.Time
	if ok {
		d.refills++
		at = d.at
	} else if at, ok = ctx.Deadline(); !ok {
		// Every metered call is given a callDeadline; anything else is a host bug: stop the guest.
		panic(sys.NewExitError(sys.ExitCodeDeadlineExceeded))
	}
	if over := time.Since(at); over >= 0 {
		if d != nil {
			d.expired = true
		}
		h.interrupted.Add(1)
		h.overrunNano.Add(int64(over))
		panic(sys.NewExitError(sys.ExitCodeDeadlineExceeded))
	}
	stack[0] = api.EncodeI32(h.opts.FuelInterval)
}
