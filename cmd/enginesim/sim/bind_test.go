package sim

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// listenAddrs returns the local addresses (hex, as /proc/net/tcp{,6} spell them) listening on port.
func listenAddrs(t *testing.T, port int) []string {
	t.Helper()
	var out []string
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 4 || fs[3] != "0A" { // 0A: LISTEN
				continue
			}
			addr, p, _ := strings.Cut(fs[1], ":")
			if v, _ := strconv.ParseUint(p, 16, 16); int(v) == port {
				out = append(out, addr)
			}
		}
	}
	return out
}

// Issue 18: told tcp://127.0.0.1:PORT, the publisher binds the loopback address only (before, it dialled
// that address as a ZMQ client, and nothing listened); told tcp://*:PORT it binds every interface. A
// subscriber gets the events either way.
func TestEventsBindLoopback(t *testing.T) {
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		t.Skip("no /proc/net/tcp")
	}
	for _, tc := range []struct {
		endpoint string
		want     string // /proc/net/tcp's spelling of the bound address
	}{{"tcp://127.0.0.1:0", "0100007F"}, {"tcp://*:0", "00000000"}} {
		e := eventsEngine(t, func(c *Config) { c.KVEvents.Endpoint = tc.endpoint })
		addr := e.EventsAddr()
		port, err := strconv.Atoi(addr[strings.LastIndex(addr, ":")+1:])
		if !strings.HasPrefix(addr, "tcp://127.0.0.1:") || err != nil || port == 0 {
			t.Fatalf("%s: EventsAddr %q", tc.endpoint, addr)
		}
		got := listenAddrs(t, port)
		ok := len(got) > 0
		for _, a := range got {
			// tcp6 spells the unspecified address as 32 zeros; "*" may bind either family.
			if a != tc.want && !(tc.want == "00000000" && strings.Trim(a, "0") == "") {
				ok = false
			}
		}
		if !ok {
			t.Fatalf("%s: port %d listens on %v, want only %s", tc.endpoint, port, got, tc.want)
		}
		sub := startSub(t, e, "kv@", 1)
		if r := post(t, e, "/v1/completions", map[string]any{"model": "m", "prompt": seqTokens(33, 1), "max_tokens": 1}); r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
		if m := sub.next(t); m.Topic != "kv@sim@m" || len(batchEvents(t, m.Batch)) != 1 {
			t.Fatalf("%s: %s", tc.endpoint, fmt.Sprint(m))
		}
	}
}
