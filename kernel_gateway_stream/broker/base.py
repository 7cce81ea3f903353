"""The Broker contract, and the Subscriber every client connection is served by.

The Tap publishes each record to the broker once; the broker coalesces and hands the
resulting frames to every attached :class:`Subscriber` without waiting for any of them
(DESIGN invariant 4). A Subscriber owns a bounded
:class:`~kernel_gateway_stream.core.subscription.SubscriberQueue` and one writer task
that drains it into a :class:`Transport` (a WebSocket, an SSE response, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABCMeta, abstractmethod
from collections.abc import Callable
from typing import Protocol

from traitlets.config import LoggingConfigurable

from ..core.errors import SequenceAhead
from ..core.frames import Frame, frames_from_records
from ..core.messages import Record
from ..core.subscription import Overflow, SubscriberQueue
from ..stores.base import TranscriptPage, TranscriptStore

#: Records in the first page a replay reads: small, so the first one goes out at once.
REPLAY_FIRST_PAGE = 500

__all__ = ["Broker", "Subscriber", "Transport", "TransportClosed"]


class TransportClosed(Exception):
    """The client went away; raised by :meth:`Transport.send`."""


class Transport(Protocol):
    """Where a subscriber's frames go. Implemented by the channels and SSE handlers."""

    def is_open(self) -> bool:
        """False once the client is gone or a close has begun: nothing more can be sent."""

    async def send(self, frames: list[Frame]) -> None:
        """Write ``frames`` in order; return once they are flushed to the socket.

        Raises:
            TransportClosed: the client is gone.
        """

    # Optional: ``write_now(frames) -> asyncio.Future[None] | None`` writes without waiting and
    # returns what to await for the flush. A transport that has it is written to straight
    # from :meth:`Subscriber.offer` while nothing is in flight, without waking a task.

    def discarded(self, first_seq: int, last_seq: int) -> Frame | None:
        """A notice that records ``first_seq..last_seq`` were discarded by retention,
        to send before the replay, or None to send nothing."""

    def overflowed(self, overflow: Overflow) -> None:
        """Disconnect the client: it is over its limit (reason and resume point given)."""

    def kernel_gone(self) -> None:
        """End the client's stream: the kernel shut down."""


