"""A test client for the channels WebSocket, speaking either protocol.

It decodes what the server sends with jupyter_server's own codecs (not ours), so the
tests also check that we stay wire-compatible with jupyter_server's clients.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from jupyter_server.services.kernels.connection.base import (
    deserialize_binary_message,
    deserialize_msg_from_ws_v1,
    serialize_msg_to_ws_v1,
)
from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from kernel_gateway_stream.core.wire import SEQ_METADATA_KEY

from ..timing import SCALE, seconds

V1 = "v1.kernel.websocket.jupyter.org"


def describe(messages: list[dict[str, Any]]) -> str:
    """What arrived, in a line: how many messages of each type, and the last five."""
    counts: dict[str, int] = {}
    for m in messages:
        counts[m["msg_type"]] = counts.get(m["msg_type"], 0) + 1
    last = [
        (
            m["msg_type"],
            m["content"].get("execution_state") or m["content"].get("reason"),
            m["parent_header"].get("msg_id"),
        )
        for m in messages[-5:]
    ]
    return f"{len(messages)} messages {counts}, the last {last}"


@dataclass
class Received:
    """What one client got for one execution."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    #: When set, text() counts only this execution's output (a kernel also writes on its
    #: own, e.g. start-up warnings, with no parent).
    parent: str | None = None

    def text(self, name: str = "stdout") -> str:
        return "".join(
            m["content"]["text"]
            for m in self.messages
            if m["msg_type"] == "stream"
            and m["content"]["name"] == name
            and (self.parent is None or m["parent_header"].get("msg_id") == self.parent)
        )

    def seq_ranges(self) -> list[tuple[int, int]]:
        ranges = []
        for m in self.messages:
            seq = m["metadata"].get(SEQ_METADATA_KEY)
            if seq is not None:
                ranges.append((seq["first_seq"], seq["seq"]))
        return ranges


class KernelWS:
    """One channels connection."""

    def __init__(self, ws: WebSocketClientConnection, protocol: str, session_id: str) -> None:
        self.ws = ws
        self.protocol = protocol
        self.session_id = session_id
        #: Every message received on this connection, in order.
        self.history: list[dict[str, Any]] = []

    @classmethod
    async def open(
        cls,
        url: str,
        headers: dict[str, str],
        *,
        protocol: str = "legacy",
        session_id: str | None = None,
        since: int | None = None,
        compression: bool = False,
    ) -> KernelWS:
        """``compression``: offer permessage-deflate (the server uses it if configured to)."""
        session_id = session_id or uuid.uuid4().hex
        query = f"session_id={session_id}" + (f"&since={since}" if since is not None else "")
        request = HTTPRequest(f"{url}?{query}", headers=headers, connect_timeout=seconds(60))
        subprotocols = [V1] if protocol == "v1" else None
        ws = await websocket_connect(
            request, subprotocols=subprotocols, compression_options={} if compression else None
        )
        if protocol == "v1":
            assert ws.selected_subprotocol == V1
        return cls(ws, protocol, session_id)

    def send(
        self,
        channel: str,
        msg_type: str,
        content: dict[str, Any],
        metadata: dict[str, Any] | None = None,
        *,
        subshell_id: str | None = None,
    ) -> str:
        msg_id = uuid.uuid4().hex
        metadata = metadata or {}
        header = {
            "msg_id": msg_id,
            "msg_type": msg_type,
            "session": self.session_id,
            "username": "test",
            "version": "5.3",
            "date": "2026-01-01T00:00:00Z",
        }
        if subshell_id is not None:  # a kernel subshell's request (ipykernel 7, JEP 91)
            header["subshell_id"] = subshell_id
        if self.protocol == "v1":
            parts = [json.dumps(p).encode() for p in (header, {}, metadata, content)]
            self.ws.write_message(serialize_msg_to_ws_v1(parts, channel), binary=True)
        else:
            message = {
                "header": header,
                "parent_header": {},
                "metadata": metadata,
                "content": content,
                "channel": channel,
                "buffers": [],
            }
            self.ws.write_message(json.dumps(message))
        return msg_id

    def execute(
        self,
        code: str,
        *,
        allow_stdin: bool = False,
        cell_id: str | None = None,
        subshell_id: str | None = None,
        store_history: bool = True,
    ) -> str:
        """Send an execute_request; ``cell_id`` as JupyterLab sends it (``metadata.cellId``),
        on the subshell ``subshell_id`` if given."""
        return self.send(
            "shell",
            "execute_request",
            {
                "code": code,
                "silent": False,
                "store_history": store_history,
                "user_expressions": {},
                "allow_stdin": allow_stdin,
                "stop_on_error": True,
            },
            {"cellId": cell_id} if cell_id is not None else None,
            subshell_id=subshell_id,
        )

    async def receive(self, timeout: float = 60) -> dict[str, Any] | None:
        """The next message, decoded; None once the server closed the connection."""
        data = await asyncio.wait_for(self.ws.read_message(), seconds(timeout))
        if data is None:
            return None
        if self.protocol == "v1":
            assert isinstance(data, bytes)
            channel, parts = deserialize_msg_from_ws_v1(data)
            header, parent, metadata, content = (json.loads(p) for p in parts[:4])
            message = {
                "channel": channel,
                "header": header,
                "parent_header": parent,
                "metadata": metadata,
                "content": content,
                "buffers": parts[4:],
            }
        elif isinstance(data, bytes):
            message = deserialize_binary_message(data)
        else:
            message = json.loads(data)
        message["msg_type"] = message["header"]["msg_type"]
        self.history.append(message)
        return message

    async def until_idle(self, parent_msg_id: str, timeout: float = 120) -> Received:
        """Every message up to the ``idle`` status of ``parent_msg_id``."""
        received = Received(parent=parent_msg_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds(timeout)
        while True:
            try:
                # ``receive`` scales its argument: the time left, unscaled.
                message = await self.receive(max(0.1, deadline - loop.time()) / SCALE)
            except asyncio.TimeoutError:
                raise AssertionError(
                    f"no idle for {parent_msg_id} in {seconds(timeout):.0f} s: "
                    f"{describe(received.messages)}"
                ) from None
            assert message is not None, (
                f"connection closed before idle ({self.ws.close_code} {self.ws.close_reason}): "
                f"{describe(received.messages)}"
            )
            received.messages.append(message)
            if (
                message["msg_type"] == "status"
                and message["content"]["execution_state"] == "idle"
                and message["parent_header"].get("msg_id") == parent_msg_id
            ):
                return received

    async def until_lines(self, count: int) -> Received:
        """Messages until at least ``count`` lines of stdout have arrived."""
        received = Received()
        while len(received.text().splitlines()) < count:
            message = await self.receive()
            assert message is not None, "connection closed before enough output"
            received.messages.append(message)
        return received

    async def until_line_number(self, at_least: int, last: int) -> int:
        """Read a flood of numbered lines (``print(i)``) until its highest number is at
        least ``at_least``, or is ``last`` (the flood ended); return that number. Only the
        flood may print on stdout meanwhile."""
        highest = -1
        while highest < at_least and highest != last:
            message = await self.receive()
            assert message is not None, "connection closed before enough output"
            content = message["content"]
            if message["msg_type"] == "stream" and content["name"] == "stdout":
                highest = max([highest, *map(int, content["text"].split())])
        return highest

    async def drain_until_closed(self, timeout: float = 60) -> Received:
        """Read everything until the server's close frame."""
        received = Received()
        while True:
            message = await self.receive(timeout)
            if message is None:
                return received
            received.messages.append(message)

    def close(self) -> None:
        self.ws.close()
