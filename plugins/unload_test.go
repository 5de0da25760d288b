package plugins

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// TestUnload: a version in use (active, kept warm for rollback, or the built-in) is refused; an unused one
// (here one two activations back: the host keeps only one warm activation) disappears from Versions, cannot
// be activated, and can be loaded again.
func TestUnload(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger()})
	good, _, err := h.Load("good", readWasm(t, "good"))
	if err != nil {
		t.Fatal(err)
	}
	bomb, _, err := h.Load("bomb", readWasm(t, "bomb"))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Unload(h.BuiltinVersion()); !errors.Is(err, ErrVersionInUse) {
		t.Fatalf("built-in: %v", err)
	}
	if err := h.Unload("nope@00"); !errors.Is(err, ErrUnknownVersion) {
		t.Fatalf("unknown: %v", err)
	}
	// m: good (retired), then built-in (previous, warm), then bomb (active).
	for _, v := range []Version{good, h.BuiltinVersion(), bomb} {
		if err := h.Activate("m", v, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Unload(bomb); !errors.Is(err, ErrVersionInUse) {
		t.Fatalf("active: %v", err)
	}
	if err := h.Unload(good); err != nil { // no longer held by m
		t.Fatalf("retired: %v", err)
	}
	if slices.ContainsFunc(h.Versions(), func(v VersionInfo) bool { return v.Version == good }) {
		t.Fatal("unloaded version still listed")
	}
	if err := h.Activate("m", good, nil); !errors.Is(err, ErrUnknownVersion) {
		t.Fatalf("activate unloaded: %v", err)
	}
	// Rollback: bomb → built-in (the warm one); a second rollback would go to the default (the built-in
	// with no activation).
	if err := h.Rollback("m"); err != nil {
		t.Fatal(err)
	}
	if v, _ := h.Active("m"); v != h.BuiltinVersion() {
		t.Fatalf("after rollback: %s", v)
	}
	// The rollback retired bomb's activation and kept none warm: bomb is free to go.
	if err := h.Unload(bomb); err != nil {
		t.Fatalf("after rollback: %v", err)
	}
	// Load again after unload: a new version with the same name, which works.
	again, _, err := h.Load("good", readWasm(t, "good"))
	if err != nil || again != good {
		t.Fatalf("reload: %s %v", again, err)
	}
	if err := h.Activate("m2", again, nil); err != nil {
		t.Fatal(err)
	}
	if got, info := h.Rank(context.Background(), "m2", bombSnapshot(7)); info.Fallback || !slices.Equal(got, []int{0, 1, 2}) {
		t.Fatalf("reloaded version: %v %+v", got, info)
	}
	if st := h.Stats(); st.Unloaded != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// TestUnloadAfterRetire: a version whose activation was retired by a rollback unloads, and the model
// keeps being served.
func TestUnloadAfterRetire(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger()})
	good, _, err := h.Load("good", readWasm(t, "good"))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Activate("m", good, nil); err != nil {
		t.Fatal(err)
	}
	if err := h.Rollback("m"); err != nil { // back to the default; good's activation retires
		t.Fatal(err)
	}
	if err := h.Unload(good); err != nil {
		t.Fatal(err)
	}
	if got, info := h.Rank(context.Background(), "m", bombSnapshot(7)); info.Fallback || info.Version != h.BuiltinVersion() || len(got) != 3 {
		t.Fatalf("%v %+v", got, info)
	}
}
