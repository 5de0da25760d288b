#!/usr/bin/python3
"""libzmq (pyzmq) client for enginesim's KV events, used by the Go tests.

  sub ENDPOINT TOPIC N TIMEOUT_MS   SUB: print one JSON line per message until N messages or timeout:
                                    {"topic": str, "seq": int, "batch": <msgpack payload decoded>}
  replay ENDPOINT START TIMEOUT_MS  DEALER: send ["", START as 8-byte BE], print one JSON line per reply
                                    until the end marker (seq 2^64-1), which is printed too.

Bytes are printed as {"hex": "..."}. A line "READY" is printed once the socket has connected and subscribed
locally; the Go tests then wait until the engine's PUB socket lists the subscription.
"""
import json
import sys
import time

import msgpack
import zmq


def plain(v):
    if isinstance(v, bytes):
        return {"hex": v.hex()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(plain(k)) if not isinstance(k, bytes) else k.decode(): plain(x) for k, x in v.items()}
    return v


def main():
    mode, endpoint = sys.argv[1], sys.argv[2]
    ctx = zmq.Context.instance()
    if mode == "sub":
        topic, n, timeout = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        s = ctx.socket(zmq.SUB)
        s.connect(endpoint)
        s.setsockopt(zmq.SUBSCRIBE, topic.encode())
        print("READY", flush=True)
        got = 0
        deadline = time.time() + timeout / 1000
        while got < n and time.time() < deadline:
            if not s.poll(50):
                continue
            t, seq, payload = s.recv_multipart()
            batch = msgpack.unpackb(payload, raw=False)
            print(json.dumps({"topic": t.decode(), "seq": int.from_bytes(seq, "big"), "batch": plain(batch)}), flush=True)
            got += 1
    elif mode == "replay":
        start, timeout = int(sys.argv[3]), int(sys.argv[4])
        d = ctx.socket(zmq.DEALER)
        d.connect(endpoint)
        print("READY", flush=True)
        d.send_multipart([b"", start.to_bytes(8, "big")])
        deadline = time.time() + timeout / 1000
        while time.time() < deadline:
            if not d.poll(50):
                continue
            parts = d.recv_multipart()
            seq = int.from_bytes(parts[1], "big")
            batch = msgpack.unpackb(parts[2], raw=False) if parts[2] else None
            print(json.dumps({"frames": len(parts), "seq": seq, "batch": plain(batch)}), flush=True)
            if seq == 2**64 - 1:
                break
    else:
        sys.exit("unknown mode " + mode)


if __name__ == "__main__":
    main()
