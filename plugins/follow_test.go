package plugins

import (
	"errors"
	"testing"
)

// TestFollow: the host runs what the store names and keeps the entry below it warm: a change to the warm
// entry swaps the same pool in (no rebuild), the one that served becomes the warm one when the store says
// so, a version held neither active nor warm can be unloaded, and a failed Follow leaves the model as it was.
func TestFollow(t *testing.T) {
	h := newTestHost(t, Options{Logger: quietLogger()})
	good, _, err := h.Load("good", readWasm(t, "good"))
	if err != nil {
		t.Fatal(err)
	}
	bi := h.BuiltinVersion()
	state := func() (*activation, *activation) {
		h.mu.Lock()
		defer h.mu.Unlock()
		st := (*h.models.Load())["m"]
		return st.active.Load(), st.prev
	}
	cfgX := []byte(`{"imbalance_threshold":3}`)
	if err := h.Follow("m", Entry{Version: good, Config: []byte(`{}`)}, nil); err != nil {
		t.Fatal(err)
	}
	goodAct, warm := state()
	if goodAct.ver.v != good || warm != nil {
		t.Fatalf("after the first follow: %v %v", goodAct.ver.v, warm)
	}
	// The store pushed the built-in with a config: good (what served) is kept warm, the same pool.
	if err := h.Follow("m", Entry{Version: bi, Config: cfgX}, &Entry{Version: good, Config: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	biAct, warm := state()
	if biAct.ver.v != bi || string(biAct.config) != string(cfgX) || warm != goodAct {
		t.Fatalf("after a push: active %s %s, warm reused %v", biAct.ver.v, biAct.config, warm == goodAct)
	}
	if err := h.Unload(good); !errors.Is(err, ErrVersionInUse) {
		t.Fatalf("unload of the warm version: %v", err)
	}
	// A rollback in the store: the warm pool is swapped in, and nothing is warm below the floor.
	swaps := h.swaps.Load()
	if err := h.Follow("m", Entry{Version: good, Config: []byte(`{}`)}, nil); err != nil {
		t.Fatal(err)
	}
	act, warm := state()
	if act != goodAct || warm != nil || h.swaps.Load() != swaps+1 {
		t.Fatalf("after a rollback: reused %v, warm %v, swaps +%d", act == goodAct, warm, h.swaps.Load()-swaps)
	}
	select {
	case <-biAct.retired:
	default:
		t.Fatal("the activation rolled back from was not retired")
	}
	// Following the same state again changes nothing.
	if err := h.Follow("m", Entry{Version: good, Config: []byte(`{}`)}, nil); err != nil || h.swaps.Load() != swaps+1 {
		t.Fatalf("follow of the same entry: %v, swaps +%d", err, h.swaps.Load()-swaps)
	}
	// A warm entry not running yet is built.
	if err := h.Follow("m", Entry{Version: good, Config: []byte(`{}`)}, &Entry{Version: bi, Config: cfgX}); err != nil {
		t.Fatal(err)
	}
	if _, warm := state(); warm == nil || warm.ver.v != bi || string(warm.config) != string(cfgX) {
		t.Fatalf("warm entry not built: %v", warm)
	}
	// Failures leave the model as it was.
	if err := h.Follow("m", Entry{Version: "nope@00", Config: []byte(`{}`)}, nil); !errors.Is(err, ErrUnknownVersion) {
		t.Fatalf("unknown version: %v", err)
	}
	if err := h.Follow("m", Entry{Version: bi, Config: []byte(`{"bogus":1}`)}, nil); !errors.Is(err, ErrInitFailed) {
		t.Fatalf("bad config: %v", err)
	}
	if act, warm := state(); act != goodAct || warm == nil || warm.ver.v != bi {
		t.Fatal("a failed follow changed the model")
	}
	// The store moved on from good entirely: it can be unloaded.
	if err := h.Follow("m", Entry{Version: bi, Config: []byte(`{}`)}, &Entry{Version: bi, Config: cfgX}); err != nil {
		t.Fatal(err)
	}
	if err := h.Unload(good); err != nil {
		t.Fatalf("unload once neither active nor warm: %v", err)
	}
	if err := h.Follow("", Entry{Version: bi}, nil); !errors.Is(err, ErrBadName) {
		t.Fatalf("empty model: %v", err)
	}
}
