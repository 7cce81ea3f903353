"""Item 19: a reply in flight when a client drops reaches it when it comes back.

A client that drops and returns with the same ``session_id`` got the output it missed
but never the ``execute_reply`` (or any shell, control or stdin message) sent while it
was away: the gateway closed the connection's kernel sockets at disconnect. In
JupyterLab the cell then showed ``[*]`` for ever. The session's channels now outlive a
disconnect for a grace period, hold (a bounded number of) replies, and hand them over
on reconnect in order with the replayed output.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..integration.wsclient import KernelWS


async def test_an_execute_reply_sent_while_the_client_was_away_arrives_on_reconnect(
    start_kernel: Any, connect: Any
) -> None:
    kernel_id = await start_kernel()
    for protocol in ("legacy", "v1"):
        session = f"notebook-{protocol}"
        first: KernelWS = await connect(kernel_id, session_id=session, protocol=protocol)
        msg_id = first.execute("import time\nprint('before')\ntime.sleep(1)\nprint('after')")
        await first.until_lines(1)
        first.close()
        await first.drain_until_closed()
        await asyncio.sleep(2)  # the execution finishes while nobody is connected
        second: KernelWS = await connect(kernel_id, session_id=session, protocol=protocol)
        received = await second.until_idle(msg_id)
        assert "after\n" in received.text()
        # The reply is placed where it came among the kernel's output: the kernel sends it
        # on shell, its idle on IOPub, in either order.
        replies = [m for m in received.messages if m["msg_type"] == "execute_reply"]
        reply = replies[0] if replies else None
        while reply is None:
            message = await second.receive(timeout=10)
            assert message is not None
            if message["msg_type"] == "execute_reply":
                reply = message
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"]["status"] == "ok"
        assert reply["channel"] == "shell"
        # Only once.
        replies = [m for m in second.history if m["msg_type"] == "execute_reply"]
        assert len(replies) == 1
        second.close()


async def test_replies_for_a_client_that_never_returns_are_dropped_after_the_grace(
    start_kernel: Any, connect: Any, services: Any
) -> None:
    """The held channels are bounded: after the grace period they are closed, and a
    client returning later gets the output from the transcript but no stale reply."""
    services.sessions.grace = 0.5
    kernel_id = await start_kernel()
    first: KernelWS = await connect(kernel_id, session_id="gone")
    msg_id = first.execute("print('x')")
    first.close()
    await first.drain_until_closed()
    await asyncio.sleep(3)
    assert f"{kernel_id}:gone" not in services.sessions.held()
    second: KernelWS = await connect(kernel_id, session_id="gone")
    received = await second.until_idle(msg_id)
    assert received.text() == "x\n"
    second.close()


async def test_sessions_held_for_absent_clients_are_bounded(
    start_kernel: Any, connect: Any, services: Any
) -> None:
    """A client that connects again and again under new session ids, sending a request
    each time (so each session holds three kernel sockets), keeps at most ``max_away``
    sessions held: the one away longest closes first, and its sockets with it."""
    services.sessions.max_away = 2
    evicted = services.sessions.evicted
    kernel_id = await start_kernel()
    for name in ("a", "b", "c"):
        ws: KernelWS = await connect(kernel_id, session_id=name)
        await ws.until_idle(ws.execute(f"print({name!r})"))
        ws.close()
        await ws.drain_until_closed()
    deadline = asyncio.get_running_loop().time() + 10
    while f"{kernel_id}:a" in services.sessions.held():
        assert asyncio.get_running_loop().time() < deadline, "the oldest session stays held"
        await asyncio.sleep(0.05)
    assert services.sessions.held() == [f"{kernel_id}:b", f"{kernel_id}:c"]
    assert services.sessions.evicted == evicted + 1
    # The session that was closed early still resumes its output from the transcript.
    back: KernelWS = await connect(kernel_id, session_id="a", since=0)
    received = await back.until_lines(1)
    assert "a\n" in received.text()
    back.close()
