#!/usr/bin/python3
"""Test publisher for kvevents: a libzmq (pyzmq) stand-in for vLLM's ZmqEventPublisher.

Binds an XPUB (wire-identical to vLLM's PUB; XPUB lets us report subscriptions) and a replay ROUTER that
serves like ZmqEventPublisher._service_replay (vllm/distributed/kv_events.py; see ref/kv-events/
replay_probe.py). Commands on stdin, one per line; each is answered "ok":
  pub SEQ HEX      publish [topic, seq 8B BE, payload] and keep it in the replay buffer
  lose SEQ HEX     keep it in the replay buffer only (a message lost in transit)
  raw HEX HEX ...  publish arbitrary frames (not buffered)
  clearbuf         empty the replay buffer (replay no longer reaches back)
  bufsteps N       keep only the last N batches for replay (vLLM's buffer_steps)
  replaydelay MS   sleep MS milliseconds before sending each replayed batch (a slow replay)
  quit
Prints "ready PUBPORT ROUTERPORT" first, "sub" for each subscription, "replay START" after serving one.
Usage: pypub.py [PUBPORT [ROUTERPORT]] (0 = pick a free port).
"""
import queue
import sys
import threading
import time

import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)
TOPIC = b"kv@test"


def main():
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    router = ctx.socket(zmq.ROUTER)
    ports = [int(a) for a in sys.argv[1:3]] + [0, 0]
    pport, rport = ports[0], ports[1]
    if pport == 0:
        pport = pub.bind_to_random_port("tcp://127.0.0.1")
    else:
        pub.bind(f"tcp://127.0.0.1:{pport}")
    if rport == 0:
        rport = router.bind_to_random_port("tcp://127.0.0.1")
    else:
        router.bind(f"tcp://127.0.0.1:{rport}")
    out_lock = threading.Lock()

    def say(s):
        with out_lock:
            sys.stdout.write(s + "\n")
            sys.stdout.flush()

    buf = []
    buf_lock = threading.Lock()
    opts = {"steps": 0, "delay": 0.0}
    stop = threading.Event()

    def serve_replay():
        while not stop.is_set():
            if not router.poll(20):
                continue
            frame = router.recv_multipart()
            if len(frame) != 3:
                continue
            client_id, _, start = frame
            start_seq = int.from_bytes(start, "big")
            with buf_lock:
                items = [x for x in buf if x[0] >= start_seq]
            for seq, payload in items:
                if opts["delay"]:
                    time.sleep(opts["delay"])
                router.send_multipart((client_id, b"", seq.to_bytes(8, "big"), payload))
            router.send_multipart((client_id, b"", END_SEQ, b""))
            say(f"replay {start_seq}")

    cmds = queue.Queue()

    def read_stdin():
        for line in sys.stdin:
            cmds.put(line.split())
        cmds.put(["quit"])

    server = threading.Thread(target=serve_replay, daemon=True)
    server.start()
    threading.Thread(target=read_stdin, daemon=True).start()
    say(f"ready {pport} {rport}")
    while True:
        if pub.poll(5):
            m = pub.recv()
            if m[:1] == b"\x01":
                say("sub")
        try:
            c = cmds.get_nowait()
        except queue.Empty:
            continue
        if not c:
            continue
        if c[0] == "quit":
            break
        if c[0] in ("pub", "lose"):
            seq, payload = int(c[1]), bytes.fromhex(c[2])
            with buf_lock:
                buf.append((seq, payload))
                if opts["steps"] and len(buf) > opts["steps"]:
                    del buf[: len(buf) - opts["steps"]]
            if c[0] == "pub":
                pub.send_multipart((TOPIC, seq.to_bytes(8, "big"), payload))
        elif c[0] == "raw":
            pub.send_multipart([bytes.fromhex(x) for x in c[1:]])
        elif c[0] == "bufsteps":
            opts["steps"] = int(c[1])
        elif c[0] == "replaydelay":
            opts["delay"] = int(c[1]) / 1000.0
        elif c[0] == "clearbuf":
            with buf_lock:
                buf.clear()
        say("ok")
    stop.set()
    server.join()
    pub.close(0)
    router.close(0)
    ctx.term()


if __name__ == "__main__":
    main()
