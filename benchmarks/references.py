"""The physical-limit references: what a client gets straight from the kernel, no server.

- *direct ZMQ*: jupyter_client's own client on the kernel's sockets (loss and latency).
- *floor loop*: the least a Python IOPub reader that records and serves must do per
  message (throughput): receive it on a SUB socket of its own, check its HMAC, parse its
  header, parent header and content with orjson, append it to a list, and send it to one
  client as one WebSocket frame. Its CPU per message is the floor issue 23 measures the
  gateway against.
- *sequential file read*: the bytes of a transcript read back from a plain file (replay).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import socket
import threading
import time
from pathlib import Path
from typing import Any, TypeVar

import orjson
import zmq
import zmq.asyncio
from jupyter_client.manager import AsyncKernelManager

from kernel_gateway_stream.core.wire import websocket_frame

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

    async def run_floor(self, code: str, tally: T, timeout: float = 600) -> tuple[T, float]:
        """Execute ``code`` and read its output with the floor loop (:func:`floor_loop`):
        the tally, and the CPU seconds the loop's thread spent."""
        sub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.manager._make_url("iopub"))
        try:
            while True:  # as _until_subscribed, with a blocking socket polled off the loop
                self.client.kernel_info()
                if await asyncio.to_thread(sub.poll, 200):
                    while sub.poll(50):
                        sub.recv_multipart()
                    break
            tally.msg_id = self.client.execute(code)
            key = self.manager.session.key
            cpu = await asyncio.to_thread(floor_loop, sub, key, tally, timeout)
        finally:
            sub.close(linger=0)
        return tally, cpu

    async def _until_subscribed(self, sub: zmq.asyncio.Socket) -> None:
        """A PUB drops what it sends before the subscription arrives: ask for kernel_info
        until IOPub answers."""
        while True:
            self.client.kernel_info()
            if await sub.poll(200):
                while await sub.poll(50):
                    await sub.recv_multipart()
                return


def floor_loop(sub: zmq.Socket[bytes], key: bytes, tally: Tally, timeout: float) -> float:
    """Read ``tally``'s execution off ``sub`` until its ``idle``, doing per message what
    the gateway must at least do, in the cheapest plain Python: check the HMAC (a keyed
    hashlib state copied per message), parse the header, parent header and content with
    orjson, append the message to a list (its record), and send it, spliced from its JSON
    parts, as one WebSocket text frame on a loopback TCP connection that a thread drains.
    Returns the CPU seconds this thread spent (``time.thread_time``), the drain excluded."""
    if len(key) > 64:  # RFC 2104: a key longer than the block is hashed first
        key = hashlib.sha256(key).digest()
    inner = hashlib.sha256(bytes(b ^ 0x36 for b in key.ljust(64, b"\0")))
    outer = hashlib.sha256(bytes(b ^ 0x5C for b in key.ljust(64, b"\0")))
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    server.close()
    drain = threading.Thread(target=_drain, args=(peer,), daemon=True)
    drain.start()
    records: list[list[bytes]] = []
    deadline = time.perf_counter() + timeout
    started = time.thread_time()
    try:
        while not tally.done and time.perf_counter() < deadline:
            if not sub.poll(100):
                continue
            parts = sub.recv_multipart()
            at = parts.index(DELIMITER)
            mac = inner.copy()
            for part in parts[at + 2 : at + 6]:
                mac.update(part)
            digest = outer.copy()
            digest.update(mac.digest())
            if not hmac.compare_digest(digest.hexdigest().encode(), parts[at + 1]):
                continue
            header = orjson.loads(parts[at + 2])
            parent = orjson.loads(parts[at + 3])
            content = orjson.loads(parts[at + 5])
            records.append(parts)
            payload = b"".join(
                (
                    b'{"channel":"iopub","header":',
                    parts[at + 2],
                    b',"parent_header":',
                    parts[at + 3],
                    b',"metadata":',
                    parts[at + 4],
                    b',"content":',
                    parts[at + 5],
                    b"}",
                )
            )
            client.sendall(websocket_frame(payload, binary=False))
            if parent.get("msg_id") != tally.msg_id:
                continue
            if header["msg_type"] == "stream":
                tally.count(content["text"])
            elif header["msg_type"] == "status" and content["execution_state"] == "idle":
                tally.done = True
                tally.done_at = time.perf_counter()
        return time.thread_time() - started
    finally:
        client.close()
        drain.join(timeout=10)
        peer.close()


def _drain(peer: socket.socket) -> None:
    """Read and drop everything the floor loop sends, until it closes."""
    while peer.recv(1 << 20):
        pass


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
