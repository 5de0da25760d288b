package tpu

import (
	"errors"
	"strings"
	"testing"
)

// ParseShape either fails with ErrInvalidShape or returns a shape that prints back to its input.
func FuzzParseShape(f *testing.F) {
	for _, s := range []string{"4x4", "4x4x4", "2x2x1", "16x16x24", "x", "4x", "0x4", "04x4", "4x4x4x4", "-1x2", "1x1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sh, err := ParseShape(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidShape) {
				t.Fatalf("%q: %v", s, err)
			}
			return
		}
		if sh.String() != strings.TrimSpace(s) || sh.Chips() < 1 || (sh.N != 2 && sh.N != 3) {
			t.Fatalf("%q parsed as %+v (%s)", s, sh, sh)
		}
	})
}
