package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/gateway/internal/admin"
	"github.com/kvgate/kvgate/kvstore"
	"github.com/kvgate/kvgate/kvstore/redistest"
	"github.com/kvgate/kvgate/plugins"
)

// One empty-restart event (#12 follow-up): two gateways on one real redis-server hold an uploaded and
// activated module, a run-time endpoint and a leased TPU slice; Redis restarts empty. The guard's epoch
// change is the one event: the fleet state comes back under the store's new epoch as its marker (one
// epoch for both markers), re-seeded by exactly one gateway, the TPU slice quarantined exactly once, and
// everything is seen through the other gateway.
func TestEmptyRestartOneEvent(t *testing.T) {
	t.Parallel() // waits on its own redis-server and gateways only; asserts no latency bound
	if testing.Short() {
		t.Skip("starts and restarts redis-server")
	}
	rs := redistest.Start(t)
	engines := startSims(t, 2, nil)
	yaml := gwYAML(simEndpointsYAML(engines[:1], 64), fmt.Sprintf("store: {kind: redis, addrs: [%q]}\n", rs.Addr))
	var logs logBuffer
	f := &fleetTest{t: t, rs: rs, yaml: yaml}
	f.gws = []*Gateway{startGatewayTo(t, yaml, &logs, slog.LevelInfo), startGatewayTo(t, yaml, &logs, slog.LevelInfo)}
	a, b := f.gws[0], f.gws[1]
	v := f.upload(a, "keep", plugins.BuiltinWasm)
	f.activate(a, v, `{"imbalance_threshold":7}`)
	e1 := fmt.Sprintf(`{"model":"qwen3","id":"e1","engine":"enginesim","url":"http://%s","kv_events":%q}`, engines[1].HTTPAddr(), engines[1].EventsAddr())
	if code := adminCall(t, a, "POST", "/admin/v1/endpoints", e1, nil); code != 201 {
		t.Fatalf("add e1: %d", code)
	}
	const base = "/admin/v1/tpu/pools/fleet"
	if st, m := tpuAdmin(t, a, "POST", base+"/slices", `{"id":"s1","generation":"v6e","topology":"2x2","hosts":[{"name":"h0","worker_id":0}]}`, "admintok"); st != 201 {
		t.Fatalf("register: %d %v", st, m)
	}
	if st, l := tpuAdmin(t, a, "POST", base+"/leases", `{"whole":true,"slice":"s1","holder":"job-a","ttl":"3s"}`, "admintok"); st != 201 {
		t.Fatalf("reserve through a: %d %v", st, l)
	}
	f.serves(v, `{"imbalance_threshold":7}`)
	tpuCopied(t, "fleet", "s1", f.gws...) // both gateways have copied everything
	reconciled(t, 1, f.gws...)
	rs.Restart()
	rc := rs.Client(t)
	ctx := context.Background()
	quarantined := func() bool {
		st, p := tpuAdmin(t, b, "GET", base, "", "admintok")
		if st != 200 {
			return false
		}
		ss, _ := p["slices"].([]any)
		if len(ss) != 1 {
			return false
		}
		ls, _ := ss[0].(map[string]any)["leases"].([]any)
		return len(ls) == 1 && ls[0].(map[string]any)["holder"] == tpuQuarantineHolder
	}
	endpoints := func() string { // "" while b cannot list them (the store is coming back)
		var l admin.EndpointList
		if adminCall(t, b, "GET", "/admin/v1/endpoints", "", &l) != 200 {
			return ""
		}
		return states(l)
	}
	if !waitFor(10*time.Second, func() bool {
		return rc.Exists(ctx, "kvg:v1:{blobs}:d:"+string(v)).Val() == 1 &&
			strings.Contains(endpoints(), "e1:active") && quarantined()
	}) {
		t.Fatalf("not everything came back: module %d, endpoints %q, TPU quarantined %v",
			rc.Exists(ctx, "kvg:v1:{blobs}:d:"+string(v)).Val(), endpoints(), quarantined())
	}
	f.serves(v, `{"imbalance_threshold":7}`)
	reconciled(t, 3, f.gws...) // room for a second re-seed or quarantine, which must not come
	res := rc.Get(ctx, "kvg:"+kvstore.LayoutVersion+":{res}:epoch").Val()
	fleet := rc.Get(ctx, "kvg:"+kvstore.LayoutVersion+":{blobs}:epoch").Val()
	if res == "" || fleet != res {
		t.Errorf("after the restart the reservation epoch is %q and the fleet-state marker %q: want one epoch", res, fleet)
	}
	reseeds := logs.lines(map[string]any{"msg": "the store had lost its fleet state (restarted empty?): re-seeded it from this gateway's copy"})
	quarantines := logs.lines(map[string]any{"msg": "TPU slice registered again after the store restarted empty; every chip quarantined until the lost leases have expired"})
	if len(reseeds) != 1 || len(quarantines) != 1 {
		t.Errorf("re-seeded %d times, quarantined %d times: want once each", len(reseeds), len(quarantines))
	}
}
