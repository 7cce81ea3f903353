"""Item 4 of the hardening issue: what a kernel's output can make the gateway hold is
bounded in bytes, not in messages.

Code in a kernel is untrusted. Reported: 200 stream messages of 8 MiB pushed the daemon
past 4 GiB, one message of 300 MB peaked at 1.8 GiB, and four reads at once of the summary
of an execution with 300,000 displays (a 24.9 MB body) added 583 MiB. Here a real daemon
and a real ipykernel: the kernel publishes 2 GiB of 8 MiB messages, one of 300 MB and 400
displays of 64 KiB while a client reads; the daemon's own peak resident memory (VmHWM in
/proc, not its kernels') must stay under :data:`BOUND`; the client gets to the execution's
``idle``; the transcript holds, for what it could not keep whole, cut messages with their
marker or gap records, never a silent hole (and the test fails if nothing was cut: the
bound did something). Then several reads of the execution's summary at once, which must
not cost several times one read.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect

from ..integration.daemon import Daemon
from ..timing import seconds

MiB = 1024 * 1024
#: The daemon's peak resident memory, whatever the kernel sends.
BOUND = 512 * MiB
#: The flood: FLOOD messages of CHUNK characters of stdout (2 GiB), one of BIG characters,
#: and DISPLAYS displays of DISPLAY_BYTES each (over the summary's output bound).
FLOOD, CHUNK, BIG = 256, 8 * MiB, 300_000_000
DISPLAYS, DISPLAY_BYTES = 400, 64 * 1024
CODE = f"""
chunk = 'x' * {CHUNK}
for i in range({FLOOD}):
    print(chunk, end='', flush=True)
del chunk
big = 'y' * {BIG}
print(big, end='', flush=True)
del big
from IPython.display import display
for i in range({DISPLAYS}):
    display({{'text/plain': str(i).rjust({DISPLAY_BYTES}, '.')}}, raw=True)
"""


def status_kib(pid: int, field: str) -> int:
    """A ``kB`` field of /proc/<pid>/status (VmHWM: peak resident memory; VmRSS: now)."""
    text = Path(f"/proc/{pid}/status").read_text()
    found = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    assert found is not None, text
    return int(found.group(1))


def reset_peak(pid: int) -> None:
    """Start VmHWM again from the current resident memory (Linux: clear_refs 5)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


async def execute_and_follow(daemon: Daemon, kernel_id: str) -> dict[str, Any]:
    """Run CODE from a channels client that reads everything; what it saw of it."""
    url = f"ws://127.0.0.1:{daemon.port}/api/kernels/{kernel_id}/channels?session_id=flood"
    request = HTTPRequest(url, headers=daemon.headers, connect_timeout=seconds(60))
    ws = await websocket_connect(request, max_message_size=64 * MiB)
    msg_id = "memory-bounds-flood"
    header = {
        "msg_id": msg_id,
        "msg_type": "execute_request",
        "session": "flood",
        "username": "test",
        "version": "5.3",
        "date": "2026-01-01T00:00:00Z",
    }
    content = {"code": CODE, "silent": False, "store_history": True, "user_expressions": {}}
    ws.write_message(
        json.dumps(
            {
                "header": header,
                "parent_header": {},
                "metadata": {},
                "content": {**content, "allow_stdin": False, "stop_on_error": True},
                "channel": "shell",
                "buffers": [],
            }
        )
    )
    seen = {"msg_id": msg_id, "cut": [], "lost": 0, "stdout": 0, "displays": 0, "idle": False}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds(240)
    try:
        while not seen["idle"]:
            data = await asyncio.wait_for(ws.read_message(), max(0.1, deadline - loop.time()))
            assert data is not None, f"closed: {ws.close_code} {ws.close_reason}"
            if len(data) > 16 * 1024:  # a large one: read without a parse (keep up)
                assert isinstance(data, str)
                large(data, seen)
                continue
            message = json.loads(data)
            if message["msg_type"] == "kernel_gateway_stream_gap":
                seen["lost"] += lost(message["content"])
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind, body = message["msg_type"], message["content"]
            if "truncated" in body:
                seen["cut"].append(body["truncated"]["original_bytes"])
            if kind == "stream":
                seen["stdout"] += len(body["text"])
            elif kind == "display_data":
                seen["displays"] += 1
            elif kind == "status" and body["execution_state"] == "idle":
                seen["idle"] = True
    finally:
        ws.close()
    return seen


def large(data: str, seen: dict[str, Any]) -> None:
    """Count a large message of the execution (a display, or a stream cut to 64 KiB) from
    its text alone: a JSON parse of each would make this client the bottleneck."""
    assert seen["msg_id"] in data[:4096]  # its parent header
    marker = re.search(r'"truncated":\s*\{"original_bytes":\s*(\d+)', data[-1024:])
    if marker is not None:
        seen["cut"].append(int(marker.group(1)))
    elif re.search(r'"msg_type":\s*"display_data"', data[:1024]):
        seen["displays"] += 1
    else:
        raise AssertionError(data[:1024])


