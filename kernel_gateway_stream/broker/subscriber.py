"""The Subscriber every client connection is served by, and where its frames go.

A :class:`Subscriber` replays a kernel's transcript from where the client left off, then
follows it live, through a bounded
:class:`~kernel_gateway_stream.core.subscription.SubscriberQueue` and one writer task
that drains it into a :class:`Transport` (a WebSocket, an SSE response). The decisions
of the replay-to-live hand-off are :class:`~kernel_gateway_stream.core.handoff.Handoff`'s;
this module carries them out. Bounds (DESIGN invariant 4):

* replays read pages bounded in records and bytes, and at most ``ReplayLimits.slots``
  pages are being read and sent at once across the gateway: a storm of reconnecting
  clients costs that many pages, not a backlog per client;
* a client catching up is not attached to the live feed, so it holds no live frames;
* a live client's queue is bounded by its ``max_bytes`` and ``max_lag``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ..core.endings import (
    Ending,
    gateway_shutdown,
    kernel_shutdown,
    lease_lost,
    server_error,
    slow_consumer,
)
from ..core.errors import SequenceAhead, StoreUnavailable
from ..core.frames import Frame, frames_from_records
from ..core.handoff import ATTACH, LIVE, STOPPED, Handoff, HeldReply, Read, interleave
from ..core.messages import Record
from ..core.subscription import SubscriberQueue

if TYPE_CHECKING:
    from .base import Broker

__all__ = [
    "ReplayLimits",
    "ReplayPage",
    "Subscriber",
    "SubscriberRegistry",
    "TranscriptReader",
    "Transport",
    "TransportClosed",
]

log = logging.getLogger(__name__)

#: Records in the first page a replay reads: small, so the first one goes out at once.
REPLAY_FIRST_PAGE = 500
#: A replay's read of a store that cannot be reached for now (Redis restarting, failing
#: over: a second or two) is tried again, after this many seconds, doubling up to a second,
#: for this long in all; then the stream ends as a server error, with where to resume.
READ_RETRY_FIRST = 0.1
READ_RETRY_FOR = 15.0

#: The endings :meth:`Subscriber.finish` sends, by reason (``kernel_shutdown`` otherwise).
_ENDINGS: dict[str, Callable[[int], Ending]] = {
    "gateway_shutdown": gateway_shutdown,
    "lease_lost": lease_lost,
}


class ReplayPage(Protocol):
    """What a replay needs of a page of the transcript (a store's ``TranscriptPage``)."""

    @property
    def records(self) -> list[Record]: ...

    @property
    def discarded(self) -> tuple[int, int] | None: ...

    @property
    def scanned(self) -> int: ...


class TranscriptReader(Protocol):
    """Where a subscriber replays from: the transcript store, seen as a reader (the
    broker imports no store)."""

    async def read(  # every filter passed: a replay states them all
        self,
        kernel_id: str,
        since: int,
        limit: int,
        *,
        until: int | None,
        parent: str | None,
        msg_types: Collection[str] | None,
        marks: bool,
        max_bytes: int | None,
    ) -> ReplayPage:
        """Up to ``limit`` records of ``kernel_id`` above ``since`` (see the store's)."""


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

    def end(self, ending: Ending) -> None:
        """End the client's stream with ``ending`` (its reason and resume point)."""


@dataclass(frozen=True)
class ReplayLimits:
    """How replays are bounded; one instance, shared by every subscriber of the gateway."""

    #: Records per page after the first (the first is smaller, for a quick first record).
    page_records: int = 5000
    #: Bytes of messages per page.
    page_bytes: int = 1024 * 1024
    #: Largest merged frame a replay sends.
    frame_bytes: int = 1024 * 1024
    #: A subscriber within this many sequence numbers of the head attaches to the live
    #: feed and reads the rest while live frames wait (see core.handoff).
    live_within: int = 5000
    #: Pages being read and sent at once, gateway-wide.
    slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(8))


