"""The fault harness's recorders (tests/faults/harness.py): what one client of one node
gets, as the checker reads it (tests/faults/checker.py), and the transcript the same way."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from kernel_gateway_stream.core.marks import GAP_MSG_TYPE
from kernel_gateway_stream.core.wire import SEQ_METADATA_KEY

from ..integration.daemon import Daemon
from ..integration.wsclient import KernelWS
from .checker import Closed, Delivery, Event, Gap, History

__all__ = ["Recorder", "transcript_history"]


class Recorder:
    """One client of one node: every numbered message, gap and close, across
    reconnections (each resumes with ``since`` the last seq it got)."""

    def __init__(self, name: str, node: Daemon, kernel_id: str, up: asyncio.Event) -> None:
        self.name = name
        self.node = node
        self.kernel_id = kernel_id
        self.up = up
        self.events: list[Event] = []
        self.last_seq = 0
        self.ws: KernelWS | None = None
        self.task = asyncio.ensure_future(self._run())

    def history(self) -> History:
        return History(self.name, tuple(self.events))

    def stop(self) -> None:
        self.task.cancel()
        if self.ws is not None:
            self.ws.close()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.up.wait()
            try:
                ws = await self.node.channels(self.kernel_id, since=self.last_seq or None)
            except Exception:  # down, or refusing under a fault: try again
                await asyncio.sleep(0.3)
                continue
            self.ws = ws
            try:
                while (message := await ws.receive(timeout=1e6)) is not None:
                    ws.history.clear()  # the recorder keeps what it needs
                    self._take(message, loop.time())
                self.events.append(Closed(ws.ws.close_code, ws.ws.close_reason, loop.time()))
            except Exception as error:  # the connection broke under a fault
                self.events.append(Closed(None, type(error).__name__, loop.time()))
            finally:
                self.ws = None
                ws.close()

    def _take(self, message: dict[str, Any], now: float) -> None:
        numbered = message["metadata"].get(SEQ_METADATA_KEY)
        if not numbered:
            return
        first, last = numbered["first_seq"], numbered["seq"]
        self.last_seq = max(self.last_seq, last)
        parent = message["parent_header"].get("msg_id") or ""
        event = _event(message["msg_type"], message["content"], first, last, parent, now)
        self.events.append(event)


def _event(
    msg_type: str, content: dict[str, Any], first: int, last: int, parent: str, now: float
) -> Event:
    if msg_type == GAP_MSG_TYPE:
        # No "lost": the range is what it says; "lost": null, an unknown number.
        lost = content.get("lost")
        stated = -1 if "lost" in content and lost is None else lost
        return Gap(content["first_seq"], content["last_seq"], content["reason"], stated, now)
    payload = content["text"] if msg_type == "stream" else json.dumps(content, sort_keys=True)
    return Delivery(first, last, msg_type, parent, payload, now)


def transcript_history(records: list[dict[str, Any]], offset: float) -> History:
    """The transcript's records as the checker reads them, each at the moment it was
    recorded (its ``time``, less ``offset``: the harness's clock)."""
    return History(
        "transcript",
        tuple(
            _event(
                r["msg_type"],
                r["content"],
                r["seq"],
                r["seq"],
                r["parent_msg_id"] or "",
                r["time"] - offset,
            )
            for r in records
        ),
    )
