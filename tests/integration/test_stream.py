"""``GET /api/kernels/{id}/stream``: Server-Sent Events against a real server and kernels."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from kernel_gateway_stream.core.wire import SEQ_METADATA_KEY
from kernel_gateway_stream.handlers.common import SETTINGS_KEY

from ..timing import seconds
from .sseclient import Event, SSEReader, parse_events, stream_text
from .waits import wait_until

EVERY_KIND = """
import sys
from IPython.display import display, HTML
print("out")
print("err", file=sys.stderr)
display(HTML("<b>shown</b>"))
40 + 2
"""


@pytest.fixture
def sse(
    http_server_client: Any, jp_http_port: int, jp_auth_header: dict[str, str], jp_base_url: str
) -> Iterator[Any]:
    readers: list[SSEReader] = []

    def open_stream(kernel_id: str, query: str = "", **headers: str) -> SSEReader:
        base = jp_base_url.rstrip("/")
        url = f"http://127.0.0.1:{jp_http_port}{base}/api/kernels/{kernel_id}/stream"
        reader = SSEReader(f"{url}?{query}", {**jp_auth_header, **headers})
        readers.append(reader)
        return reader

    yield open_stream
    for reader in readers:
        reader.close()


def ids_are_seqs(events: list[Event]) -> None:
    """Each event's id is the last seq it carries; ids only grow."""
    seqs = [e.id for e in events if e.id is not None]
    assert seqs == sorted(set(seqs))
    for event in events:
        if event.id is not None:
            assert event.data["metadata"][SEQ_METADATA_KEY]["seq"] == event.id


async def all_live(services: Any, kernel_id: str, count: int) -> None:
    """Until ``count`` clients of the kernel follow its live output."""
    subscribers = services.subscribers

    def attached() -> bool:
        found = subscribers.of(kernel_id)
        return len(found) == count and all(subscriber.live for subscriber in found)

    await wait_until(attached, f"{count} clients attached, live")


@pytest.mark.smoke
async def test_every_event_type_live(
    start_kernel: Any, connect: Any, sse: Any, services: Any
) -> None:
    kernel_id = await start_kernel()
    reader = sse(kernel_id)
    ws = await connect(kernel_id)
    await all_live(services, kernel_id, 2)  # the reader is attached before the run starts
    msg_id = ws.execute(EVERY_KIND)
    events = await reader.until_idle(msg_id)
    mine = [e for e in events if e.data["parent_header"].get("msg_id") == msg_id]
    kinds = [e.event for e in mine]
    assert kinds[0] == "status"
    assert {"execute_input", "stream", "display_data", "execute_result"} <= set(kinds)
    assert stream_text(mine) == "out\n"
    assert stream_text(mine, "stderr") == "err\n"
    result = next(e for e in mine if e.event == "execute_result")
    assert result.data["content"]["data"]["text/plain"] == "42"
    ids_are_seqs(events)
    error_id = ws.execute("1/0")
    events = await reader.until_idle(error_id)
    error = next(e for e in events if e.event == "error")
    assert error.data["content"]["ename"] == "ZeroDivisionError"


async def test_resume_by_last_event_id_mid_execution(
    start_kernel: Any, connect: Any, sse: Any
) -> None:
    """Invariant 5 over SSE: Last-Event-ID resumes with no gap and no duplicate, and the
    replay hands over to live output while the kernel still prints."""
    kernel_id = await start_kernel()
    ws = await connect(kernel_id)
    msg_id = ws.execute(
        "import time\nfor i in range(3000):\n    print(i, flush=True)\n    time.sleep(0.0005)"
    )
    # From the start: opened live, it could miss what the kernel printed before it.
    first = sse(kernel_id, f"since=0&parent={msg_id}")
    await first.until(lambda events: len(stream_text(events).splitlines()) >= 400)
    first.close()
    seen = list(first.events)
    last_id = seen[-1].id
    assert last_id is not None
    # As a browser's EventSource reconnects: its URL still says since=0, its header says
    # where it got to. The header is the newer: nothing is sent twice.
    second = sse(kernel_id, f"since=0&parent={msg_id}", **{"Last-Event-ID": str(last_id)})
    rest = await second.until_idle(msg_id)
    first_seq = rest[0].data["metadata"][SEQ_METADATA_KEY]["first_seq"]
    assert first_seq > last_id
    assert stream_text(seen) + stream_text(rest) == "".join(f"{i}\n" for i in range(3000))
    ids_are_seqs(seen + rest)


async def test_filters_by_parent_and_msg_type(start_kernel: Any, connect: Any, sse: Any) -> None:
    kernel_id = await start_kernel()
    ws = await connect(kernel_id)
    other = ws.execute("print('not this one')")
    await ws.until_idle(other)
    wanted = ws.execute("print('this one')\n7")
    await ws.until_idle(wanted)
    only = sse(kernel_id, f"since=0&parent={wanted}&msg_type=stream,execute_result")
    events = await only.until(lambda events: any(e.event == "execute_result" for e in events))
    assert [e.event for e in events] == ["stream", "execute_result"]
    assert stream_text(events) == "this one\n"
    everything = sse(kernel_id, "since=0&msg_type=stream&msg_type=status")
    events = await everything.until_idle(wanted)
    assert {e.event for e in events} == {"stream", "status"}
    assert stream_text(events) == "not this one\nthis one\n"


