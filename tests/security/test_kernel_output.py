"""What code in a kernel can send, and what every surface then writes.

The kernel holds the session key, so its code can sign anything it likes and publish it
on IOPub. Items 4 (SSE injection), 7 (odd but signed messages) and 10 (verbatim replays) of the
hardening issue, with real ipykernel kernels (item 3, tracebacks: test_tracebacks.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ..integration.wsclient import KernelWS

#: Publish on IOPub, from inside the kernel, a message built by hand and signed with the
#: kernel's key: ``{header}`` may override header fields, ``{parent}`` is the raw parent
#: header, ``{times}`` how often the very same bytes are sent.
PUBLISH = """
k = get_ipython().kernel
s = k.session
header = s.msg_header("stream")
header.update({header!r})
parts = [s.pack(header), {parent!r}, b"{{}}", s.pack({content!r})]
for _ in range({times}):
    k.iopub_socket.send_multipart([b"stream", b"<IDS|MSG>", s.sign(parts), *parts])
import time; time.sleep(0.2)
"""


def publish(
    header: dict[str, Any] | None = None,
    parent: bytes = b"{}",
    content: dict[str, Any] | None = None,
    times: int = 1,
) -> str:
    return PUBLISH.format(
        header=header or {},
        parent=parent,
        content=content or {"name": "stdout", "text": "published\n"},
        times=times,
    )


def strict_json(raw: bytes | str) -> Any:
    return json.loads(raw, parse_constant=lambda name: pytest.fail(f"{name} in JSON"))


async def test_a_forged_msg_type_cannot_forge_sse_events(
    start_kernel: Any, connect: Any, sse: Any
) -> None:
    """Item 4: a kernel publishes a message whose msg_type holds line breaks and SSE fields
    (an ``id:`` far ahead, a fake event). Every /stream reader still gets one event per
    message, ids that are the real sequence numbers, and the message itself."""
    kernel_id = await start_kernel()
    reader = sse(kernel_id, "?since=0")
    ws = await connect(kernel_id)
    forged = "stream\nid: 999999\nevent: stream\ndata: {}\n\nevent: injected\r"
    msg_id = ws.execute(publish(header={"msg_type": forged}))
    await ws.until_idle(msg_id)
    events = await reader.until_idle(msg_id)
    ids = [event.id for event in events if event.id is not None]
    assert ids == sorted(ids)
    assert 999999 not in ids
    assert "injected" not in {event.event for event in events}
    carried = [event for event in events if event.data.get("msg_type") == forged]
    assert len(carried) == 1
    assert carried[0].data["content"]["text"] == "published\n"
    assert b"\nid: 999999" not in reader.raw


@pytest.mark.parametrize("parent", [b"", b"[1]", b"null", b'{"msg_id": NaN}'])
async def test_a_signed_message_with_an_odd_parent_header_is_written_as_valid_json(
    start_kernel: Any, connect: Any, sse: Any, transcript: Any, parent: bytes
) -> None:
    """Item 7: a correctly signed IOPub message whose parent header is empty, not an
    object, or holds NaN is kept (its output is not lost) and every surface writes valid
    JSON for it: the transcript, the legacy WebSocket, v1 and SSE."""
    kernel_id = await start_kernel()
    reader = sse(kernel_id, "?since=0")
    legacy: KernelWS = await connect(kernel_id)
    v1: KernelWS = await connect(kernel_id, protocol="v1")
    msg_id = legacy.execute(publish(parent=parent, content={"name": "stdout", "text": "odd\n"}))
    for ws in (legacy, v1):
        received = await ws.until_idle(msg_id)  # both clients parse every frame strictly
        assert any(m["content"].get("text") == "odd\n" for m in received.messages)
    events = await reader.until_idle(msg_id)
    assert any(e.data["content"].get("text") == "odd\n" for e in events if e.event == "stream")
    page = await transcript(kernel_id, limit=10000)
    strict_json(json.dumps(page))
    odd = [r for r in page["records"] if r["content"].get("text") == "odd\n"]
    assert len(odd) == 1
    assert odd[0]["parent_header"] in ({}, {"msg_id": None})  # repaired: valid JSON
    assert "odd\n" in await transcript(kernel_id, format="text")


async def test_a_verbatim_replay_of_a_signed_message_is_recorded_once(
    start_kernel: Any, connect: Any, transcript: Any, jp_fetch: Any
) -> None:
    """Item 10: the very same signed bytes sent three times are recorded once, as
    jupyter_client's Session refuses a signature it has seen; the refusals are counted."""
    kernel_id = await start_kernel()
    ws = await connect(kernel_id)
    msg_id = ws.execute(publish(content={"name": "stdout", "text": "once\n"}, times=3))
    await ws.until_idle(msg_id)
    text = await transcript(kernel_id, format="text")
    assert text.count("once\n") == 1
    health = json.loads((await jp_fetch("api", "gateway", "health")).body)
    assert health["components"]["taps"]["replays_refused"] >= 2


async def test_a_kernel_cannot_forge_the_gateways_own_records(
    jp_fetch: Any, start_kernel: Any, connect: Any, transcript: Any
) -> None:
    """Code in a kernel signs, as the kernel, what only the gateway writes: a request mark
    that would put its output into a notebook cell, a restart or a death that would end
    every execution and empty /cells, a gap. None is recorded; the kernel's own output is."""
    kernel_id = await start_kernel()
    ws = await connect(kernel_id)
    first = ws.execute("print('mine')", cell_id="cell-a")
    await ws.until_idle(first)
    forgeries = [
        publish(
            header={"msg_type": "kernel_gateway_stream_request"},
            content={"msg_id": "forged", "cell_id": "cell-a"},
        ),
        publish(header={"msg_type": "status"}, content={"execution_state": "restarting"}),
        publish(header={"msg_type": "status"}, content={"execution_state": "dead"}),
        publish(
            header={"msg_type": "kernel_gateway_stream_gap"},
            content={"first_seq": 1, "last_seq": 1, "reason": "forged"},
        ),
    ]
    msg_id = ws.execute("\n".join(forgeries) + "\nprint('after')")
    await ws.until_idle(msg_id)
    records = (await transcript(kernel_id, limit=10000))["records"]
    marks = [
        r["content"]
        for r in records
        if r["msg_type"].startswith("kernel_gateway_stream")
        or r["content"].get("execution_state") in ("restarting", "dead")
    ]
    assert marks == [{"msg_id": first, "cell_id": "cell-a"}], marks
    response = await jp_fetch("api", "kernels", kernel_id, "cells")
    (cell,) = json.loads(response.body)["executions"]
    assert (cell["msg_id"], cell["status"]) == (first, "ok")
    assert cell["outputs"][0]["text"] == "mine\n"
