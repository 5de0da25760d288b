package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvstore/testenv"
)

// kvPublisher is a libzmq (pyzmq) PUB socket on a loopback port that sends payloads in turn as
// [topic, seq (8-byte big-endian), payload], seq counting from 0, every 20 ms for up to 60 s.
const kvPublisher = `
import sys, time, zmq
payloads = [bytes.fromhex(h) for h in sys.argv[1:]]
s = zmq.Context().socket(zmq.PUB)
port = s.bind_to_random_port("tcp://127.0.0.1")
print(port, flush=True)
seq = 0
end = time.time() + 60
while time.time() < end:
    s.send_multipart([b"kv@test@m", seq.to_bytes(8, "big"), payloads[seq % len(payloads)]])
    seq += 1
    time.sleep(0.02)
`

// Issue 18: `kvgate kv tail` prints a live publisher's batches as JSON, each batch exactly what `kv decode`
// prints for its payload, with topic and sequence number; a payload that does not decode is a line with
// the error and the payload's hex, and tailing goes on.
func TestKVTailLivePublisher(t *testing.T) {
	py := testenv.PythonWith(t, "zmq")
	var payloads []string
	f, err := os.Open("../kvstore/kvevents/testdata/payloads.hex.txt")
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() && len(payloads) < 2 {
		_, hx, _ := strings.Cut(sc.Text(), " ")
		payloads = append(payloads, hx)
	}
	f.Close()
	payloads = append(payloads, "c1c1") // not msgpack of a batch
	cmd := exec.Command(py, append([]string{"-c", kvPublisher}, payloads...)...)
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	port, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := kvTail(ctx, "tcp://127.0.0.1:"+strings.TrimSpace(port), "kv@", 7, false, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 7 {
		t.Fatalf("%d lines:\n%s", len(lines), out.String())
	}
	var prev int64 = -1
	errs := 0
	for _, l := range lines {
		var got struct {
			Topic      string          `json:"topic"`
			Seq        int64           `json:"seq"`
			Batch      json.RawMessage `json:"batch"`
			Error      string          `json:"error"`
			PayloadHex string          `json:"payload_hex"`
		}
		if err := json.Unmarshal([]byte(l), &got); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		if got.Topic != "kv@test@m" || (prev >= 0 && got.Seq != prev+1) {
			t.Fatalf("line %q after seq %d", l, prev)
		}
		prev = got.Seq
		payload := payloads[got.Seq%int64(len(payloads))]
		if payload == "c1c1" {
			if got.Error == "" || got.PayloadHex != "c1c1" || got.Batch != nil {
				t.Fatalf("bad payload: %q", l)
			}
			errs++
			continue
		}
		var want bytes.Buffer
		if err := kvDecode(strings.NewReader(payload), &want, false); err != nil {
			t.Fatal(err)
		}
		if string(got.Batch) != strings.TrimSpace(want.String()) || got.Error != "" {
			t.Fatalf("seq %d: batch %s\nwant (kv decode) %s", got.Seq, got.Batch, want.String())
		}
	}
	if errs < 2 {
		t.Fatalf("%d undecodable payloads among 7 consecutive messages, want 2 or 3", errs)
	}
}