class SubscriberRegistry:
    """Every subscriber of every kernel, attached to the live feed or still catching up:
    what kernel and gateway shutdown end."""

    __slots__ = ("_by_kernel", "_call_soon", "_ready", "endings", "records_replayed", "replays")

    def __init__(self) -> None:
        self._by_kernel: dict[str, dict[Subscriber, None]] = {}
        #: Subscribers with frames to write at the end of this turn of the loop, in order.
        self._ready: list[Subscriber] = []
        self._call_soon: Callable[..., object] | None = None
        #: Streams ended by the gateway, by reason (``slow_consumer``, ``kernel_shutdown``).
        self.endings: dict[str, int] = {}
        #: Subscribers that asked for the past (``since``) and records sent them from it.
        self.replays = 0
        self.records_replayed = 0

    def write_soon(self, subscriber: Subscriber) -> None:
        """Have ``subscriber`` write what it has queued once the records ready now are
        all published: one callback per turn of the event loop for every subscriber of
        every kernel, not a task wake-up per frame per subscriber, and each subscriber
        writes everything the turn brought it at once (merged, see SharedMerges)."""
        if not self._ready:
            call_soon = self._call_soon
            if call_soon is None:  # found once: get_running_loop() is a system call
                call_soon = self._call_soon = asyncio.get_running_loop().call_soon
            call_soon(self._write_ready)
        self._ready.append(subscriber)

    def _write_ready(self) -> None:
        ready, self._ready = self._ready, []
        for subscriber in ready:
            subscriber.write_queued()

    def count_ending(self, reason: str) -> None:
        """A transport ended a client's stream for ``reason`` (for metrics)."""
        self.endings[reason] = self.endings.get(reason, 0) + 1

    def add(self, subscriber: Subscriber) -> None:
        self._by_kernel.setdefault(subscriber.kernel_id, {})[subscriber] = None

    def remove(self, subscriber: Subscriber) -> None:
        subscribers = self._by_kernel.get(subscriber.kernel_id)
        if subscribers is not None:
            subscribers.pop(subscriber, None)
            if not subscribers:
                del self._by_kernel[subscriber.kernel_id]

    def of(self, kernel_id: str) -> list[Subscriber]:
        return list(self._by_kernel.get(kernel_id, ()))

    def __iter__(self) -> Iterator[Subscriber]:
        return iter([s for subscribers in self._by_kernel.values() for s in subscribers])

    def __len__(self) -> int:
        return sum(len(subscribers) for subscribers in self._by_kernel.values())


