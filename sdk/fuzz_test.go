package sdk

import (
	"testing"
)

// FuzzDecodeSnapshot: any bytes either decode or give ErrMalformed; never a panic; a decoded snapshot
// re-encodes (as v1.0) and decodes to the same value.
func FuzzDecodeSnapshot(f *testing.F) {
	f.Add(golden())
	f.Add([]byte("KVGP"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var s Snapshot
		if err := DecodeSnapshot(b, &s); err != nil {
			return
		}
		buf := make([]byte, EncodedSize(len(s.Endpoints)))
		if _, err := EncodeSnapshot(buf, &s); err != nil {
			t.Fatal(err)
		}
		var s2 Snapshot
		if err := DecodeSnapshot(buf, &s2); err != nil {
			t.Fatal(err)
		}
		if s.Request != s2.Request || len(s.Endpoints) != len(s2.Endpoints) {
			t.Fatalf("round trip changed the snapshot")
		}
	})
}

// FuzzDecodeConfig: any bytes give nil or a *ConfigError, never a panic, and never a value outside the
// field's range.
func FuzzDecodeConfig(f *testing.F) {
	for _, s := range []string{"", "{}", `{"a": 1, "b": 0.5}`, `{"a": 1e999}`, `{"a":`, `{"a": -0}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		a, c := 1.0, 0.0
		err := DecodeConfig(b, Field{Name: "a", Dst: &a, Min: 0, Max: 10}, Field{Name: "b", Dst: &c, Min: -1, Max: 1})
		if err != nil {
			if _, ok := err.(*ConfigError); !ok {
				t.Fatalf("error type %T", err)
			}
		}
		if a < 0 || a > 10 || c < -1 || c > 1 {
			t.Fatalf("out of range: a=%v b=%v", a, c)
		}
	})
}
