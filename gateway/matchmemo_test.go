package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore/redistest"
)

// Match's memo of a block 0 (how far each holder's run went at this gateway's last Match of it,
// kvstore/RATIONALE.md "A miss stops at the first absent block") is per process, while the engines' state
// changes through every gateway of the fleet. So through two gateways on one real redis-server, on both
// index layouts: gateway a matches a prompt (its memo says where the run ends), the run then grows and
// shrinks through requests routed by gateway b and an engine's cache reset, and a's answer must be b's
// (which has no memo of the longer prompt) and the engine's at every step. The reset step is also the
// reproduction of a defect found with it: a routed hit's 5-minute refresh of the matched prefix outlived
// the engine's AllBlocksCleared (kvstore/RATIONALE.md, "Which holds a clear keeps"); before the fix both
// gateways still matched 30 of the 56 blocks 5 s after the reset.
func TestMatchMemoAcrossGateways(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	for _, layout := range []int{1, 2} {
		t.Run(fmt.Sprint("layout", layout), func(t *testing.T) {
			t.Parallel()
			rs := redistest.Start(t)
			engines := startSims(t, 2, nil)
			yaml := gwYAML(simEndpointsYAML(engines, 64), fmt.Sprintf("speculative_ttl: 200ms\nstore: {kind: redis, addrs: [%q], index_layout: %d}\n", rs.Addr, layout))
			a, b := startGateway(t, yaml), startGateway(t, yaml)
			waitSubscribed(t, engines, a, b)

			sys := longSystemPrompt(30)
			chat := func(user string) string {
				return fmt.Sprintf(`{"model":"qwen3","max_tokens":1,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, sys, user)
			}
			short := chat("first question")
			long := chat("first question, and then a much longer follow-up: " + strings.Repeat("please explain every step of the derivation in detail. ", 40))

			// a routes the short prompt; its engine's blocks are ingested (seen through both gateways).
			st, h, _ := post(t, "http://"+a.Addr()+"/v1/chat/completions", short)
			if st != 200 {
				t.Fatal(st)
			}
			ep := h.Get("x-kvgate-endpoint")
			shortHeld, shortTotal := 0, 0
			if !waitFor(5*time.Second, func() bool {
				shortHeld, shortTotal = promptScore(t, b, short, ep)
				return shortHeld == shortTotal
			}) {
				t.Fatalf("short prompt: %d of %d blocks held on %s through b", shortHeld, shortTotal, ep)
			}
			// a's Match of the long prompt now: its run is the short prompt's shared blocks (the memo of
			// block 0 is the short prompt's whole run).
			if got, _ := promptScore(t, a, short, ep); got != shortTotal {
				t.Fatalf("a: short prompt %d blocks, b %d", got, shortTotal)
			}
			before, longTotal := promptScore(t, a, long, ep)
			if before >= longTotal || before == 0 {
				t.Fatalf("a: long prompt %d of %d blocks before it was sent", before, longTotal)
			}

			// b routes the long prompt (same block 0: same endpoint); the run grows past a's memo.
			st, h, _ = post(t, "http://"+b.Addr()+"/v1/chat/completions", long)
			if st != 200 || h.Get("x-kvgate-endpoint") != ep {
				t.Fatalf("long prompt through b: %d on %s, want %s", st, h.Get("x-kvgate-endpoint"), ep)
			}
			if !waitFor(5*time.Second, func() bool { got, _ := promptScore(t, b, long, ep); return got == longTotal }) {
				t.Fatal("long prompt never ingested")
			}
			if got, _ := promptScore(t, a, long, ep); got != longTotal {
				t.Fatalf("a: long prompt %d of %d blocks after b routed it (b sees all)", got, longTotal)
			}
			if got, _ := promptScore(t, a, short, ep); got != shortTotal {
				t.Fatalf("a: short prompt %d of %d blocks", got, shortTotal)
			}

			// The engine drops its cache: a's memo (the whole long run) must not survive it. (The gateways'
			// speculative holds of the long prompt survive a clear until their 200 ms TTL: "Why does ingestion
			// clear only confirmed entries" in kvstore/RATIONALE.md.)
			eng := engines[0]
			if ep == "e1" {
				eng = engines[1]
			}
			resp, err := http.Post("http://"+eng.HTTPAddr()+"/reset_prefix_cache", "application/json", nil)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("reset: %v %v", err, resp)
			}
			resp.Body.Close()
			// Each gateway's copy of b's speculative hold of the long prompt lasts 200 ms from when it learned
			// of it; then both must see nothing, and must keep seeing nothing (no refresh outlives the clear).
			for _, g := range []*Gateway{b, a} {
				if !waitFor(5*time.Second, func() bool { got, _ := promptScore(t, g, long, ep); return got == 0 }) {
					got, _ := promptScore(t, g, long, ep)
					t.Fatalf("%s: long prompt %d of %d blocks 5 s after the engine's reset", g.ID(), got, longTotal)
				}
			}
			time.Sleep(300 * time.Millisecond) // past every speculative TTL
			for _, g := range []*Gateway{a, b} {
				if got, _ := promptScore(t, g, long, ep); got != 0 {
					t.Fatalf("%s: long prompt %d blocks after the reset", g.ID(), got)
				}
			}
			// The short prompt again, straight to the engine (no gateway routes it, so no memo learns it),
			// then a's view of the long prompt: the shared blocks only.
			if st, _, _ := post(t, "http://"+eng.HTTPAddr()+"/v1/chat/completions", short); st != 200 {
				t.Fatal(st)
			}
			if !waitFor(5*time.Second, func() bool { got, _ := promptScore(t, b, short, ep); return got == shortTotal }) {
				t.Fatal("short prompt never ingested again")
			}
			if got, _ := promptScore(t, a, long, ep); got != before {
				t.Fatalf("a: long prompt %d blocks after the short one came back, want %d", got, before)
			}
		})
	}
}
