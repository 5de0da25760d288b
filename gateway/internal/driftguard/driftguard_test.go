package driftguard

import (
	"context"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/cmd/enginesim/sim"
	"github.com/kvgate/kvgate/gateway/internal/model"
	"github.com/kvgate/kvgate/kvstore/testenv"
)

const qwenDir = "../../../examples/models/qwen3"

func setup(t *testing.T, every int) (*Guard, *sim.Engine, *atomic.Bool, *model.Model) {
	t.Helper()
	m, err := model.Load(qwenDir)
	if err != nil {
		t.Fatal(err)
	}
	c := sim.DefaultConfig()
	c.Model, c.ServedModelNames, c.Host, c.TimeScale = qwenDir, []string{"qwen3"}, "127.0.0.1", 0
	e, err := sim.Start(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	var healthy atomic.Bool
	healthy.Store(true)
	g := New(Options{Endpoints: []Endpoint{{ID: "e0", Model: "qwen3", Engine: "vllm", URL: "http://" + e.HTTPAddr()}},
		Encoders: map[string]Encoder{"qwen3": m}, Healthy: func(string) bool { return healthy.Load() }, Every: every,
		ResumeMatches: 2, RecheckInterval: 50 * time.Millisecond, Registry: prometheus.NewRegistry()})
	return g, e, &healthy, m
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, what, cond)
}

// One in Every requests sent with token IDs is checked; a sampled mismatch stops token IDs at once and
// they resume only after ResumeMatches matching probe rounds; an endpoint that goes unhealthy is
// unverified until its next probe round.
func TestSamplingMismatchAndHealth(t *testing.T) {
	g, e, healthy, m := setup(t, 3)
	if g.Allow("e0") {
		t.Fatal("verified before any check")
	}
	g.CheckAll(context.Background())
	if st := g.Status()["e0"]; !g.Allow("e0") || st.Checks != 1 || !st.Verified {
		t.Fatalf("after the probe round: %+v", st)
	}
	body := []byte(`{"model":"qwen3","messages":[{"role":"user","content":"sampled"}]}`)
	_, ids, _ := m.EncodeChat(body)
	g.Sent("e0", body, ids)
	g.Sent("e0", body, ids)
	// Sent starts its check before it returns or not at all; the count after the third's check (below)
	// says whether these two started one.
	f := e.Faults()
	f.TemplateDrift = true
	e.SetFaults(f)
	g.Sent("e0", body, ids) // the third: checked, mismatches
	waitUntil(t, "the sampled mismatch", func() bool { return !g.Allow("e0") })
	st := g.Status()["e0"]
	if st.Checks != 2 {
		t.Fatalf("%d checks after the probe round and 3 requests sent, want 2 (one of every 3 sampled)", st.Checks)
	}
	if st.LastMismatch == nil || st.LastMismatch.Check != "sample" || st.Mismatches != 1 || st.Needed != 2 ||
		st.LastMismatch.Position != 2 || st.LastMismatch.GatewayLen != len(ids) {
		t.Fatalf("status %+v %+v", st, st.LastMismatch)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	f.TemplateDrift = false
	e.SetFaults(f)
	waitUntil(t, "recovery", func() bool { return g.Allow("e0") })
	if st := g.Status()["e0"]; st.Streak < 2 {
		t.Fatalf("verified after %d matches, want 2", st.Streak)
	}
	healthy.Store(false)
	waitUntil(t, "unverified while unhealthy", func() bool { return !g.Allow("e0") })
	healthy.Store(true)
	waitUntil(t, "verified when healthy again", func() bool { return g.Allow("e0") })
}

func TestDiff(t *testing.T) {
	gw := []uint32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}
	en := append(append([]uint32{}, gw[:12]...), 99, 13)
	d := diff(gw, en)
	if d.Position != 12 || !reflect.DeepEqual(d.GatewayTokens, gw[4:20]) || !reflect.DeepEqual(d.EngineTokens, en[4:14]) ||
		d.GatewayLen != 20 || d.EngineLen != 14 {
		t.Fatalf("%+v", d)
	}
	if d := diff([]uint32{1, 2}, []uint32{1, 2, 3}); d.Position != 2 || !reflect.DeepEqual(d.EngineTokens, []uint32{1, 2, 3}) {
		t.Fatalf("prefix: %+v", d)
	}
}