class Subscriber:
    """One client's view of one kernel's IOPub: replay from the transcript, then live.

    Usage: ``await subscriber.start(since)``, then :meth:`offer` is called by the broker
    for each frame, and :meth:`reply` by the connection for its own channel replies;
    :meth:`close` when the client goes away, :meth:`finish` when the kernel or the
    gateway does.
    """

    # Slots: a thousand idle subscribers of one kernel each hold one of these.
    __slots__ = (
        "_closed",
        "_drained",
        "_final_head",
        "_handoff",
        "_in_flight",
        "_parked",
        "_scheduled",
        "_sending",
        "_stopping",
        "_task",
        "_wake",
        "_write_now",
        "_writer",
        "broker",
        "kernel_id",
        "limits",
        "queue",
        "registry",
        "store",
        "transport",
    )

    def __init__(
        self,
        kernel_id: str,
        broker: Broker,
        store: TranscriptReader,
        transport: Transport,
        queue: SubscriberQueue,
        *,
        limits: ReplayLimits,
        registry: SubscriberRegistry,
    ) -> None:
        self.kernel_id = kernel_id
        self.broker = broker
        self.store = store
        self.transport = transport
        self.queue = queue
        self.limits = limits
        self.registry = registry
        self._wake = _Signal()
        self._drained = _Signal()
        self._write_now: Callable[[list[Frame]], asyncio.Future[None] | None] | None = getattr(
            transport, "write_now", None
        )
        #: True while the writer waits for work (the fast path may write for it).
        self._parked = False
        #: True while the registry holds this subscriber to write at the end of the turn.
        self._scheduled = False
        #: True while the writer is inside Transport.send (which may await: SSE's after_send).
        self._sending = False
        self._in_flight: asyncio.Future[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._handoff: Handoff | None = None
        self._task: asyncio.Future[None] | None = None
        self._closed = False
        #: The ending to send once the replay reaches the end (the kernel is gone), and
        #: the head of the transcript then (the broker no longer knows the kernel).
        self._stopping: Ending | None = None
        self._final_head = 0

    @property
    def last_seq(self) -> int:
        """The last IOPub sequence number handed to the transport."""
        return self.queue.last_seq

    @property
    def live(self) -> bool:
        """True once the subscriber follows the live feed (its replay is done)."""
        return self._handoff is not None and not self.queue.holding and self._writer is not None

    async def start(
        self, since: int | None, replies: Sequence[HeldReply] = (), *, asked: bool = True
    ) -> None:
        """Begin the hand-off: replay ``(since, head]`` from the store, then go live;
        ``replies`` held while the client was away are sent among the replayed output, in
        place. Returns at once: the hand-off runs as a task of its own, so the connection
        keeps reading what the client sends (its requests, and its close) meanwhile.

        With ``since=None`` the subscriber starts live at the current head. ``asked=False``:
        the client did not ask for the past, ``since`` is only where its socket opened (a
        new client catching up on what came while its connection was set up), and the
        replay is not counted as one a client asked for.

        Raises:
            SequenceAhead: ``since`` is past the kernel's head; nothing was attached.
        """
        head = self.broker.head(self.kernel_id)
        if since is not None and since > head:
            raise SequenceAhead(since, head)
        self.registry.add(self)
        if asked and since is not None and since < head:
            self.registry.replays += 1
        self._handoff = Handoff(since, live_within=self.limits.live_within)
        # Replies to the client's own requests wait behind the replay, as live frames do.
        self.queue.holding = True
        held = sorted(replies, key=lambda reply: reply.after_seq)
        self._task = asyncio.ensure_future(self._hand_off(self._handoff, head, held))
        self._task.add_done_callback(self._handed_off)

    async def _hand_off(self, handoff: Handoff, head: int, held: list[HeldReply]) -> None:
        action = handoff.begin(head)
        size = min(REPLAY_FIRST_PAGE, self.limits.page_records)
        first = True
        while not self._closed:
            if isinstance(action, Read):
                # The slot bounds the pages being read at once, not a client's sending:
                # one that stops reading must not hold up everybody's replay.
                async with self.limits.slots:
                    frames, reached = await self._read(action, size, first)
                frames, placed = interleave(frames, held)
                del held[:placed]
                if frames and not await self._send_replayed(frames):
                    return
                first, size = False, self.limits.page_records
                action = handoff.page_sent(action, reached, self._head())
            elif action is ATTACH:
                attached = self.broker.attach(self.kernel_id, self)
                if handoff.cursor is not None and handoff.cursor >= attached:
                    self.queue.start_after(attached)
                self._writer = asyncio.ensure_future(self._write_loop())
                action = handoff.attached(attached)
            elif action is LIVE:
                if held and not await self._send_replayed([reply.frame for reply in held]):
                    return
                self.queue.holding = False
                self._wake.set()
                return
            else:
                assert action is STOPPED
                self._end(self._stopping or kernel_shutdown(self.last_seq))
                return

    def _handed_off(self, task: asyncio.Future[None]) -> None:
        if task.cancelled():
            self.close()
            return
        error = task.exception()
        if error is not None:  # a task's outermost frame: log it, end the client's stream
            log.error("Replaying to a client of %s failed", self.kernel_id, exc_info=error)
            self._end(server_error(self.last_seq, str(error)))

    def _head(self) -> int:
        return max(self.broker.head(self.kernel_id), self._final_head)

    async def _read(self, read: Read, size: int, first: bool) -> tuple[list[Frame], int]:
        """One page of ``read``: its frames (a retention notice first, on the first page)
        and the highest sequence number it covered."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READ_RETRY_FOR
        delay = READ_RETRY_FIRST
        while True:
            try:
                page = await self.store.read(
                    self.kernel_id,
                    read.after,
                    size,
                    until=read.until,
                    parent=self.queue.parent,
                    msg_types=self.queue.msg_types,
                    marks=True,
                    max_bytes=self.limits.page_bytes,
                )
                break
            except StoreUnavailable:
                if self._closed or loop.time() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(2 * delay, 1.0)
        self.registry.records_replayed += len(page.records)
        frames = frames_from_records(page.records, self.limits.frame_bytes)
        if first and page.discarded is not None:
            notice = self.transport.discarded(*page.discarded)
            if notice is not None:
                frames.insert(0, notice)
        return frames, page.scanned

    async def _send_replayed(self, frames: list[Frame]) -> bool:
        """Send replayed frames; False if the client is gone or could not take them within
        its ``max_lag`` (then it is ended as a slow consumer, from what it surely has)."""
        if not self.transport.is_open():
            self.close()
            return False
        before = self.last_seq
        try:
            await asyncio.wait_for(self.transport.send(frames), self.queue.max_lag)
        except TransportClosed:
            self.close()
            return False
        except asyncio.TimeoutError:
            self._end(slow_consumer(before, "did not take a replayed page in time"))
            return False
        self.queue.sent(frames)
        return True

    def offer(self, frame: Frame, now: float) -> None:
        """Queue a frame (called by the broker); never blocks."""
        if self._closed:
            return
        overflow = self.queue.offer(frame, now)
        if overflow is not None:
            self._end(slow_consumer(overflow.last_seq, overflow.reason))
            return
        if self.queue.holding:
            return
        if self._parked and self._write_now is not None and self._in_flight is None:
            if not self._scheduled:
                self._scheduled = True
                self.registry.write_soon(self)
        else:
            self._wake.set()

    def write_queued(self) -> None:
        """Called by the registry at the end of the turn in which frames were offered:
        write them now if the writer is still idle (the fast path), else wake it."""
        self._scheduled = False
        if self._closed:
            return
        if not (self._parked and self._in_flight is None):
            self._wake.set()
            return
        try:
            self._send_now()
        except Exception as error:  # one subscriber's failure is its own: end it, go on
            log.exception("Writing to a client of %s failed", self.kernel_id)
            self._end(server_error(self.last_seq, str(error)))

    def _send_now(self) -> None:
        """The fast path: the writer is idle and nothing is in flight, so the queued frames
        are written at once, in order, and the writer only awaits their flush."""
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

    async def finish(self, reason: str, timeout: float, head: int | None) -> None:
        """The kernel shut down at ``head`` (``kernel_shutdown``), the gateway is stopping
        (``gateway_shutdown``), or this node stopped recording the kernel (``lease_lost``):
        send what is already queued, up to ``timeout`` seconds, then end the client's
        stream with that reason and its last seq. A subscriber still catching up after its
        kernel shut down reads to ``head`` first."""
        if self._closed:
            return
        ending = _ENDINGS.get(reason, kernel_shutdown)
        if not self.live and self._handoff is not None and reason == "kernel_shutdown":
            self._stopping = ending(0)  # the catch-up ends it, with its last seq
            self._final_head = head or 0
            self._handoff.stop()
            return
        self.broker.detach(self.kernel_id, self)
        self.queue.holding = False
        self._drained.clear()
        self._wake.set()
        busy = len(self.queue) or self._sending
        if busy and self._writer is not None and self.transport.is_open():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._drained.wait(), timeout)
        self._end(ending(self.last_seq))

    def _end(self, ending: Ending) -> None:
        if ending.reason == "kernel_shutdown" and ending.last_seq == 0:
            ending = kernel_shutdown(self.last_seq)
        self.close()
        if self.transport.is_open():
            self.transport.end(ending)

    def close(self) -> None:
        """Detach from the broker and stop writing. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self.broker.detach(self.kernel_id, self)
        self.registry.remove(self)
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
                if not len(self.queue):
                    self._drained.set()
                continue
            if not self.transport.is_open():
                self.close()
                return
            # Counted as sent once handed over (nothing awaits between the check above and
            # the writes): a close frame sent later reaches the client after them.
            self.queue.sent(frames)
            self._sending = True
            try:
                await self.transport.send(frames)
            except TransportClosed:
                self.close()
            except Exception as error:  # the writer task's outermost loop: log, end, go on
                log.exception("Writing to a client of %s failed", self.kernel_id)
                self._end(server_error(self.last_seq, str(error)))
                return
            finally:
                self._sending = False
            if not len(self.queue):
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