class Subscriber:
    """One client's view of one kernel's IOPub: replay from the transcript, then live.

    Usage: ``await subscriber.start(since)``, then :meth:`offer` is called by the broker
    for each frame, and :meth:`reply` by the connection for its own channel replies;
    :meth:`close` when the client goes away.
    """

    # Slots: a thousand idle subscribers of one kernel each hold one of these.
    __slots__ = (
        "_closed",
        "_drained",
        "_ending",
        "_in_flight",
        "_parked",
        "_wake",
        "_write_now",
        "_writer",
        "broker",
        "kernel_id",
        "queue",
        "replay_frame_bytes",
        "replay_page",
        "store",
        "transport",
    )

    def __init__(
        self,
        kernel_id: str,
        broker: Broker,
        store: TranscriptStore,
        transport: Transport,
        queue: SubscriberQueue,
        *,
        replay_page: int = 5000,
        replay_frame_bytes: int = 1024 * 1024,
    ) -> None:
        self.kernel_id = kernel_id
        self.broker = broker
        self.store = store
        self.transport = transport
        self.queue = queue
        self.replay_page = replay_page
        self.replay_frame_bytes = replay_frame_bytes
        self._wake = _Signal()
        self._drained = _Signal()
        self._write_now: Callable[[list[Frame]], asyncio.Future[None] | None] | None = getattr(
            transport, "write_now", None
        )
        #: True while the writer waits for work (the fast path may write for it).
        self._parked = False
        self._in_flight: asyncio.Future[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._closed = False
        self._ending = False

    @property
    def last_seq(self) -> int:
        """The last IOPub sequence number handed to the transport."""
        return self.queue.last_seq

    async def start(self, since: int | None) -> None:
        """Attach to the broker, replay ``(since, head]`` from the store, then go live.

        With ``since=None`` the subscriber starts live at the current head.

        Raises:
            SequenceAhead: ``since`` is past the kernel's head; nothing was attached.
        """
        head = self.broker.head(self.kernel_id)
        if since is not None and since > head:
            raise SequenceAhead(since, head)
        self.queue.holding = True
        head = self.broker.attach(self.kernel_id, self)
        if since is None or since >= head:
            self.queue.start_after(head)
        self._writer = asyncio.ensure_future(self._write_loop())
        if since is not None and since < head:
            await self._replay(since, head)
        self.queue.holding = False
        self._wake.set()

    async def _replay(self, since: int, head: int) -> None:
        """Send ``(since, head]`` from the store, filtered as the queue is, page by page.

        The next page is read while the current one is sent; the first page is small, so
        the first record goes out quickly however long the transcript is.
        """
        size = min(REPLAY_FIRST_PAGE, self.replay_page)
        reading = asyncio.ensure_future(self._read_page(since, size, head))
        first = True
        while True:
            page = await reading
            records = page.records
            more = len(records) == size and records[-1].seq < head and not self._closed
            if more:
                size = self.replay_page
                reading = asyncio.ensure_future(self._read_page(records[-1].seq, size, head))
            frames = frames_from_records(records, self.replay_frame_bytes)
            if first and page.discarded is not None:
                notice = self.transport.discarded(*page.discarded)
                if notice is not None:
                    frames.insert(0, notice)
            first = False
            if frames and not await self._send_replayed(frames):
                if more:
                    reading.cancel()
                return
            if not more:
                return

    async def _read_page(self, after: int, size: int, head: int) -> TranscriptPage:
        return await self.store.read(
            self.kernel_id,
            after,
            size,
            until=head,
            parent=self.queue.parent,
            msg_types=self.queue.msg_types,
        )

    async def _send_replayed(self, frames: list[Frame]) -> bool:
        if not self.transport.is_open():
            self.close()
            return False
        self.queue.sent(frames)
        try:
            await self.transport.send(frames)
        except TransportClosed:
            self.close()
            return False
        return True

    def offer(self, frame: Frame, now: float) -> None:
        """Queue a frame (called by the broker); never blocks."""
        if self._closed or self._ending:
            return
        overflow = self.queue.offer(frame, now)
        if overflow is not None:
            self.close()
            self.transport.overflowed(overflow)
            return
        if self.queue.holding:
            return
        if self._parked and self._write_now is not None and self._in_flight is None:
            self._send_now()
        else:
            self._wake.set()

    def _send_now(self) -> None:
        """The fast path of :meth:`offer`: the writer is idle, nothing is in flight, so the
        frames are written at once, in order, and the writer only awaits their flush."""
        frames = self.queue.take()
        if not frames:
            return
        if not self.transport.is_open():
            self.close()
            return
        self.queue.sent(frames)
        assert self._write_now is not None
        try:
            pending = self._write_now(frames)
        except TransportClosed:
            self.close()
            return
        if pending is not None and not pending.done():
            self._in_flight = pending
            pending.add_done_callback(self._flushed)

    def _flushed(self, future: asyncio.Future[None]) -> None:
        if self._in_flight is future:
            self._in_flight = None
        if not future.cancelled() and future.exception() is not None:
            self.close()  # the client went away under a fast-path write

    def reply(self, frame: Frame, now: float) -> None:
        """Queue a reply on the client's own shell, control or stdin channel."""
        self.offer(frame, now)

    async def end(self, timeout: float) -> None:
        """The kernel is gone: send what is already queued (up to ``timeout`` seconds), then
        end the client's stream with :meth:`Transport.kernel_gone`."""
        self._ending = True
        self.broker.detach(self.kernel_id, self)
        self._wake.set()
        if len(self.queue) and self.transport.is_open():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._drained.wait(), timeout)
        self.close()
        self.transport.kernel_gone()

    def close(self) -> None:
        """Detach from the broker and stop writing. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.broker.detach(self.kernel_id, self)
        self._wake.set()

    async def _write_loop(self) -> None:
        while not self._closed:
            self._parked = True
            await self._wake.wait()
            self._parked = False
            self._wake.clear()
            in_flight = self._in_flight
            if in_flight is not None:
                # A fast-path write is being flushed: wait for it, so writes stay bounded
                # (a slow client's frames pile up in its queue, where the limits apply).
                with contextlib.suppress(Exception):  # _flushed closes on an error
                    await asyncio.shield(in_flight)
                if self._closed:
                    return
            frames = self.queue.take()
            if not frames:
                if self._ending and not len(self.queue):
                    self._drained.set()
                continue
            if not self.transport.is_open():
                self.close()
                return
            # Counted as sent once handed over (nothing awaits between the check above and
            # the writes): a close frame sent later reaches the client after them.
            self.queue.sent(frames)
            try:
                await self.transport.send(frames)
            except TransportClosed:
                self.close()
            if self._ending and not len(self.queue):
                self._drained.set()


class _Signal:
    """``asyncio.Event`` for a single waiter, without the Event's waiter deque: an idle
    subscriber holds one small future instead of two deques (at a thousand subscribers,
    that is most of what our own objects cost)."""

    __slots__ = ("_is_set", "_waiter")

    def __init__(self) -> None:
        self._is_set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._is_set = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def clear(self) -> None:
        self._is_set = False

    async def wait(self) -> None:
        if self._is_set:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


class _BrokerMeta(ABCMeta, type(LoggingConfigurable)):  # type: ignore[misc]
    pass


class Broker(LoggingConfigurable, metaclass=_BrokerMeta):  # type: ignore[metaclass]
    """Fans each kernel's records out to subscribers as coalesced, shared frames.

    The application creates one broker (``GatewayStreamApp.broker_class``). All methods
    are called on the event loop.
    """

    @abstractmethod
    def open_kernel(self, kernel_id: str, head: int) -> None:
        """Called by the Tap when it starts, with the transcript head it numbers from."""

    @abstractmethod
    def publish(self, record: Record) -> None:
        """Called by the Tap for every record, in order, after the store has it."""

    @abstractmethod
    def head(self, kernel_id: str) -> int:
        """The last sequence number published (or opened at) for ``kernel_id``; 0 if none."""

    @abstractmethod
    def attach(self, kernel_id: str, subscriber: Subscriber) -> int:
        """Called by :meth:`Subscriber.start`. Returns the head ``H``: the subscriber
        will be offered every frame whose sequence numbers are all above ``H``, and
        every record up to ``H`` is readable from the store."""

    @abstractmethod
    def detach(self, kernel_id: str, subscriber: Subscriber) -> None:
        """Called by :meth:`Subscriber.close`."""

    @abstractmethod
    def close_kernel(self, kernel_id: str) -> list[Subscriber]:
        """Called by the Tap when its kernel shuts down: flush what is pending, forget
        the kernel, and return the subscribers that were attached."""
