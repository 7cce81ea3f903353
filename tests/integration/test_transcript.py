"""``GET /api/kernels/{id}/transcript`` and the fidelity of what it records."""

from __future__ import annotations

import asyncio
import json
import queue
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from ..timing import seconds

# Unicode, carriage returns, stderr and large unflushed writes (ipykernel batches those).
FIDELITY_CODE = r"""
import sys
for i in range(200):
    print(f"ligne {i} — ünïcödé ✓ 🚀", flush=(i % 2 == 0))
    if i % 17 == 0:
        print(f"warn {i}", file=sys.stderr, flush=True)
for p in range(0, 101, 5):
    print(f"\rprogress {p:3d}%", end="", flush=True)
print()
sys.stdout.write("x" * 300000 + "\n")
sys.stderr.write("tail\n")
"""


async def collect_direct(client: Any, msg_id: str) -> dict[str, str]:
    """Text per stream name, read straight off the kernel's IOPub by jupyter_client."""
    texts: dict[str, str] = {}
    while True:
        message = await client.get_iopub_msg(timeout=seconds(60))
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        if message["msg_type"] == "stream":
            name = message["content"]["name"]
            texts[name] = texts.get(name, "") + message["content"]["text"]
        if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
            return texts


@pytest.mark.smoke
async def test_transcript_is_byte_for_byte_what_the_kernel_published(
    jp_serverapp: Any, start_kernel: Any, connect: Any, transcript: Any
) -> None:
    """Invariant 2: per (parent msg_id, stream name) the transcript's text equals, byte for
    byte, what a direct ZMQ subscriber saw the kernel publish."""
    kernel_id = await start_kernel()
    client = jp_serverapp.kernel_manager.get_kernel(kernel_id).client()
    client.start_channels()
    try:
        # Beat the slow joiner: ask until our own IOPub socket sees a reply's status.
        asked: set[str] = set()
        subscribed = False
        while not subscribed:
            asked.add(client.kernel_info())
            try:
                while not subscribed:
                    message = await client.get_iopub_msg(timeout=seconds(1))
                    subscribed = message["parent_header"].get("msg_id") in asked
            except queue.Empty:
                continue
        ws = await connect(kernel_id)
        msg_id = ws.execute(FIDELITY_CODE)
        direct, via_ws = await asyncio.gather(collect_direct(client, msg_id), ws.until_idle(msg_id))
    finally:
        client.stop_channels()
    page = await transcript(kernel_id, parent=msg_id, msg_type="stream", limit=10000)
    recorded: dict[str, str] = {}
    for record in page["records"]:
        name = record["content"]["name"]
        recorded[name] = recorded.get(name, "") + record["content"]["text"]
    assert set(direct) == {"stdout", "stderr"}
    assert recorded == direct
    assert via_ws.text("stdout") == direct["stdout"]
    assert via_ws.text("stderr") == direct["stderr"]
    # The text view is both streams, interleaved as the kernel sent them: in seq order.
    text = await transcript(kernel_id, format="text", parent=msg_id)
    assert text == "".join(record["content"]["text"] for record in page["records"])


async def test_transcript_parameters(start_kernel: Any, connect: Any, transcript: Any) -> None:
    kernel_id = await start_kernel()
    ws = await connect(kernel_id)
    first = ws.execute("print('one')")
    await ws.until_idle(first)
    second = ws.execute("print('two')\n3")
    await ws.until_idle(second)
    full = await transcript(kernel_id, limit=10000)
    assert full["running"] is True
    assert full["first_seq"] == 1
    assert full["discarded"] is None
    assert full["next_since"] == full["head"] == full["records"][-1]["seq"]
    record = full["records"][-1]
    assert set(record) >= {
        "seq",
        "time",
        "msg_type",
        "msg_id",
        "parent_msg_id",
        "content",
        "header",
    }
    only_second = await transcript(kernel_id, parent=second)
    assert {r["parent_msg_id"] for r in only_second["records"]} == {second}
    results = await transcript(kernel_id, msg_type="execute_result")
    assert [r["content"]["data"]["text/plain"] for r in results["records"]] == ["3"]
    two_types = await transcript(kernel_id, msg_type=("stream", "execute_result"), parent=second)
    assert [r["msg_type"] for r in two_types["records"]] == ["stream", "execute_result"]
    page = await transcript(kernel_id, since=2, limit=3)
    assert [r["seq"] for r in page["records"]] == [3, 4, 5]
    assert page["next_since"] == 5
    assert await transcript(kernel_id, format="text", parent=first) == "one\n"
    # Without a parent, text the kernel wrote on its own (start-up warnings) comes too.
    assert (await transcript(kernel_id, format="text")).endswith("one\ntwo\n")


@pytest.mark.parametrize(
    ("params", "status", "reason"),
    [
        ({"since": "x"}, 400, "bad_request"),
        ({"since": "-4"}, 400, "bad_request"),
        ({"since": "999999"}, 400, "since_ahead_of_head"),
        ({"limit": "0"}, 400, "bad_request"),
        ({"limit": "100001"}, 400, "bad_request"),
        ({"format": "xml"}, 400, "bad_request"),
    ],
)
async def test_bad_parameters_get_400_with_a_reason(
    start_kernel: Any, jp_fetch: Any, params: dict[str, str], status: int, reason: str
) -> None:
    """Invariant 8: bad parameters get a 4xx and a JSON reason."""
    kernel_id = await start_kernel()
    with pytest.raises(HTTPClientError) as error:
        await jp_fetch("api", "kernels", kernel_id, "transcript", params=params)
    assert error.value.code == status
    body = json.loads(error.value.response.body)
    assert body["reason"] == reason
    assert body["message"]


async def test_unknown_kernel_gets_404(jp_fetch: Any) -> None:
    for kernel_id in ("00000000-0000-0000-0000-000000000000", "not-a-uuid"):
        with pytest.raises(HTTPClientError) as error:
            await jp_fetch("api", "kernels", kernel_id, "transcript")
        assert error.value.code == 404
        assert json.loads(error.value.response.body)["reason"] == "unknown_kernel"


async def test_transcript_needs_auth(start_kernel: Any, jp_fetch: Any) -> None:
    kernel_id = await start_kernel()
    with pytest.raises(HTTPClientError) as error:
        await jp_fetch(
            "api", "kernels", kernel_id, "transcript", headers={"Authorization": "token wrong"}
        )
    assert error.value.code == 403
