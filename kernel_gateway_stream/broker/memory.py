"""The in-process broker: one coalescer per kernel, frames shared by every subscriber."""

from __future__ import annotations

import asyncio

from traitlets import Float, Int

from ..core.coalescer import Coalescer
from ..core.frames import Frame
from ..core.health import ComponentHealth, State
from ..core.messages import Record
from .base import Broker, FrameSink

__all__ = ["MemoryBroker"]


class _Topic:
    """One kernel: its coalescer, its subscribers and the timer for the coalescing window."""

    __slots__ = (
        "coalescer",
        "head",
        "loop",
        "subscribers",
        "timer",
        "timer_deadline",
        "writing",
    )

    def __init__(self, coalescer: Coalescer, head: int) -> None:
        self.coalescer = coalescer
        self.head = head
        self.subscribers: dict[FrameSink, None] = {}
        self.timer: asyncio.TimerHandle | None = None
        self.timer_deadline: float | None = None
        #: The event loop, found on the first record (see :meth:`now`).
        self.loop: asyncio.AbstractEventLoop | None = None
        #: True while frames fanned out this turn of the loop are being written.
        self.writing = False

    def now(self) -> float:
        """The event loop's time. ``asyncio.get_running_loop()`` calls ``getpid()`` (it
        checks the loop was not inherited through a fork): a system call, which cost 8 %
        of the daemon's CPU in a firehose when asked once a record (py-spy --native)."""
        loop = self.loop
        if loop is None:
            loop = self.loop = asyncio.get_running_loop()
        return loop.time()


class MemoryBroker(Broker):
    """Fan-out within this process (the embedded default)."""

    coalesce_window = Float(
        0.05,
        config=True,
        help="Seconds a burst of stream output may wait to be merged into one message. A "
        "message after a quiet period is sent at once; 0 turns coalescing off.",
    )
    coalesce_quiet = Float(
        0.005,
        config=True,
        help="Seconds without a stream frame after which the next stream message is sent at "
        "once instead of waiting for the window: output spaced wider than this (a progress "
        "line every 10 ms) is not delayed, output closer together is merged. At most "
        "coalesce_window.",
    )
    coalesce_max_bytes = Int(
        65536,
        config=True,
        help="Largest merged stream message, in bytes of its parts; a run that reaches it is "
        "sent at once.",
    )

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._topics: dict[str, _Topic] = {}
        #: Subscribers that raised during fan-out and were cut off (each is logged).
        self.isolated = 0
        self.frames_sent = 0
        self.records_published = 0

    def open_kernel(self, kernel_id: str, head: int) -> None:
        topic = self._topics.get(kernel_id)
        if topic is None:
            coalescer = Coalescer(
                window=self.coalesce_window,
                max_bytes=self.coalesce_max_bytes,
                quiet=min(self.coalesce_quiet, self.coalesce_window),
            )
            self._topics[kernel_id] = _Topic(coalescer, head)
        else:
            topic.head = max(topic.head, head)

    def head(self, kernel_id: str) -> int:
        topic = self._topics.get(kernel_id)
        return topic.head if topic else 0

    def publish(self, record: Record) -> None:
        topic = self._topics[record.kernel_id]
        topic.head = record.seq
        self.records_published += 1
        now = topic.now()
        frames = topic.coalescer.feed(record, now)
        if frames:
            self._fan_out(topic, frames, now)
        self._arm(record.kernel_id, topic)

    def attach(self, kernel_id: str, subscriber: FrameSink) -> int:
        topic = self._topics.get(kernel_id)
        if topic is None:
            raise KeyError(kernel_id)
        # Send what is pending now, so every later frame lies wholly above the head the
        # new subscriber replays to: the replay-to-live handoff has no gap and no overlap.
        pending = topic.coalescer.flush()
        if pending:
            self._fan_out(topic, pending, topic.now())
        topic.subscribers[subscriber] = None
        return topic.head

    def cut(self, kernel_id: str) -> int:
        topic = self._topics.get(kernel_id)
        if topic is None:
            return 0
        pending = topic.coalescer.flush()
        if pending:
            self._fan_out(topic, pending, topic.now())
        return topic.head

    def detach(self, kernel_id: str, subscriber: FrameSink) -> None:
        topic = self._topics.get(kernel_id)
        if topic is not None:
            topic.subscribers.pop(subscriber, None)

    def close_kernel(self, kernel_id: str) -> None:
        topic = self._topics.pop(kernel_id, None)
        if topic is None:
            return
        if topic.timer is not None:
            topic.timer.cancel()
        pending = topic.coalescer.flush()
        if pending:
            self._fan_out(topic, pending, topic.now())

    def subscriber_count(self, kernel_id: str) -> int:
        topic = self._topics.get(kernel_id)
        return len(topic.subscribers) if topic else 0

    def _fan_out(self, topic: _Topic, frames: list[Frame], now: float) -> None:
        # A subscriber may close (overflow) while we iterate: iterate over a copy.
        subscribers = list(topic.subscribers)
        self.frames_sent += len(frames)
        for frame in frames:
            for subscriber in subscribers:
                try:
                    subscriber.offer(frame, now)
                except Exception:
                    # One subscriber's failure is its own (as websockets' broadcast()):
                    # the sequence number is spent, so the others must still get it.
                    self._isolate(topic, subscriber)
        if subscribers and not topic.writing and topic.loop is not None:
            # The subscribers write at the end of this turn (SubscriberRegistry.write_soon,
            # asked above, so called first): tell the coalescer once they have.
            topic.writing = True
            topic.loop.call_soon(self._written, topic)

    def _written(self, topic: _Topic) -> None:
        topic.writing = False
        topic.coalescer.written(topic.now())

    def _isolate(self, topic: _Topic, subscriber: FrameSink) -> None:
        self.isolated += 1
        self.log.exception("A subscriber failed during fan-out; closing it, the others go on")
        topic.subscribers.pop(subscriber, None)
        try:
            subscriber.close()
        except Exception:  # an adapter's edge: its close failing too is only logged
            self.log.exception("Closing the failed subscriber failed too")

    def health(self) -> ComponentHealth:
        return ComponentHealth(
            "broker",
            State.OK,
            None,
            {
                "kernels": len(self._topics),
                "live_subscribers": sum(len(t.subscribers) for t in self._topics.values()),
                "records_published": self.records_published,
                "frames_sent": self.frames_sent,
                "isolated_subscribers": self.isolated,
            },
        )

    def _arm(self, kernel_id: str, topic: _Topic) -> None:
        deadline = topic.coalescer.next_deadline()
        if deadline is None:
            return
        # A deadline that moved later (each record of a burst pushes the quiet deadline)
        # keeps the timer armed: it fires, finds nothing due yet, and arms the new one.
        # One timer per ``quiet`` in a flood instead of one per record.
        if topic.timer_deadline is not None and topic.timer_deadline <= deadline:
            return
        if topic.timer is not None:
            topic.timer.cancel()
        topic.timer_deadline = deadline
        topic.timer = asyncio.get_running_loop().call_at(
            deadline, self._on_deadline, kernel_id, deadline
        )

    def _on_deadline(self, kernel_id: str, deadline: float) -> None:
        topic = self._topics.get(kernel_id)
        if topic is None:
            return
        topic.timer = None
        topic.timer_deadline = None
        # call_at may fire a hair early (clock resolution); the deadline has come.
        now = max(asyncio.get_running_loop().time(), deadline)
        frames = topic.coalescer.due(now)
        if frames:
            self._fan_out(topic, frames, now)
        self._arm(kernel_id, topic)
