"""Every reply to a client's requests reaches it, however its requests and the kernel's
replies cross.

A client session's shell, control and stdin DEALERs are read by ZMQStreams, woken by each
socket's edge-triggered notification fd, and written to straight (not through the stream's
send queue). A send takes the fd's edge: a reply that arrived meanwhile sat in the socket
with the fd quiet, and neither it nor any later reply was ever read. JupyterLab showed it:
after a page load, no ``history_reply`` and no ``create_subshell_reply`` came (its widget
comms then stayed on the main shell), in about one page load in four. Here a real
ipykernel answers bursts of requests sent while its replies arrive, session after session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from typing import Any

from jupyter_client.manager import AsyncKernelManager
from jupyter_client.session import Session

from kernel_gateway_stream.core.messages import KernelMessage
from kernel_gateway_stream.kernels.zmq_kernel import KernelSockets

from ..timing import seconds
from .waits import wait_until

SESSIONS = 30
REQUESTS = 40
#: Requests sent in one go before the loop turns (and replies come in between).
BURST = 4


async def test_every_reply_to_a_burst_of_requests_reaches_the_session() -> None:
    manager = AsyncKernelManager(kernel_name="python3")
    await manager.start_kernel()
    sockets = KernelSockets()
    try:
        info = {
            name: value.decode() if isinstance(value, bytes) else value
            for name, value in manager.get_connection_info(session=False).items()
        }
        link = sockets.link(
            "replies",
            lambda: info,
            key=manager.session.key,
            signature_scheme=manager.session.signature_scheme,
            log=logging.getLogger("test_channel_replies"),
        )
        for index in range(SESSIONS):
            session_id = str(uuid.uuid4())
            session = Session(key=manager.session.key, session=session_id)
            replies: list[tuple[str, str]] = []

            def received(channel: str, message: KernelMessage, into: Any = replies) -> None:
                into.append((channel, message.msg_type))

            channels = link.channels(session_id.encode(), received, handshake_timeout=seconds(5))
            try:
                await asyncio.wait_for(channels.ready, seconds(10))
                for number in range(REQUESTS):
                    request = session.msg("kernel_info_request", {})
                    parts = [
                        json.dumps(request[part], default=str).encode()
                        for part in ("header", "parent_header", "metadata", "content")
                    ]
                    channels.send(("control", "shell")[number % 2], parts)
                    if number % BURST == BURST - 1:
                        await asyncio.sleep(0.001)
                with contextlib.suppress(AssertionError):  # timed out: said below
                    await wait_until(
                        lambda into=replies: len(into) >= REQUESTS,  # type: ignore[misc]
                        "every reply",
                        timeout=5,
                    )
                assert len(replies) == REQUESTS, (
                    f"session {index} of {SESSIONS}: {len(replies)} replies of {REQUESTS}"
                )
                assert sorted(replies) == sorted(
                    [("control", "kernel_info_reply"), ("shell", "kernel_info_reply")]
                    * (REQUESTS // 2)
                )
            finally:
                channels.close()
    finally:
        sockets.close()
        await manager.shutdown_kernel(now=True)
