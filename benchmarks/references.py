"""The physical-limit references: what a client gets straight from the kernel, no server.

- *direct ZMQ*: jupyter_client's own client on the kernel's sockets (loss and latency).
- *bare pyzmq SUB*: one SUB socket with no receive limit reading the kernel's IOPub, parsing
  only each header (throughput).
- *sequential file read*: the bytes of a transcript read back from a plain file (replay).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TypeVar

import zmq
import zmq.asyncio
from jupyter_client.manager import AsyncKernelManager

from .wsclient import Tally

DELIMITER = b"<IDS|MSG>"
T = TypeVar("T", bound=Tally)


class DirectKernel:
    """A kernel started by jupyter_client in this process, with its client."""

    def __init__(self, kernel_name: str = "python3") -> None:
        self.manager = AsyncKernelManager(kernel_name=kernel_name)
        self.client: Any = None

    async def __aenter__(self) -> DirectKernel:
        await self.manager.start_kernel()
        self.client = self.manager.client()
        self.client.start_channels()
        await self.client.wait_for_ready(timeout=60)
        return self

    async def __aexit__(self, *_: object) -> None:
        self.client.stop_channels()
        await self.manager.shutdown_kernel(now=True)

    async def run(self, code: str, tally: T, timeout: float = 600) -> T:
        """Execute ``code`` and count its output through jupyter_client's IOPub channel."""
        tally.msg_id = self.client.execute(code)
        while not tally.done:
            message = await self.client.get_iopub_msg(timeout=timeout)
            message.setdefault("metadata", {})
            tally.feed(message)
        return tally

    async def run_bare(self, code: str, tally: T, timeout: float = 600) -> T:
        """Execute ``code`` and count its output on a bare SUB socket of our own."""
        context = zmq.asyncio.Context.instance()
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.manager._make_url("iopub"))
        try:
            await self._until_subscribed(sub)
            tally.msg_id = self.client.execute(code)
            await _read_bare(sub, tally, timeout)
        finally:
            sub.close(linger=0)
        return tally

    async def _until_subscribed(self, sub: zmq.asyncio.Socket) -> None:
        """A PUB drops what it sends before the subscription arrives: ask for kernel_info
        until IOPub answers."""
        while True:
            self.client.kernel_info()
            if await sub.poll(200):
                while await sub.poll(50):
                    await sub.recv_multipart()
                return


async def _read_bare(sub: zmq.asyncio.Socket, tally: Tally, timeout: float) -> None:
    deadline = time.perf_counter() + timeout
    while not tally.done and time.perf_counter() < deadline:
        parts = await sub.recv_multipart(copy=True)
        at = parts.index(DELIMITER)
        header = json.loads(parts[at + 2])
        parent = json.loads(parts[at + 3])
        if parent.get("msg_id") != tally.msg_id:
            continue
        if header["msg_type"] == "stream":
            tally.count(json.loads(parts[at + 5])["text"])
        elif header["msg_type"] == "status" and b'"idle"' in parts[at + 5]:
            tally.done = True
            tally.done_at = time.perf_counter()


def sequential_read(path: Path, chunk: int = 1 << 16) -> tuple[float, float]:
    """Seconds to the first chunk and to the end of a plain sequential read of ``path``."""
    started = time.perf_counter()
    first = 0.0
    with open(path, "rb", buffering=0) as file:
        while data := file.read(chunk):
            if not first:
                first = time.perf_counter() - started
            del data
    return first, time.perf_counter() - started
