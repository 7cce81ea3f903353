"""One client of the Jupyter kernel WebSocket, the same code for every system.

It speaks both protocols (legacy JSON and ``v1.kernel.websocket.jupyter.org``) and counts
the output lines of one execution with :class:`Tally`, which checks that they arrive
complete and in order: the firehose kernel and the print loops number their lines.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from jupyter_server.services.kernels.connection.base import (
    deserialize_msg_from_ws_v1,
    serialize_msg_to_ws_v1,
)
from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from .systems import TOKEN

V1 = "v1.kernel.websocket.jupyter.org"


def execute_request(code: str, session: str) -> dict[str, Any]:
    header = {
        "msg_id": uuid.uuid4().hex,
        "msg_type": "execute_request",
        "session": session,
        "username": "bench",
        "version": "5.3",
        "date": "",
    }
    content = {
        "code": code,
        "silent": False,
        "store_history": False,
        "user_expressions": {},
        "allow_stdin": False,
        "stop_on_error": True,
    }
    return {"header": header, "parent_header": {}, "metadata": {}, "content": content}


class Channels:
    """One WebSocket on ``/api/kernels/{id}/channels``."""

    def __init__(self, ws: WebSocketClientConnection, protocol: str, session: str) -> None:
        self.ws = ws
        self.protocol = protocol
        self.session = session

    @classmethod
    async def connect(
        cls,
        port: int,
        kernel_id: str,
        protocol: str = "v1",
        *,
        session: str | None = None,
        since: int | None = None,
    ) -> Channels:
        session = session or uuid.uuid4().hex
        url = f"ws://127.0.0.1:{port}/api/kernels/{kernel_id}/channels?session_id={session}"
        if since is not None:
            url += f"&since={since}"
        request = HTTPRequest(
            url,
            headers={"Authorization": f"token {TOKEN}"},
            connect_timeout=120,
            request_timeout=120,
        )
        ws = await websocket_connect(request, subprotocols=[V1] if protocol == "v1" else None)
        return cls(ws, protocol, session)

    def execute(self, code: str) -> str:
        message = execute_request(code, self.session)
        if self.protocol == "v1":
            keys = ("header", "parent_header", "metadata", "content")
            parts = [json.dumps(message[key]).encode() for key in keys]
            self.ws.write_message(serialize_msg_to_ws_v1(parts, "shell"), binary=True)
        else:
            self.ws.write_message(json.dumps({**message, "channel": "shell", "buffers": []}))
        msg_id: str = message["header"]["msg_id"]
        return msg_id

    async def read(self) -> dict[str, Any] | None:
        """The next message, decoded far enough to count it; None once closed."""
        data = await self.ws.read_message()
        if data is None:
            return None
        if self.protocol == "v1":
            channel, parts = deserialize_msg_from_ws_v1(data)
            return {
                "channel": channel,
                "header": json.loads(parts[0]),
                "parent_header": json.loads(parts[1]),
                "metadata": json.loads(parts[2]),
                "content": json.loads(parts[3]),
            }
        message: dict[str, Any] = json.loads(data)
        return message

    def close(self) -> None:
        self.ws.close()


class Tally:
    """The stdout lines of one execution, each starting with its index: complete, in order?

    Per message it costs two string searches and two ``int()``s, however many lines a
    coalesced message holds, so the client is cheap next to the server it measures.
    """

    __slots__ = (
        "done",
        "done_at",
        "first_at",
        "frames",
        "gaps",
        "last_line",
        "last_seq",
        "lines",
        "msg_id",
        "next_index",
        "partial",
    )

    def __init__(self, msg_id: str) -> None:
        self.msg_id = msg_id
        self.lines = 0
        self.frames = 0
        self.next_index = 0
        self.gaps = 0
        self.first_at: float | None = None
        self.done_at: float | None = None
        self.done = False
        self.last_line = ""
        self.partial = ""
        #: This gateway's sequence number of the last message (its metadata), if any.
        self.last_seq: int | None = None

    def feed(self, message: dict[str, Any]) -> bool:
        """Count ``message``; True once the execution's ``idle`` status has arrived."""
        seq = message["metadata"].get("kernel_gateway_stream", {}).get("seq")
        if seq is not None:
            self.last_seq = seq
        if message["parent_header"].get("msg_id") != self.msg_id:
            return False
        msg_type = message["header"]["msg_type"]
        if msg_type == "stream" and message["content"]["name"] == "stdout":
            self.count(message["content"]["text"])
        elif msg_type == "status" and message["content"]["execution_state"] == "idle":
            self.done = True
            self.done_at = time.perf_counter()
        return self.done

    def count(self, text: str) -> None:
        # A kernel may flush a line in two messages: count whole lines only.
        if self.partial:
            text = self.partial + text
        cut = text.rfind("\n") + 1
        self.partial = text[cut:]
        text = text[:cut]
        lines = text.count("\n")
        if not lines:
            return
        if self.first_at is None:
            self.first_at = time.perf_counter()
        self.frames += 1
        last_start = text.rfind("\n", 0, len(text) - 1) + 1
        self.lines += lines
        self.last_line = text[last_start:]
        first, last = _index(text[: text.index("\n")]), _index(self.last_line)
        if first is None or last is None:
            return  # not numbered (a warm-up)
        if first != self.next_index or last != first + lines - 1:
            self.gaps += 1
        self.next_index = last + 1


def _index(line: str) -> int | None:
    try:
        return int(line.split(" ", 1)[0])
    except ValueError:
        return None


async def follow(channels: Channels, tally: Tally) -> Tally:
    """Read until ``tally`` is done or the socket closes. Callers bound it with a timeout
    (:func:`follow_all`); what was counted until then stays in ``tally``."""
    while not tally.done:
        message = await channels.read()
        if message is None:
            break
        tally.feed(message)
    return tally


async def follow_all(pairs: list[tuple[Channels, Tally]], timeout: float) -> bool:
    """Follow every client at once; False if some were not done within ``timeout``."""
    tasks = [asyncio.ensure_future(follow(channels, tally)) for channels, tally in pairs]
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    return not pending
