package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore"
)

func entry(v, cfg string) kvstore.PolicyEntry {
	return kvstore.PolicyEntry{Version: v, Config: []byte(cfg)}
}

func stackString(s []kvstore.PolicyEntry) string {
	out := ""
	for i, e := range s {
		if i > 0 {
			out += " | "
		}
		out += e.Version + " " + string(e.Config)
	}
	return out
}

// RunPolicies runs the Policies conformance suite (activation stacks, unload, re-seeding, serving reports)
// against stores made by newStore.
func RunPolicies(t *testing.T, newStore StoreFactory) {
	ctx := context.Background()
	put := func(t *testing.T, s *kvstore.Store, name string) {
		t.Helper()
		data := []byte("module " + name)
		if err := s.Blobs.PutBlob(ctx, name, digest(data), data); err != nil {
			t.Fatal(err)
		}
	}
	want := func(t *testing.T, what string, got []kvstore.PolicyEntry, err error, w string) {
		t.Helper()
		if err != nil || stackString(got) != w {
			t.Fatalf("%s: %q %v, want %q", what, stackString(got), err, w)
		}
	}
	t.Run("Stack", func(t *testing.T) {
		s := newStore(t)
		p := s.Policies
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ch := s.Blobs.Subscribe(sctx)
		if _, err := p.Activate(ctx, "m", entry("a@1", "{}"), kvstore.ActivateOptions{}); !errors.Is(err, kvstore.ErrNoStack) ||
			!errors.Is(err, kvstore.ErrNotFound) {
			t.Fatalf("activate without a stack: %v", err)
		}
		if _, err := p.Rollback(ctx, "m", ""); !errors.Is(err, kvstore.ErrNoStack) {
			t.Fatalf("rollback without a stack: %v", err)
		}
		if _, err := p.SeedStack(ctx, "m", entry("up@1", "{}"), true); !errors.Is(err, kvstore.ErrNotFound) {
			t.Fatalf("seed naming a blob not stored: %v", err)
		}
		if _, err := p.SeedStack(ctx, "m", entry("bad version", "{}"), false); !errors.Is(err, kvstore.ErrInvalidArgument) {
			t.Fatalf("seed with a space in the version: %v", err)
		}
		st, err := p.SeedStack(ctx, "m", entry("builtin@0", `{"x":1}`), false)
		want(t, "seed", st, err, `builtin@0 {"x":1}`)
		st, err = p.SeedStack(ctx, "m", entry("other@0", `{}`), false) // exists: unchanged
		want(t, "seed again", st, err, `builtin@0 {"x":1}`)
		if _, err := p.Rollback(ctx, "m", ""); !errors.Is(err, kvstore.ErrNoPrevious) {
			t.Fatalf("rollback at the floor: %v", err)
		}
		// SetFloor replaces the bottom entry (the configuration changed); on a one-entry stack that is the
		// active entry, so the layout-1 value follows.
		st, err = p.SetFloor(ctx, "m", entry("builtin@0", `{"x":2}`), false)
		want(t, "set floor", st, err, `builtin@0 {"x":2}`)
		if v, _ := s.Blobs.GetActive(ctx, "m"); string(v) != `{"version":"builtin@0","config":{"x":2}}` {
			t.Fatalf("legacy value after set floor: %s", v)
		}
		if _, err := p.SetFloor(ctx, "m", entry("up@1", "{}"), true); !errors.Is(err, kvstore.ErrNotFound) {
			t.Fatalf("set floor naming a blob not stored: %v", err)
		}
		st, err = p.SetFloor(ctx, "m", entry("builtin@0", `{"x":1}`), false)
		want(t, "set floor back", st, err, `builtin@0 {"x":1}`)
		st, err = p.SetFloor(ctx, "fresh", entry("builtin@0", `{}`), false)
		want(t, "set floor creates", st, err, `builtin@0 {}`)
		if _, err := p.Activate(ctx, "m", entry("p1@1", "{}"), kvstore.ActivateOptions{NeedBlob: true}); !errors.Is(err, kvstore.ErrNotFound) {
			t.Fatalf("activate a version not stored: %v", err)
		}
		put(t, s, "p1@1")
		put(t, s, "p2@2")
		st, err = p.Activate(ctx, "m", entry("p1@1", "{}"), kvstore.ActivateOptions{NeedBlob: true})
		want(t, "activate p1", st, err, `builtin@0 {"x":1} | p1@1 {}`)
		st, err = p.Activate(ctx, "m", entry("p2@2", `{"k":2}`), kvstore.ActivateOptions{NeedBlob: true})
		want(t, "activate p2", st, err, `builtin@0 {"x":1} | p1@1 {} | p2@2 {"k":2}`)
		// The layout-1 active value follows the top.
		if v, err := s.Blobs.GetActive(ctx, "m"); err != nil || string(v) != `{"version":"p2@2","config":{"k":2}}` {
			t.Fatalf("legacy active value: %s %v", v, err)
		}
		if _, err := p.Rollback(ctx, "m", "p1@1"); !errors.Is(err, kvstore.ErrStale) {
			t.Fatalf("conditional rollback with another top: %v", err)
		}
		st, err = p.Rollback(ctx, "m", "p2@2")
		want(t, "rollback", st, err, `builtin@0 {"x":1} | p1@1 {}`)
		if v, _ := s.Blobs.GetActive(ctx, "m"); string(v) != `{"version":"p1@1","config":{}}` {
			t.Fatalf("legacy active value after rollback: %s", v)
		}
		// Concurrent rollbacks from depth 3: both succeed, the stack is back two entries; from depth 2: one
		// succeeds, the other is refused.
		for depth, okWant := range map[int]int{3: 2, 2: 1} {
			st, _ := p.ReadFleet(ctx)
			for len(st.Stacks["m"]) < depth {
				if _, err := p.Activate(ctx, "m", entry("p2@2", "{}"), kvstore.ActivateOptions{}); err != nil {
					t.Fatal(err)
				}
				st, _ = p.ReadFleet(ctx)
			}
			var wg sync.WaitGroup
			var mu sync.Mutex
			ok, refused := 0, 0
			for range 2 {
				wg.Go(func() {
					_, err := p.Rollback(ctx, "m", "")
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						ok++
					case errors.Is(err, kvstore.ErrNoPrevious):
						refused++
					default:
						t.Error(err)
					}
				})
			}
			wg.Wait()
			f, _ := p.ReadFleet(ctx)
			if ok != okWant || ok+refused != 2 || stackString(f.Stacks["m"]) != `builtin@0 {"x":1}` {
				t.Fatalf("two rollbacks from depth %d: %d ok, %d refused, stack %q", depth, ok, refused, stackString(f.Stacks["m"]))
			}
		}
		// Depth bound: the floor stays, the oldest entry above it goes.
		for i := range kvstore.MaxStackDepth + 2 {
			if _, err := p.Activate(ctx, "m", entry("p1@1", fmt.Sprintf(`{"i":%d}`, i)), kvstore.ActivateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		f, err := p.ReadFleet(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s := f.Stacks["m"]; len(s) != kvstore.MaxStackDepth || stackString(s[:2]) != `builtin@0 {"x":1} | p1@1 {"i":3}` ||
			string(s[len(s)-1].Config) != fmt.Sprintf(`{"i":%d}`, kvstore.MaxStackDepth+1) {
			t.Fatalf("bounded stack: %d entries, %q...", len(s), stackString(s[:2]))
		}
		got := map[string]bool{}
		deadline := time.After(5 * time.Second)
		for !got["stack:m"] {
			select {
			case n := <-ch:
				got[n] = true
			case <-deadline:
				t.Fatalf("no stack:m notification; got %v", got)
			}
		}
	})
	t.Run("Unload", func(t *testing.T) {
		s := newStore(t)
		p := s.Policies
		for _, v := range []string{"a@1", "b@2", "c@3", "d@4", "f@5"} {
			put(t, s, v)
		}
		if err := p.Unload(ctx, "missing@0"); !errors.Is(err, kvstore.ErrNotFound) {
			t.Fatalf("unload of a version not stored: %v", err)
		}
		if _, err := p.SeedStack(ctx, "m", entry("f@5", "{}"), true); err != nil {
			t.Fatal(err)
		}
		for _, v := range []string{"a@1", "b@2", "a@1", "c@3", "d@4"} {
			if _, err := p.Activate(ctx, "m", entry(v, "{}"), kvstore.ActivateOptions{NeedBlob: true}); err != nil {
				t.Fatal(err)
			}
		}
		for v, role := range map[string]string{"d@4": "active", "c@3": "previous", "f@5": "floor"} {
			var iu *kvstore.PolicyInUseError
			if err := p.Unload(ctx, v); !errors.As(err, &iu) || !errors.Is(err, kvstore.ErrPolicyInUse) || iu.Role != role || iu.Model != "m" {
				t.Fatalf("unload %s: %v, want in use as %s of m", v, err, role)
			}
		}
		// a@1 is only history: every entry naming it goes, with its blob; a rollback can never return to it.
		if err := p.Unload(ctx, "a@1"); err != nil {
			t.Fatal(err)
		}
		f, err := p.ReadFleet(ctx)
		if err != nil || stackString(f.Stacks["m"]) != "f@5 {} | b@2 {} | c@3 {} | d@4 {}" {
			t.Fatalf("stack after unloading a@1: %q %v", stackString(f.Stacks["m"]), err)
		}
		if _, _, err := s.Blobs.GetBlob(ctx, "a@1"); !errors.Is(err, kvstore.ErrNotFound) {
			t.Fatalf("blob of an unloaded version: %v", err)
		}
		if _, err := p.Activate(ctx, "m", entry("a@1", "{}"), kvstore.ActivateOptions{NeedBlob: true}); !errors.Is(err, kvstore.ErrNotFound) {
			t.Fatalf("activate an unloaded version: %v", err)
		}
		// SetFloor under a deeper stack changes only the bottom entry.
		st, err := p.SetFloor(ctx, "m", entry("b@2", "{}"), true)
		want(t, "set floor under a stack", st, err, "b@2 {} | b@2 {} | c@3 {} | d@4 {}")
		if v, _ := s.Blobs.GetActive(ctx, "m"); string(v) != `{"version":"d@4","config":{}}` {
			t.Fatalf("legacy value after set floor under a stack: %s", v)
		}
		if _, err := p.SetFloor(ctx, "m", entry("f@5", "{}"), true); err != nil {
			t.Fatal(err)
		}
		// A layout-1 active value (an older gateway's) naming a version also keeps it.
		if err := s.Blobs.SetActive(ctx, "old-model", []byte(`{"version":"b@2","config":{}}`)); err != nil {
			t.Fatal(err)
		}
		var iu *kvstore.PolicyInUseError
		if err := p.Unload(ctx, "b@2"); !errors.As(err, &iu) || iu.Role != "legacy-active" || iu.Model != "old-model" {
			t.Fatalf("unload of a version a legacy active value names: %v", err)
		}
		// A stack seeded where an older gateway left a layout-1 value keeps that value (for adoption).
		if _, err := p.SeedStack(ctx, "old-model", entry("f@5", "{}"), true); err != nil {
			t.Fatal(err)
		}
		if v, err := s.Blobs.GetActive(ctx, "old-model"); err != nil || string(v) != `{"version":"b@2","config":{}}` {
			t.Fatalf("legacy value after seeding: %s %v", v, err)
		}
		// Adoption of that older gateway's activation: once, and only while its value is unchanged.
		legacy := []byte(`{"version":"b@2","config":{}}`)
		if err := s.Blobs.SetActive(ctx, "m", legacy); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			st, err := p.Activate(ctx, "m", entry("b@2", "{}"), kvstore.ActivateOptions{NeedBlob: true, IfLegacy: legacy})
			want(t, "adopt", st, err, "f@5 {} | b@2 {} | c@3 {} | d@4 {} | b@2 {}")
		}
		if _, err := p.Activate(ctx, "m", entry("c@3", "{}"), kvstore.ActivateOptions{IfLegacy: []byte(`{"version":"x@0"}`)}); !errors.Is(err, kvstore.ErrStale) {
			t.Fatalf("adopt with a changed legacy value: %v", err)
		}
	})
	t.Run("ReseedAndServing", func(t *testing.T) {
		s := newStore(t)
		p := s.Policies
		f, err := p.ReadFleet(ctx)
		if err != nil || f.Epoch != "" || len(f.Stacks) != 0 || len(f.Blobs) != 0 || f.Stacks == nil {
			t.Fatalf("fresh store: %+v %v", f, err)
		}
		put(t, s, "kept@1")
		data := []byte("module re@2")
		st := kvstore.FleetState{
			Blobs: []kvstore.FleetBlob{{Name: "re@2", SHA256: digest(data), Data: data},
				{Name: "kept@1", SHA256: digest([]byte("x")), Data: []byte("x")}},
			Stacks: map[string][]kvstore.PolicyEntry{"m": {entry("builtin@0", "{}"), entry("re@2", `{"a":1}`)}},
		}
		if _, _, err := p.Reseed(ctx, "e1", kvstore.FleetState{Blobs: []kvstore.FleetBlob{{Name: "bad", SHA256: digest(nil), Data: data}}}); !errors.Is(err, kvstore.ErrDigestMismatch) {
			t.Fatalf("reseed with a wrong digest: %v", err)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var won []string
		markers := map[string]bool{}
		for _, ep := range []string{"e1", "e2", "e3"} {
			wg.Go(func() {
				m, w, err := p.Reseed(ctx, ep, st)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Error(err)
				}
				markers[m] = true
				if w {
					won = append(won, ep)
				}
			})
		}
		wg.Wait()
		if len(won) != 1 || len(markers) != 1 || !markers[won[0]] {
			t.Fatalf("three re-seeders: won %v, markers %v", won, markers)
		}
		f, err = p.ReadFleet(ctx)
		if err != nil || f.Epoch != won[0] || stackString(f.Stacks["m"]) != `builtin@0 {} | re@2 {"a":1}` ||
			len(f.Blobs) != 2 || f.Blobs[0] != (kvstore.BlobInfo{Name: "kept@1", SHA256: digest([]byte("module kept@1")), Size: 13}) ||
			f.Blobs[1] != (kvstore.BlobInfo{Name: "re@2", SHA256: digest(data), Size: len(data)}) ||
			string(f.Legacy["m"]) != `{"version":"re@2","config":{"a":1}}` {
			t.Fatalf("after reseed: %+v %v", f, err)
		}
		if _, got, err := s.Blobs.GetBlob(ctx, "re@2"); err != nil || string(got) != string(data) {
			t.Fatalf("re-seeded blob: %q %v", got, err)
		}
		if st, err := p.Rollback(ctx, "m", ""); err != nil || stackString(st) != "builtin@0 {}" {
			t.Fatalf("rollback on the re-seeded stack: %q %v", stackString(st), err)
		}

		if err := p.ReportServing(ctx, "gw-a", []byte(`{"a":1}`), 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if err := p.ReportServing(ctx, "gw-b", []byte(`{"b":2}`), time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := p.ReportServing(ctx, "", nil, time.Second); !errors.Is(err, kvstore.ErrInvalidArgument) {
			t.Fatalf("empty gateway: %v", err)
		}
		all, err := p.ListServing(ctx)
		if err != nil || len(all) != 2 || string(all["gw-a"]) != `{"a":1}` || string(all["gw-b"]) != `{"b":2}` {
			t.Fatalf("serving: %q %v", all, err)
		}
		time.Sleep(450 * time.Millisecond)
		all, err = p.ListServing(ctx)
		keys := make([]string, 0, len(all))
		for k := range all {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if err != nil || !slices.Equal(keys, []string{"gw-b"}) {
			t.Fatalf("serving after gw-a's report expired: %v %v", keys, err)
		}
	})
}
