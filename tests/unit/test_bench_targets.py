"""benchmarks: the floor loop checks what it reads as the gateway does, and the runner puts
each row against its reference and issue 23's targets against the rows."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from typing import Any

import zmq

from benchmarks.__main__ import add_ratios, targets
from benchmarks.nodes import LOCAL, ON_REDIS
from benchmarks.references import DELIMITER, floor_loop
from benchmarks.scenarios import FLOOR
from benchmarks.wsclient import Tally

KEY = b"a-key"


def _message(msg_type: str, content: dict[str, Any], parent: str, key: bytes) -> list[bytes]:
    header = json.dumps({"msg_id": f"m{time.monotonic_ns()}", "msg_type": msg_type}).encode()
    parts = [header, json.dumps({"msg_id": parent}).encode(), b"{}", json.dumps(content).encode()]
    signature = hmac.new(key, b"".join(parts), hashlib.sha256).hexdigest().encode()
    return [b"stream", DELIMITER, signature, *parts]


def test_the_floor_loop_counts_only_signed_messages() -> None:
    context = zmq.Context()
    pub = context.socket(zmq.XPUB)
    sub = context.socket(zmq.SUB)
    try:
        pub.bind("inproc://iopub")
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect("inproc://iopub")
        assert pub.recv() == b"\x01"  # the subscription has arrived
        tally = Tally("run")
        cpu: list[float] = []
        reader = threading.Thread(target=lambda: cpu.append(floor_loop(sub, KEY, tally, 10)))
        reader.start()
        pub.send_multipart(_message("stream", {"name": "stdout", "text": "0\n1\n"}, "run", KEY))
        forged = _message("stream", {"name": "stdout", "text": "2\n"}, "run", b"other")
        pub.send_multipart(forged)
        pub.send_multipart(_message("stream", {"name": "stdout", "text": "2\n"}, "other", KEY))
        pub.send_multipart(_message("stream", {"name": "stdout", "text": "2\n"}, "run", KEY))
        pub.send_multipart(_message("status", {"execution_state": "idle"}, "run", KEY))
        reader.join(15)
        assert tally.done
        assert (tally.lines, tally.gaps) == (3, 0)  # the forged "2" was not counted
        assert cpu
        assert cpu[0] > 0
    finally:
        pub.close(linger=0)
        sub.close(linger=0)
        context.term()


def _throughput(system: str, case: str, rate: float, us: float) -> dict[str, Any]:
    return {
        "scenario": "throughput",
        "system": system,
        "case": case,
        "messages_per_second": rate,
        "us_per_message": us,
    }


def test_issue_23_targets_come_from_the_right_rows() -> None:
    ours = "kernel_gateway_stream"
    peer = "jupyter_server (limit off)"
    rows: list[dict[str, Any]] = [
        _throughput(FLOOR, "100,000 x 64 B, zmq", 50_000, 14.0),
        _throughput(ours, "100,000 x 64 B, v1", 40_000, 28.0),
        _throughput(ours, "100,000 x 64 B, legacy", 45_000, 25.0),
        _throughput(peer, "100,000 x 64 B, v1", 6_000, 140.0),
        {"scenario": "fanout", "system": ours, "case": "1 clients", "seconds": 1.0},
        {"scenario": "fanout", "system": ours, "case": "1 clients, 4096 B", "seconds": 1.0,
         "cpu_seconds": 0.5},
        {"scenario": "fanout", "system": ours, "case": "100 clients, 4096 B", "seconds": 3.0,
         "cpu_seconds": 0.9, "expected": 5_000, "clients": 100},
        {"scenario": "nodes", "system": LOCAL, "case": "latency, a line every 10 ms",
         "server_us_per_message": 500.0},
        {"scenario": "nodes", "system": LOCAL, "case": "flood of 20,000 lines, 1 client",
         "server_us_per_message": 100.0},
        {"scenario": "nodes", "system": ON_REDIS, "case": "flood of 20,000 lines, 1 client",
         "server_us_per_message": 110.0, "cpu_x_one_node": 1.1},
        {"scenario": "nodes", "system": ON_REDIS, "case": "firehose 100,000 x 64 B, 1 client",
         "server_us_per_message": 40.0, "cpu_x_one_node": 1.6},
    ]  # fmt: skip
    add_ratios(rows)
    assert rows[1]["x_floor"] == 0.8
    assert rows[1]["cpu_x_floor"] == 2.0
    # A 4 KiB fan-out is put against one client of 4 KiB, not of 64 B.
    assert rows[6]["x_one_client"] == 3.0
    assert rows[6]["cpu_x_one_client"] == 1.8
    found = {check["target"]: check for check in targets(rows)}
    cpu = found["(23) firehose 100,000 x 64 B: <= 12 us a message"]
    assert (cpu["measured"], cpu["met"]) == (28.0, False)  # the worse protocol
    ratio = found["(23) firehose 100,000 x 64 B: CPU <= 0.12 x jupyter_server (limit off)"]
    assert ratio["measured"] == 0.2
    rate = found["firehose 100,000 x 64 B: >= 1.0 x the floor loop's rate"]
    assert (rate["measured"], rate["met"]) == (0.8, False)
    flood = found[
        "(23) one node on Redis, flood of 20,000 lines: CPU per message <= 1.15 x in-process"
    ]
    assert (flood["measured"], flood["met"]) == (1.1, True)
    firehose = found[
        "(23) one node on Redis, firehose 100,000 x 64 B: CPU per message <= 1.15 x in-process"
    ]
    assert (firehose["measured"], firehose["met"]) == (1.6, False)
    wide = found["(23) fan-out to 100 clients, 4096 B: server CPU <= 2 x one client's"]
    assert (wide["measured"], wide["met"]) == (1.8, True)
