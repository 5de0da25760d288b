package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore"
)

func rec(id, model, state, url string) kvstore.EndpointRecord {
	return kvstore.EndpointRecord{ID: id, Model: model, State: state, Source: "config",
		Spec: []byte(`{"id":"` + id + `","engine":"vllm","url":"` + url + `"}`)}
}

func setString(s kvstore.EndpointSet) string {
	var parts []string
	for _, r := range s.Records {
		parts = append(parts, r.ID+"="+r.Model+"/"+r.State+"/"+string(r.Spec))
	}
	return fmt.Sprintf("rev %d: %s", s.Rev, strings.Join(parts, " | "))
}

// waitNote waits up to 2 s for the notification msg on ch.
func waitNote(t *testing.T, ch <-chan string, msg string) {
	t.Helper()
	deadline := time.After(2 * time.Second)
	for {
		select {
		case m := <-ch:
			if m == msg {
				return
			}
		case <-deadline:
			t.Fatalf("no %q notification", msg)
		}
	}
}

// RunEndpoints runs the Endpoints conformance suite (seeding, conditional writes, concurrent writers,
// notifications, re-seeding with the fleet state) against stores made by newStore.
func RunEndpoints(t *testing.T, newStore StoreFactory) {
	ctx := context.Background()
	t.Run("SeedAndWrite", func(t *testing.T) {
		s := newStore(t)
		e := s.Endpoints
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ch := s.Blobs.Subscribe(sctx)
		set, err := e.ReadEndpoints(ctx)
		if err != nil || set.Rev != 0 || len(set.Records) != 0 {
			t.Fatalf("fresh store: %s %v", setString(set), err)
		}
		if _, err := e.WriteEndpoints(ctx, 0, []kvstore.EndpointRecord{rec("a", "m", kvstore.EndpointActive, "http://a:1")}, nil); !errors.Is(err, kvstore.ErrNotSeeded) {
			t.Fatalf("write before seeding: %v", err)
		}
		if _, _, err := e.SeedEndpoints(ctx, []kvstore.EndpointRecord{rec("a", "", kvstore.EndpointActive, "x")}); !errors.Is(err, kvstore.ErrInvalidArgument) {
			t.Fatalf("seed without a model: %v", err)
		}
		if _, _, err := e.SeedEndpoints(ctx, []kvstore.EndpointRecord{rec("a", "m", "up", "x")}); !errors.Is(err, kvstore.ErrInvalidArgument) {
			t.Fatalf("seed with an unknown state: %v", err)
		}
		bad := rec("a", "m", kvstore.EndpointActive, "x")
		bad.Spec = []byte(`{"id":`)
		if _, _, err := e.SeedEndpoints(ctx, []kvstore.EndpointRecord{bad}); !errors.Is(err, kvstore.ErrInvalidArgument) {
			t.Fatalf("seed with a spec that is not JSON: %v", err)
		}
		set, won, err := e.SeedEndpoints(ctx, []kvstore.EndpointRecord{rec("b", "m", kvstore.EndpointActive, "http://b:1"),
			rec("a", "m", kvstore.EndpointActive, "http://a:1")})
		if err != nil || !won {
			t.Fatalf("seed: %v %v", won, err)
		}
		if got, want := setString(set), `rev 1: a=m/active/{"id":"a","engine":"vllm","url":"http://a:1"} | b=m/active/{"id":"b","engine":"vllm","url":"http://b:1"}`; got != want {
			t.Fatalf("seeded set:\n%s\nwant\n%s", got, want)
		}
		waitNote(t, ch, "endpoints")
		set, won, err = e.SeedEndpoints(ctx, []kvstore.EndpointRecord{rec("c", "m", kvstore.EndpointActive, "http://c:1")})
		if err != nil || won || set.Rev != 1 || len(set.Records) != 2 {
			t.Fatalf("second seed must keep the first: %s won=%v %v", setString(set), won, err)
		}
		// One write: add c, drain a, delete b (and a name that is not there).
		dr := rec("a", "m", kvstore.EndpointDraining, "http://a:1")
		dr.Remove, dr.DrainSince = true, 1234
		set, err = e.WriteEndpoints(ctx, 1, []kvstore.EndpointRecord{rec("c", "m2", kvstore.EndpointActive, "http://c:1"), dr}, []string{"b", "zz"})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := setString(set), `rev 2: a=m/draining/{"id":"a","engine":"vllm","url":"http://a:1"} | c=m2/active/{"id":"c","engine":"vllm","url":"http://c:1"}`; got != want {
			t.Fatalf("after write:\n%s\nwant\n%s", got, want)
		}
		waitNote(t, ch, "endpoints")
		if r, ok := set.Get("a"); !ok || !r.Remove || r.DrainSince != 1234 || r.Source != "config" {
			t.Fatalf("drained record lost fields: %+v", r)
		}
		// A writer that read revision 1 is refused and writes nothing.
		if _, err := e.WriteEndpoints(ctx, 1, []kvstore.EndpointRecord{rec("d", "m", kvstore.EndpointActive, "http://d:1")}, nil); !errors.Is(err, kvstore.ErrStale) {
			t.Fatalf("stale write: %v", err)
		}
		if _, err := e.WriteEndpoints(ctx, 2, []kvstore.EndpointRecord{rec("d", "m", kvstore.EndpointActive, "x")}, []string{"d"}); !errors.Is(err, kvstore.ErrInvalidArgument) {
			t.Fatalf("put and delete of one ID: %v", err)
		}
		set, err = e.ReadEndpoints(ctx)
		if err != nil || set.Rev != 2 || len(set.Records) != 2 {
			t.Fatalf("refused writes changed the set: %s %v", setString(set), err)
		}
		// Deleting everything leaves a seeded, empty set (not an unseeded one).
		set, err = e.WriteEndpoints(ctx, 2, nil, []string{"a", "c"})
		if err != nil || set.Rev != 3 || len(set.Records) != 0 {
			t.Fatalf("empty set: %s %v", setString(set), err)
		}
		if _, won, _ := e.SeedEndpoints(ctx, []kvstore.EndpointRecord{rec("x", "m", kvstore.EndpointActive, "x")}); won {
			t.Fatal("an emptied set was seeded again")
		}
	})
	t.Run("ConcurrentWriters", func(t *testing.T) {
		s := newStore(t)
		e := s.Endpoints
		if _, _, err := e.SeedEndpoints(ctx, nil); err != nil {
			t.Fatal(err)
		}
		// 8 writers each add their own endpoint, re-reading after every refusal: every endpoint lands, the
		// revision counts exactly the 8 successful writes, and refusals happen only because of another's write.
		const n = 8
		var wg sync.WaitGroup
		var mu sync.Mutex
		stale := 0
		for w := range n {
			wg.Go(func() {
				for {
					set, err := e.ReadEndpoints(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					_, err = e.WriteEndpoints(ctx, set.Rev, []kvstore.EndpointRecord{rec(fmt.Sprintf("w%d", w), "m", kvstore.EndpointActive, "x")}, nil)
					if err == nil {
						return
					}
					if !errors.Is(err, kvstore.ErrStale) {
						t.Error(err)
						return
					}
					mu.Lock()
					stale++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		set, err := e.ReadEndpoints(ctx)
		if err != nil || set.Rev != 1+n || len(set.Records) != n {
			t.Fatalf("after %d writers: %s %v (%d refused)", n, setString(set), err, stale)
		}
		// The same revision offered twice: exactly one wins.
		wins := 0
		var wg2 sync.WaitGroup
		for w := range 4 {
			wg2.Go(func() {
				if _, err := e.WriteEndpoints(ctx, set.Rev, nil, []string{fmt.Sprintf("w%d", w)}); err == nil {
					mu.Lock()
					wins++
					mu.Unlock()
				}
			})
		}
		wg2.Wait()
		if wins != 1 {
			t.Fatalf("%d writers won one revision", wins)
		}
	})
	t.Run("Reseed", func(t *testing.T) {
		s := newStore(t)
		// A re-seed without endpoints names the epoch and leaves the set unseeded.
		if _, won, err := s.Policies.Reseed(ctx, "ep1", kvstore.FleetState{}); err != nil || !won {
			t.Fatalf("reseed: %v %v", won, err)
		}
		set, err := s.Endpoints.ReadEndpoints(ctx)
		if err != nil || set.Marker != "ep1" || set.Rev != 0 {
			t.Fatalf("after a re-seed without endpoints: marker %q %s %v", set.Marker, setString(set), err)
		}
		s2 := newStore(t)
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ch := s2.Blobs.Subscribe(sctx)
		copyA := []kvstore.EndpointRecord{rec("a", "m", kvstore.EndpointActive, "http://a:1"), rec("b", "m", kvstore.EndpointDraining, "http://b:1")}
		if _, won, err := s2.Policies.Reseed(ctx, "ep2", kvstore.FleetState{Endpoints: copyA}); err != nil || !won {
			t.Fatalf("reseed with endpoints: %v %v", won, err)
		}
		waitNote(t, ch, "endpoints")
		// The first re-seeder under the marker wins: a second copy is not written.
		if m, won, err := s2.Policies.Reseed(ctx, "ep3", kvstore.FleetState{Endpoints: []kvstore.EndpointRecord{rec("z", "m", kvstore.EndpointActive, "x")}}); err != nil || won || m != "ep2" {
			t.Fatalf("second reseed: %q %v %v", m, won, err)
		}
		set, err = s2.Endpoints.ReadEndpoints(ctx)
		if got, want := setString(set), `rev 1: a=m/active/{"id":"a","engine":"vllm","url":"http://a:1"} | b=m/draining/{"id":"b","engine":"vllm","url":"http://b:1"}`; err != nil || got != want || set.Marker != "ep2" {
			t.Fatalf("re-seeded set (marker %q):\n%s\nwant\n%s (%v)", set.Marker, got, want, err)
		}
		if _, err := s2.Endpoints.WriteEndpoints(ctx, 1, nil, []string{"b"}); err != nil {
			t.Fatal(err)
		}
	})
}
