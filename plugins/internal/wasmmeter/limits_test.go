package wasmmeter_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/plugins/internal/wasmmeter"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// TestTableLimits: testdata/tables.wasm (one table, maximum MaxTableElements, grown) is accepted and
// grows to exactly its maximum; the same module with the maximum one higher, with no maximum, or with a
// minimum one above the limit is ErrLimit at the offset of table.grow or of the table type.
func TestTableLimits(t *testing.T) {
	ctx := context.Background()
	in := readModule(t, "testdata/tables.wasm")
	// The table type is 70 01 01 80 80 40 (funcref, min 1, max 1<<20 as a 3-byte LEB128).
	maxEnc := []byte{0x70, 0x01, 0x01, 0x80, 0x80, 0x40}
	at := bytes.Index(in, maxEnc)
	if at < 0 {
		t.Fatal("table type not found in tables.wasm")
	}
	growAt := bytes.Index(in, []byte{0xfc, 0x0f, 0x00})
	patch := func(enc []byte) []byte {
		out := bytes.Clone(in)
		copy(out[at:], enc)
		return out
	}
	rt := newRuntime(t, &meter{Interval: 10000})
	c, err := rt.CompileModule(ctx, instrument(t, in))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := rt.InstantiateModule(ctx, c, wazero.NewModuleConfig())
	if err != nil {
		t.Fatal(err)
	}
	grow := mod.ExportedFunction("grow")
	for _, tc := range []struct{ delta, want int32 }{{1 << 20, -1}, {1<<20 - 1, 1}, {1, -1}} {
		res, err := grow.Call(ctx, api.EncodeI32(tc.delta))
		if err != nil || api.DecodeI32(res[0]) != tc.want {
			t.Fatalf("table.grow %d = %v %v, want %d", tc.delta, res, err, tc.want)
		}
	}
	cases := []struct {
		name string
		enc  []byte // replaces the 6-byte table type
		off  int
		msg  string
	}{
		{"max one over", []byte{0x70, 0x01, 0x01, 0x81, 0x80, 0x40}, growAt, "maximum (it is grown) of 1048577 elements"},
		{"no max", []byte{0x70, 0x00, 0x81, 0x80, 0x80, 0x00}, growAt, "which declares no maximum"},
		{"min one over", []byte{0x70, 0x01, 0x81, 0x80, 0x40, 0x01}, at, "minimum of 1048577 elements"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := wasmmeter.Instrument(patch(tc.enc))
			var e *wasmmeter.Error
			if !errors.As(err, &e) || !errors.Is(err, wasmmeter.ErrLimit) || !strings.Contains(e.Detail, tc.msg) {
				t.Fatalf("got %v, want ErrLimit %q", err, tc.msg)
			}
			if e.Offset != tc.off {
				t.Errorf("offset %d, want %d", e.Offset, tc.off)
			}
		})
	}
}

// TestStackExits: every exit of testdata/stack.wasm's functions gives its frame's units back (150,000
// calls of each, over MaxStackUnits in total, never trap), a recursion of 100,000 frames returns, and one
// of 200,000 traps at MaxStackUnits instead of growing wazero's stack toward its 50 MB ceiling.
func TestStackExits(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t, &meter{Interval: 10000})
	c, err := rt.CompileModule(ctx, instrument(t, readModule(t, "testdata/stack.wasm")))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := rt.InstantiateModule(ctx, c, wazero.NewModuleConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"rec_end", "rec_return", "rec_br", "rec_brif", "rec_brtable"} {
		f := mod.ExportedFunction(name)
		for i := 0; i < 150_000; i++ {
			n := int32(i % 4)
			res, err := f.Call(ctx, api.EncodeI32(n))
			if err != nil || api.DecodeI32(res[0]) != n {
				t.Fatalf("%s(%d) call %d = %v %v", name, n, i, res, err)
			}
		}
	}
	deep := mod.ExportedFunction("rec_end")
	if res, err := deep.Call(ctx, api.EncodeI32(100_000)); err != nil || api.DecodeI32(res[0]) != 100_000 {
		t.Fatalf("rec_end(100000) = %v %v", res, err)
	}
	if _, err := deep.Call(ctx, api.EncodeI32(200_000)); err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("rec_end(200000): %v, want the unreachable trap of MaxStackUnits", err)
	}
}
