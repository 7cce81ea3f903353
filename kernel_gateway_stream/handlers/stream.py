"""``GET /api/kernels/{id}/stream``: a kernel's IOPub as Server-Sent Events.

Each event's ``id:`` is the sequence number of the last message it carries, ``event:`` its
msg_type and ``data:`` the message as JSON (the legacy wire form, with the sequence range in
``metadata["kernel_gateway_stream"]``); ``stream`` events are coalesced as on the channels
socket. Resume with the ``Last-Event-ID`` header or ``?since=SEQ``: every message after it,
then live, with no gap or duplicate. Filters: ``parent`` (one execution's msg_id) and
``msg_type`` (repeatable or comma-separated).

A comment line every ``GatewayStreamApp.sse_heartbeat_interval`` seconds keeps proxies from
closing a quiet stream. The stream ends with a last event of its own, named after its
reason, with data ``{"reason", "last_seq"}`` (see :mod:`..core.endings`):
``slow_consumer`` (resume with ``Last-Event-ID: last_seq``), ``kernel_shutdown``,
``gateway_shutdown`` (the gateway is stopping; resume when it is back).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.ioloop import PeriodicCallback
from tornado.iostream import StreamClosedError

from ..broker.subscriber import Subscriber, TransportClosed
from ..core.endings import Ending
from ..core.errors import LocalError
from ..core.frames import Frame
from ..core.wire import Protocol
from .common import (
    KERNEL_ACTION,
    ServicesMixin,
    discarded_notice,
    no_delay,
    parse_msg_types,
    parse_seq,
    requires,
)

__all__ = ["SSEHandler", "StreamHandler"]

CONTENT_TYPE = "text/event-stream"
#: Seconds a stream that ended waits for its reader to take its last bytes before the
#: connection is closed anyway.
CLOSE_TIMEOUT = 5.0


class SSEHandler(ServicesMixin, APIHandler):
    """A Server-Sent Events response that follows one kernel; also its Subscriber's
    transport. Subclasses say which request starts it."""

    #: How frames are written: the full message (``SSE``) or normalized (``EXECUTION``).
    encoding = Protocol.SSE
    _streaming = False
    _ended = False
    #: Why the gateway ended the stream, if it did (for the log).
    _end_reason: str | None = None

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
        fields = {"kernel_id": subscriber.kernel_id, "surface": self.surface, "since": since}
        self.log.info("An %s client connected to kernel %s (%s)", self.surface,
                      subscriber.kernel_id,
                      "live" if since is None else f"resuming after seq {since}",
                      extra=fields)  # fmt: skip
        try:
            await subscriber.start(since)
            await self._done.wait()
        finally:
            heartbeat.stop()
            subscriber.close()
            reason = self._end_reason or "client_closed"
            self.log.info("An %s client of kernel %s left at seq %d (%s)", self.surface,
                          subscriber.kernel_id, subscriber.last_seq, reason,
                          extra={**fields, "last_seq": subscriber.last_seq,
                                 "reason": reason})  # fmt: skip
            if self._flushing is not None:
                self._flushing.cancel()
        if not self._finished:
            with contextlib.suppress(StreamClosedError):  # the reader may be gone already
                finished = self.finish()
                # A reader that does not read even its last event would keep the connection
                # and tornado's buffer for ever (WebSockets get tornado's close timeout).
                try:
                    await asyncio.wait_for(asyncio.shield(finished), CLOSE_TIMEOUT)
                except asyncio.TimeoutError:
                    connection: Any = self.request.connection
                    connection.stream.close()

    async def _subscribe(
        self,
        kernel_id: str,
        since: int | None,
        parent: str | None,
        msg_types: frozenset[str] | None,
    ) -> Subscriber:
        services = self.services
        await services.locate(kernel_id, since, running=True)
        queue = services.new_queue(since or 0, parent=parent, msg_types=msg_types)
        self.subscriber = Subscriber(
            kernel_id,
            services.broker,
            services.store,
            self,
            queue,
            limits=services.replay,
            registry=services.subscribers,
        )
        return self.subscriber

    def last_event_id(self) -> int | None:
        """Where to resume: the ``Last-Event-ID`` header or ``?since=``, whichever is later.
        A browser's EventSource keeps the URL it was opened with (``?since=0``, say) and
        sends the header when it reconnects: the header is the newer of the two.

        Raises:
            BadRequest: either is not a sequence number.
        """
        since = parse_seq("since", self.get_argument("since", None))
        header = parse_seq("Last-Event-ID", self.request.headers.get("Last-Event-ID"))
        if since is None or header is None:
            return header if since is None else since
        return max(since, header)

    def finish(self, *args: Any, **kwargs: Any) -> Any:
        if self._streaming:
            kwargs.setdefault("set_content_type", CONTENT_TYPE)
        return super().finish(*args, **kwargs)

    def on_connection_close(self) -> None:
        self._ended = True
        if self._streaming:
            self._done.set()

    # -- Transport -------------------------------------------------------------------

    @property
    def surface(self) -> str:
        """What metrics call this kind of client: ``sse`` or ``execute``."""
        return self.encoding.surface

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

    def end(self, ending: Ending) -> None:
        self.services.subscribers.count_ending(ending.reason)
        self._end_reason = ending.reason
        if self.is_open():
            self.write(ending.sse_event())
        self._end()

    def _end(self) -> None:
        self._ended = True
        self._done.set()

    _flushing: asyncio.Future[None] | None = None

    def _heartbeat(self) -> None:
        if not self.is_open():
            return
        if self._flushing is not None and not self._flushing.done():
            return  # the reader is not reading: its queue's limits deal with it
        self.write(b": keepalive\n\n")
        self._flushing = asyncio.ensure_future(self.flush())
        self._flushing.add_done_callback(_retrieve)


class StreamHandler(SSEHandler):
    """``GET /api/kernels/{id}/stream``: one SSE reader of one kernel's IOPub."""

    @web.authenticated
    @requires(KERNEL_ACTION)
    async def get(self, kernel_id: str) -> None:  # type: ignore[override]
        try:
            since = self.last_event_id()
            msg_types = parse_msg_types(self.get_arguments("msg_type"))
            parent = self.get_argument("parent", None) or None
            subscriber = await self._subscribe(kernel_id, since, parent, msg_types)
        except LocalError as error:
            self.write_error_json(error)
            return
        await self._stream(since, subscriber)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