async def test_two_readers_and_a_channels_client_see_the_same_execution(
    start_kernel: Any, connect: Any, sse: Any, services: Any
) -> None:
    kernel_id = await start_kernel()
    readers = [sse(kernel_id), sse(kernel_id)]
    ws = await connect(kernel_id)
    await all_live(services, kernel_id, 3)
    msg_id = ws.execute("for i in range(2000): print(i, flush=True)")
    expected = "".join(f"{i}\n" for i in range(2000))
    received = await ws.until_idle(msg_id)
    for reader in readers:
        assert stream_text(await reader.until_idle(msg_id)) == expected
    assert received.text() == expected


async def test_heartbeat_comments_keep_a_quiet_stream_open(
    jp_serverapp: Any, start_kernel: Any, sse: Any
) -> None:
    settings = jp_serverapp.web_app.settings
    settings[SETTINGS_KEY] = dataclasses.replace(settings[SETTINGS_KEY], sse_heartbeat=0.1)
    kernel_id = await start_kernel()
    reader = sse(kernel_id)
    await wait_until(lambda: reader.comments >= 3, "three heartbeat comments")


@pytest.mark.parametrize(
    ("query", "headers", "status", "reason"),
    [
        ("since=abc", {}, 400, "bad_request"),
        ("", {"Last-Event-ID": "-3"}, 400, "bad_request"),
        ("since=99999999", {}, 400, "since_ahead_of_head"),
    ],
)
async def test_bad_resume_points_get_400(
    start_kernel: Any,
    sse: Any,
    query: str,
    headers: dict[str, str],
    status: int,
    reason: str,
) -> None:
    """Invariant 8: 4xx with a JSON reason, before any event is sent."""
    kernel_id = await start_kernel()
    reader = sse(kernel_id, query, **headers)
    response = await reader.response
    assert response.code == status
    assert json.loads(reader.raw)["reason"] == reason


async def test_unknown_kernel_gets_404(sse: Any) -> None:
    reader = sse("00000000-0000-0000-0000-000000000000")
    response = await asyncio.wait_for(reader.response, seconds(30))
    assert response.code == 404
    assert json.loads(reader.raw)["reason"] == "unknown_kernel"


async def test_slow_reader_gets_a_final_event_with_its_resume_point(
    start_kernel: Any,
    connect: Any,
    sse: Any,
    services: Any,
    jp_http_port: int,
    jp_auth_header: dict[str, str],
    jp_base_url: str,
) -> None:
    """Invariant 3 over SSE: a reader that stops reading is ended with a final event that
    names the last seq it was sent; resuming from it loses nothing."""
    # A queue's bound is taken from the policy when its client connects: the stalled
    # reader gets 4 MiB; the test's own WebSocket, which reads the whole 25 MB flood in
    # this process's busy event loop, keeps the default (more than the flood), so that
    # only the reader under test can be cut off.
    default_max_bytes = services.policy.max_bytes
    services.policy.max_bytes = 4 * 1024 * 1024
    kernel_id = await start_kernel()
    base = jp_base_url.rstrip("/")
    raw = socket.create_connection(("127.0.0.1", jp_http_port))
    auth = "".join(f"{k}: {v}\r\n" for k, v in jp_auth_header.items())
    path = f"{base}/api/kernels/{kernel_id}/stream"
    raw.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n".encode())
    await wait_until(  # attached, then never read
        lambda: len(services.subscribers.of(kernel_id)) == 1, "the stalled reader attached"
    )
    services.policy.max_bytes = default_max_bytes
    ws = await connect(kernel_id)
    line = "y" * 1000
    msg_id = ws.execute(f"for i in range(25000): print({line!r}, i, flush=True)")
    expected = "".join(f"{line} {i}\n" for i in range(25000))
    running = asyncio.ensure_future(ws.until_idle(msg_id, timeout=300))
    # Once the gateway has cut the reader off (its subscriber is gone), it reads (not
    # later: a stream whose reader does not take its last event within 5 s is closed).
    reader = next(s for s in services.subscribers.of(kernel_id) if s.transport is not ws)
    await wait_until(
        lambda: reader not in services.subscribers.of(kernel_id),
        "the stalled reader cut off",
        timeout=300,
    )
    loop = asyncio.get_running_loop()
    raw.setblocking(False)
    body = b""
    while True:
        chunk = await asyncio.wait_for(loop.sock_recv(raw, 1 << 20), seconds(60))
        if not chunk:
            break
        body += chunk
        if b"event: slow_consumer" in body and body.endswith(b"0\r\n\r\n"):
            break
    raw.close()
    assert (await running).text() == expected
    events, _, _ = parse_events(dechunk(body.split(b"\r\n\r\n", 1)[1]))
    assert events[-1].event == "slow_consumer"
    last_seq = events[-1].data["last_seq"]
    assert last_seq == events[-2].id
    resumed = sse(kernel_id, f"parent={msg_id}", **{"Last-Event-ID": str(last_seq)})
    rest = await resumed.until_idle(msg_id)
    assert stream_text(events) + stream_text(rest) == expected


def dechunk(body: bytes) -> bytes:
    """The payload of an HTTP/1.1 chunked body."""
    out = b""
    while body:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += body[:size]
        body = body[size + 2 :]
    return out
