package kvstore

import (
	"testing"
	"time"
)

// TestRecordCacheExpiryAndCompaction drives the shared-record cache on a fake clock: holds expire, the
// FIFO is compacted, the count stays equal to the map's content, and live() encodes server expiries.
func TestRecordCacheExpiryAndCompaction(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newRecordCache()
	c.now = func() time.Time { return now }
	keys := make([]BlockKey, 128)
	for round := range 200 {
		for i := range keys {
			keys[i] = BlockKey(round*1000 + i)
		}
		c.record("m", "e0", keys, now.Add(2*time.Second))
		if round%2 == 0 {
			c.record("m", "e1", keys[:4], now.Add(500*time.Millisecond))
		}
		now = now.Add(100 * time.Millisecond)
	}
	count := 0
	for _, hs := range c.holds {
		count += len(hs)
	}
	if count != c.n {
		t.Fatalf("n = %d, map holds %d", c.n, count)
	}
	// 2 s of 100 ms rounds: the last 20 rounds of e0 are live (128 each), e1's last 3 of every other round.
	if c.n > 21*128+3*4 || c.n < 19*128 {
		t.Fatalf("%d holds live after the sweep, want about %d", c.n, 20*128)
	}
	if len(c.fifo)-c.head != c.n && len(c.fifo)-c.head < c.n {
		t.Fatalf("fifo %d (head %d) for %d holds", len(c.fifo), c.head, c.n)
	}
	if c.head > len(c.fifo)/2+1024 {
		t.Fatalf("fifo never compacted: head %d of %d", c.head, len(c.fifo))
	}
	got := c.live("m", []BlockKey{199*1000 + 0, 199*1000 + 1, 42}, 5000)
	if got == nil || got[0] == "" || got[2] != "" {
		t.Fatalf("live = %q", got)
	}
	// Expires 2 s - 100 ms after "now": server time 5000 + 1900 (+1) ms, times 4.
	if want := "e0\t" + "27604" + "\n"; got[0] != want {
		t.Fatalf("live record %q, want %q", got[0], want)
	}
	if c.live("m2", keys, 0) != nil {
		t.Fatal("another model's holds")
	}
	c.clearEndpoint("m", "e0")
	if c.live("m", []BlockKey{199 * 1000}, 0) != nil {
		t.Fatal("cleared endpoint still held")
	}
}

// TestRecordMsgRoundTrip checks the shared-record message and that truncated or altered ones are refused
// without a panic.
func TestRecordMsgRoundTrip(t *testing.T) {
	sender := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
	keys := []BlockKey{1, 1 << 63, 0xdeadbeef}
	b := encodeRecordMsg('R', sender, 1500*time.Millisecond, "qwen3", "e0/dp1", keys)
	m, err := decodeRecordMsg(b)
	if err != nil || m.op != 'R' || m.sender != sender || m.ttl != 1500*time.Millisecond || m.model != "qwen3" ||
		m.ep != "e0/dp1" || len(m.keys) != 3 || m.keys[1] != 1<<63 || m.keys[2] != 0xdeadbeef {
		t.Fatalf("round trip: %+v, %v", m, err)
	}
	for i := range len(b) - 1 {
		if (i-9-1-1-5-1-6)%8 == 0 && i > 9+1+1+5+1+6 { // a whole number of keys is a valid shorter message
			continue
		}
		if _, err := decodeRecordMsg(b[:i]); err == nil && i < 9+1+1+5+1+6 {
			t.Fatalf("truncated to %d bytes: accepted", i)
		}
	}
	bad := append([]byte{'X'}, b[1:]...)
	if _, err := decodeRecordMsg(bad); err == nil {
		t.Fatal("unknown op accepted")
	}
}
