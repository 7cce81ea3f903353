"""The in-process broker on a real event loop, with recording subscribers."""

from __future__ import annotations

import time
from typing import Any

from kernel_gateway_stream.broker.memory import MemoryBroker
from kernel_gateway_stream.core.frames import Frame
from kernel_gateway_stream.core.messages import KernelMessage, Record
from kernel_gateway_stream.core.wire import Protocol

from ..timing import seconds
from .waits import wait_until


class RecordingSubscriber:
    """Stands in for a Subscriber: records what the broker offers, and when."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.times: list[float] = []

    def offer(self, frame: Frame, now: float) -> None:
        self.frames.append(frame)
        self.times.append(now)


def record(seq: int, text: str | None, parent: str = "p") -> Record:
    if text is None:
        content: dict[str, Any] = {"execution_state": "idle"}
        msg_type = "status"
    else:
        content = {"name": "stdout", "text": text}
        msg_type = "stream"
    message = KernelMessage.synthesize(msg_type, content, msg_id=f"m{seq}", date="", session="s")
    parent_header = b'{"msg_id": "%s"}' % parent.encode()
    message = KernelMessage.from_parts(
        [message.raw_header, parent_header, b"{}", message.raw_content]
    )
    return Record("k", seq, time.time(), message)


async def test_frames_are_shared_and_encoded_once() -> None:
    """Invariant 4: every subscriber is offered the same frame object, so each protocol's
    encoding is computed once however many clients there are."""
    broker = MemoryBroker(coalesce_window=0.0)
    broker.open_kernel("k", 0)
    subscribers = [RecordingSubscriber() for _ in range(100)]
    for subscriber in subscribers:
        broker.attach("k", subscriber)  # type: ignore[arg-type]
    for seq in range(1, 51):
        broker.publish(record(seq, f"{seq}\n"))
    first = subscribers[0].frames
    assert [f.last_seq for f in first] == list(range(1, 51))
    for subscriber in subscribers[1:]:
        assert all(a is b for a, b in zip(subscriber.frames, first, strict=True))
    encoded = first[0].encode(Protocol.V1)
    assert all(s.frames[0].encode(Protocol.V1) is encoded for s in subscribers)


async def test_burst_is_merged_and_released_within_one_window() -> None:
    """Invariant 6 on the real clock: a lone message goes at once; a burst behind it goes
    out as one frame, once the window ends; a status flushes it first. (The window and the
    quiet threshold are scaled: a slow machine must not split the burst.)"""
    window = seconds(0.2)
    broker = MemoryBroker(coalesce_window=window, coalesce_quiet=window)
    broker.open_kernel("k", 0)
    subscriber = RecordingSubscriber()
    broker.attach("k", subscriber)  # type: ignore[arg-type]
    broker.publish(record(1, "lone\n"))
    assert [f.text for f in subscriber.frames] == ["lone\n"]
    for seq in range(2, 102):
        broker.publish(record(seq, "x"))
    assert len(subscriber.frames) == 1
    # Released by the window's timer, not by anything published: nothing more is.
    await wait_until(lambda: len(subscriber.frames) > 1, "the burst's frame", window * 4)
    assert len(subscriber.frames) == 2
    burst = subscriber.frames[1]
    assert (burst.first_seq, burst.last_seq, burst.text) == (2, 101, "x" * 100)
    broker.publish(record(102, "y"))
    broker.publish(record(103, None))
    assert [(f.first_seq, f.last_seq) for f in subscriber.frames[2:]] == [(102, 102), (103, 103)]


async def test_attach_flushes_pending_so_the_handoff_is_exact() -> None:
    """Invariant 5: after attach() returns head H, the new subscriber is offered only
    frames wholly above H; what was pending went to the earlier subscribers."""
    broker = MemoryBroker(coalesce_window=10.0)
    broker.open_kernel("k", 0)
    early = RecordingSubscriber()
    broker.attach("k", early)  # type: ignore[arg-type]
    broker.publish(record(1, "a"))  # goes at once
    broker.publish(record(2, "b"))  # pending for 10 s
    late = RecordingSubscriber()
    head = broker.attach("k", late)  # type: ignore[arg-type]
    assert head == 2
    assert [(f.first_seq, f.last_seq) for f in early.frames] == [(1, 1), (2, 2)]
    broker.publish(record(3, None))
    assert [(f.first_seq, f.last_seq) for f in late.frames] == [(3, 3)]


class RaisingSubscriber(RecordingSubscriber):
    """A subscriber whose offer() raises (a bug, a transport failing in an odd way)."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def offer(self, frame: Frame, now: float) -> None:
        raise RuntimeError("this subscriber is broken")

    def close(self) -> None:
        self.closed = True


async def test_one_raising_subscriber_does_not_starve_the_others() -> None:
    """Item 16 (invariant 4: one failing subscriber never affects another): fan-out goes
    on to every other subscriber, for this frame and every later one; the broken one is
    closed and detached, as websockets' broadcast() isolates each connection."""
    broker = MemoryBroker(coalesce_window=0.0)
    broker.open_kernel("k", 0)
    before, broken, after = RecordingSubscriber(), RaisingSubscriber(), RecordingSubscriber()
    for subscriber in (before, broken, after):
        broker.attach("k", subscriber)  # type: ignore[arg-type]
    for seq in range(1, 11):
        broker.publish(record(seq, f"{seq}\n"))
    for subscriber in (before, after):
        assert [f.last_seq for f in subscriber.frames] == list(range(1, 11))
    assert broken.closed
    assert broker.subscriber_count("k") == 2