def lost(gap: dict[str, Any]) -> int:
    """How many of the kernel's messages a gap record's content says are missing: its
    ``lost`` (a source dropped them), else its range (numbers given out, not kept)."""
    if "lost" in gap:
        assert isinstance(gap["lost"], int), gap  # never an unknown number here
        return int(gap["lost"])
    return int(gap["last_seq"]) - int(gap["first_seq"]) + 1


async def read_transcript(daemon: Daemon, kernel_id: str, parent: str) -> list[dict[str, Any]]:
    """Every record of one execution (and the kernel's gap records), page by page."""
    records: list[dict[str, Any]] = []
    since = 0
    while True:
        page = await daemon.fetch(
            f"/api/kernels/{kernel_id}/transcript?since={since}&limit=10000&parent={parent}"
            "&msg_type=stream,display_data,kernel_gateway_stream_gap",
            request_timeout=seconds(120),
        )
        if not page["records"]:
            return records
        records.extend(page["records"])
        since = page["next_since"]


async def summary_peak(daemon: Daemon, path: str, readers: int) -> tuple[int, list[int]]:
    """The daemon's peak resident memory (KiB) over its resident memory before, while
    ``readers`` clients read ``path`` at once; and the sizes of the bodies they got."""
    assert daemon.process is not None
    pid = daemon.process.pid
    reset_peak(pid)
    before = status_kib(pid, "VmRSS")
    client = AsyncHTTPClient(force_instance=True, max_body_size=256 * MiB)
    try:
        responses = await asyncio.gather(
            *(
                client.fetch(
                    daemon.url + path, headers=daemon.headers, request_timeout=seconds(120)
                )
                for _ in range(readers)
            )
        )
    finally:
        client.close()
    return status_kib(pid, "VmHWM") - before, [len(response.body) for response in responses]


@pytest.mark.alone  # measures the daemon's memory: no other `alone` test runs meanwhile
async def test_a_kernel_flooding_gigabytes_costs_the_gateway_a_bounded_amount_of_memory(
    daemon: Daemon, tmp_path: Path
) -> None:
    daemon.start()
    await daemon.wait_ready()
    assert daemon.process is not None
    pid = daemon.process.pid
    kernel_id = await daemon.start_kernel()
    seen = await execute_and_follow(daemon, kernel_id)
    peak = status_kib(pid, "VmHWM") * 1024
    print(f"flood of {(FLOOD * CHUNK + BIG) / MiB:.0f} MiB: daemon peak {peak / MiB:.0f} MiB")
    assert peak < BOUND
    assert os.getpid() != pid  # the daemon's process, not this one's

    # The execution ended, and the client was told of every message over max_message_bytes
    # (8 MiB): it reached the client cut, with its original size, or the Tap's backlog
    # (iopub_backlog_bytes, 64 MiB: seven of these) was full and a gap record says so.
    assert seen["idle"]
    print(f"the client got {len(seen['cut'])} cut messages, gaps of {seen['lost']} messages")
    assert len(seen["cut"]) > FLOOD // 2, "the control: what was over the limit went cut"
    assert len(seen["cut"]) + seen["lost"] == FLOOD + 1 + DISPLAYS - seen["displays"]

    # The transcript: valid, and what it did not keep whole is cut with its marker or in a
    # gap record (the store's backlog may drop under load, and says so); none was kept whole.
    records = await read_transcript(daemon, kernel_id, seen["msg_id"])
    cut = gaps = 0
    for record in records:
        kind, content = record["msg_type"], record["content"]
        if kind == "kernel_gateway_stream_gap":
            gaps += lost(content)
        elif kind == "stream":
            assert "truncated" in content, "a message over the limit was kept whole"
            assert content["truncated"]["original_bytes"] > 8 * MiB
            assert 0 < len(content["text"]) <= 64 * 1024
            assert set(content["text"]) <= {"x", "y"}
            cut += 1
    assert cut > 0
    assert cut + gaps >= FLOOD + 1, "a message neither recorded (cut) nor in a gap"
    assert any(size > BIG for size in seen["cut"]) or gaps, "the 300 MB message"

    # The summary of that execution: bounded (its stdout tail, its first outputs, with what
    # it left out counted), and several reads at once cost no more than its slots' worth.
    path = f"/api/kernels/{kernel_id}/executions/{seen['msg_id']}"
    summary = await daemon.fetch(path, request_timeout=seconds(120))
    assert summary["status"] == "ok"
    assert summary["outputs_omitted"] > 0, "the control: the outputs were bounded"
    assert summary["messages_cut"] == cut
    assert 0 < len(summary["stdout"]) <= 8 * MiB
    assert len(summary["outputs"]) + summary["outputs_omitted"] == seen["displays"]
    one, sizes = await summary_peak(daemon, path, 1)
    four, more_sizes = await summary_peak(daemon, path, 4)
    print(
        f"summary of {sizes[0] / MiB:.1f} MiB: one read +{one / 1024:.0f} MiB, "
        f"four at once +{four / 1024:.0f} MiB"
    )
    assert set(more_sizes) == set(sizes)
    # Built and sent two at a time (max_concurrent_summaries): four cost at most two
    # reads' worth, plus what each waiting request holds (its headers, no body yet).
    assert four < 2 * max(one, 16 * 1024) + 32 * 1024
    assert status_kib(pid, "VmHWM") * 1024 < BOUND
