package plugins

import (
	"os"
	"slices"
	"testing"
)

// TestCallGraphGoModulesPass: every Go module (the built-in here) enters a loop before any branch or
// call in all functions that call each other, so the static check accepts it; the AssemblyScript port
// too.
func TestCallGraphGoModulesPass(t *testing.T) {
	as, err := os.ReadFile("../examples/policies/three-tier-as/three-tier-as.wasm")
	if err != nil {
		t.Fatal(err)
	}
	for name, wasm := range map[string][]byte{"built-in": BuiltinWasm, "three-tier-as": as} {
		if p := checkCallGraph(wasm); len(p) != 0 {
			t.Errorf("%s: %v", name, p)
		}
	}
	imported, funcs, err := analyzeFunctions(BuiltinWasm)
	if err != nil || imported != 15 || len(funcs) < 1000 {
		t.Fatalf("imported %d, %d functions, %v", imported, len(funcs), err)
	}
}

// TestCallGraphShapes: hand-checked shapes of the WAT test modules.
func TestCallGraphShapes(t *testing.T) {
	_, funcs, err := analyzeFunctions(readWasm(t, "calltree"))
	if err != nil {
		t.Fatal(err)
	}
	// Functions 0-4 are the trivial exports, then $t0..$t27 (5..32) each call the next twice, $t28 (33)
	// calls nothing, then choose (34) calls $t0; none has a loop.
	if len(funcs) != 35 || funcs[5].checked || !slices.Equal(funcs[5].calls, []uint32{6, 6}) ||
		len(funcs[33].calls) != 0 || !slices.Equal(funcs[34].calls, []uint32{5}) {
		t.Fatalf("%d functions: %+v", len(funcs), funcs)
	}
	_, funcs, err = analyzeFunctions(readWasm(t, "good"))
	if err != nil {
		t.Fatal(err)
	}
	// choose (the 6th function) loads n, then enters block+loop before any branch: checked.
	if !funcs[5].checked || funcs[0].checked {
		t.Fatalf("%+v", funcs)
	}
	// bomb.wasm builds its call trees with call_indirect, which the check does not follow.
	if p := checkCallGraph(readWasm(t, "bomb")); len(p) != 0 {
		t.Fatalf("bomb: %v", p)
	}
}

func TestCallGraphMalformed(t *testing.T) {
	good := readWasm(t, "good")
	for name, b := range map[string][]byte{
		"empty":     nil,
		"magic":     []byte("\x00asx\x01\x00\x00\x00"),
		"truncated": good[:len(good)-3],
		"bad op":    []byte("\x00asm\x01\x00\x00\x00\x0a\x05\x01\x03\x00\xff\x0b"),
		"long body": []byte("\x00asm\x01\x00\x00\x00\x0a\x05\x01\x09\x00\x01\x0b"),
	} {
		if p := checkCallGraph(b); len(p) == 0 {
			t.Errorf("%s: accepted", name)
		}
	}
}

// FuzzAnalyzeFunctions: any bytes decode or fail with an error, never panic or loop.
func FuzzAnalyzeFunctions(f *testing.F) {
	for _, name := range []string{"good", "calltree", "recurse", "badimport", "bomb"} {
		b, err := os.ReadFile("testdata/" + name + ".wasm")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = checkCallGraph(b)
	})
}
