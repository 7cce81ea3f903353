"""``GET /api/kernels/{id}/stream``: a kernel's IOPub as Server-Sent Events.

Each event's ``id:`` is the sequence number of the last message it carries, ``event:`` its
msg_type and ``data:`` the message as JSON (the legacy wire form, with the sequence range in
``metadata["kernel_gateway_stream"]``); ``stream`` events are coalesced as on the channels
socket. Resume with the ``Last-Event-ID`` header or ``?since=SEQ``: every message after it,
then live, with no gap or duplicate. Filters: ``parent`` (one execution's msg_id) and
``msg_type`` (repeatable or comma-separated).

A comment line every ``GatewayStreamApp.sse_heartbeat_interval`` seconds keeps proxies from
closing a quiet stream. The stream ends with a last event of its own:

* ``slow_consumer`` ``{"reason", "last_seq"}``: the reader fell too far behind; resume
  with ``Last-Event-ID: last_seq``.
* ``kernel_shutdown`` ``{}``: the kernel shut down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.ioloop import PeriodicCallback
from tornado.iostream import StreamClosedError

from ..broker.base import Subscriber, TransportClosed
from ..core.errors import LocalError, SequenceAhead, UnknownKernel
from ..core.frames import Frame
from ..core.subscription import Overflow
from ..core.wire import Protocol, encode_sse
from .common import ServicesMixin, discarded_notice, no_delay, parse_msg_types, parse_seq

__all__ = ["StreamHandler"]

CONTENT_TYPE = "text/event-stream"


class StreamHandler(ServicesMixin, APIHandler):
    """One SSE reader of one kernel; also its Subscriber's transport."""

    #: How frames are written: the full message (``SSE``) or normalized (``EXECUTION``).
    encoding = Protocol.SSE
    _streaming = False
    _ended = False

    @web.authenticated
    @authorized
    async def get(self, kernel_id: str) -> None:
        last_event_id = self.request.headers.get("Last-Event-ID")
        try:
            since = parse_seq("since", self.get_argument("since", None) or last_event_id)
            msg_types = parse_msg_types(self.get_arguments("msg_type"))
            parent = self.get_argument("parent", None) or None
            subscriber = await self._subscribe(kernel_id, since, parent, msg_types)
        except LocalError as error:
            self.write_error_json(error)
            return
        await self._stream(since, subscriber)

    async def _stream(self, since: int | None, subscriber: Subscriber) -> None:
        """Send the events until the stream ends (the reader leaves, or an end event)."""
        self._streaming = True
        self._done = asyncio.Event()
        self.set_header("Content-Type", CONTENT_TYPE)
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")  # nginx: do not buffer the stream
        no_delay(self)
        self.flush()
        heartbeat = PeriodicCallback(self._heartbeat, self.services.sse_heartbeat * 1000)
        heartbeat.start()
        try:
            await subscriber.start(since)
            await self._done.wait()
        finally:
            heartbeat.stop()
            subscriber.close()
        if not self._finished:
            with contextlib.suppress(StreamClosedError):  # the reader may be gone already
                self.finish()

    async def _subscribe(
        self,
        kernel_id: str,
        since: int | None,
        parent: str | None,
        msg_types: frozenset[str] | None,
    ) -> Subscriber:
        if kernel_id not in self.kernel_manager:
            raise UnknownKernel(kernel_id)
        tap = await self.services.taps.ensure(kernel_id)
        if since is not None and since > tap.head:
            raise SequenceAhead(since, tap.head)
        queue = self.services.new_queue(since or 0, parent=parent, msg_types=msg_types)
        broker, store = self.services.broker, self.services.store
        self.subscriber = Subscriber(kernel_id, broker, store, self, queue)
        return self.subscriber

    def finish(self, *args: Any, **kwargs: Any) -> Any:
        if self._streaming:
            kwargs.setdefault("set_content_type", CONTENT_TYPE)
        return super().finish(*args, **kwargs)

    def on_connection_close(self) -> None:
        self._ended = True
        if self._streaming:
            self._done.set()

    # -- Transport -------------------------------------------------------------------

    def is_open(self) -> bool:
        return not self._ended and not self._finished

    async def send(self, frames: list[Frame]) -> None:
        try:
            for frame in frames:
                self.write(frame.encode(self.encoding)[0])
            await self.flush()
        except StreamClosedError as error:
            self._end()
            raise TransportClosed from error
        await self.after_send(frames)

    async def after_send(self, frames: list[Frame]) -> None:
        """Called after each batch of frames is flushed; subclasses may end the stream."""

    def discarded(self, first_seq: int, last_seq: int) -> Frame | None:
        return discarded_notice(first_seq, last_seq, "")

    def overflowed(self, overflow: Overflow) -> None:
        self._final("slow_consumer", {"reason": overflow.reason, "last_seq": overflow.last_seq})

    def kernel_gone(self) -> None:
        self._final("kernel_shutdown", {})

    def _final(self, event: str, data: dict[str, Any]) -> None:
        if self.is_open():
            self.write(encode_sse(event, None, json.dumps(data).encode()))
        self._end()

    def _end(self) -> None:
        self._ended = True
        self._done.set()

    def _heartbeat(self) -> None:
        if self.is_open():
            self.write(b": keepalive\n\n")
            self.flush()
