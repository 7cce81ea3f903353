"""The Subscriber (broker/subscriber.py): replay, hand-off to live, bounds and endings.

Driven on an event loop of its own, with no server and no socket: the real
:class:`MemoryBroker` fans out, a :class:`MemoryStore` keeps the transcript in a list and
reads it with the stores' own :class:`Query`, and a :class:`RecordingTransport` records
what a client would have been sent and how its stream ended. A test steers the transport
(it can hold a send, refuse one, fail one) and publishes records while the subscriber
reads: the orders of events a real kernel makes likely, made certain.

Invariants (DESIGN): 5, resume is exact (every record once, in order, across the
replay-to-live hand-off); 4, bounds (a client that cannot keep up is ended as a slow
consumer, from the last sequence number it surely has; replays share ``slots``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Collection, Coroutine, Iterator
from typing import Any

import pytest
from helpers import make_message, record, status, stream

from kernel_gateway_stream.broker import subscriber as subscriber_module
from kernel_gateway_stream.broker.memory import MemoryBroker
from kernel_gateway_stream.broker.subscriber import (
    ReplayLimits,
    Subscriber,
    SubscriberRegistry,
    TransportClosed,
)
from kernel_gateway_stream.core.endings import Ending
from kernel_gateway_stream.core.errors import SequenceAhead, StoreUnavailable
from kernel_gateway_stream.core.frames import Frame
from kernel_gateway_stream.core.handoff import HeldReply
from kernel_gateway_stream.core.marks import gap_record
from kernel_gateway_stream.core.messages import Record
from kernel_gateway_stream.core.subscription import SubscriberQueue
from kernel_gateway_stream.stores.base import TranscriptPage
from kernel_gateway_stream.stores.query import Query
from tests.timing import seconds

KERNEL = "k"

#: Seconds a wait within a scenario may take, and a whole scenario, before it is a failure
#: (they wait on nothing but themselves and timers of a fraction of a second).
WAIT_TIMEOUT = 5.0
SCENARIO_TIMEOUT = 20.0


def run(scenario: Coroutine[Any, Any, None]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(scenario, seconds(SCENARIO_TIMEOUT))

    asyncio.run(bounded())


@contextlib.contextmanager
def logged() -> Iterator[list[logging.LogRecord]]:
    """What the subscriber module logs meanwhile (on its own logger: once a server has run
    in this process, the package's loggers hang under the application's, not the root)."""
    records: list[logging.LogRecord] = []

    class Recording(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Recording(logging.ERROR)
    subscriber_module.log.addHandler(handler)
    try:
        yield records
    finally:
        subscriber_module.log.removeHandler(handler)


class MemoryStore:
    """A transcript in a list: the part of the TranscriptStore contract a Subscriber reads
    (``read``), with the stores' own query (range, filters, page bounds) and retention
    (records below ``first_seq`` are discarded)."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.first_seq = 1
        #: Reads made: ``(since, until)`` each.
        self.reads: list[tuple[int, int | None]] = []
        #: While set, a read waits for it (a slow disk).
        self.gate: asyncio.Event | None = None
        #: Reads in progress now, and the most there ever were at once.
        self.reading = 0
        self.most_reading = 0
        self.fail: Exception | None = None

    def append(self, record: Record) -> None:
        self.records.append(record)

    @property
    def head(self) -> int:
        return self.records[-1].seq if self.records else 0

    def discard_below(self, seq: int) -> None:
        """Retention: records below ``seq`` are gone."""
        self.records = [r for r in self.records if r.seq >= seq]
        self.first_seq = seq

    async def read(
        self,
        kernel_id: str,
        since: int,
        limit: int,
        *,
        until: int | None = None,
        parent: str | None = None,
        msg_types: Collection[str] | None = None,
        marks: bool = False,
        max_bytes: int | None = None,
    ) -> TranscriptPage:
        assert kernel_id == KERNEL
        self.reads.append((since, until))
        self.reading += 1
        self.most_reading = max(self.most_reading, self.reading)
        try:
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(0)  # a read is never synchronous
            if self.fail is not None:
                raise self.fail
            head = self.head
            upper = until if until is not None else head
            query = Query(since, upper, limit, parent, msg_types, marks, max_bytes)
            records: list[Record] = []
            taken = 0
            full = False
            for candidate in self.records:
                if candidate.seq <= since or candidate.seq > upper or not query.wants(candidate):
                    continue
                records.append(candidate)
                taken += candidate.message.size
                if query.full(len(records), taken):
                    full = True
                    break
            scanned = records[-1].seq if full else max(since, min(upper, head))
            discarded = (since + 1, self.first_seq - 1) if since + 1 < self.first_seq else None
            return TranscriptPage(records, head, self.first_seq, discarded, scanned)
        finally:
            self.reading -= 1


class RecordingTransport:
    """What a client was sent, in order, and how its stream ended.

    ``hold()`` makes sends wait until ``release()`` (a client that stopped reading);
    ``closed_on_send`` makes the next send raise TransportClosed (the client went away);
    ``error_on_send`` makes it raise that error. ``on_send`` runs before each send
    completes (to publish while the subscriber is sending, as a busy kernel does).
    """

    def __init__(self) -> None:
        self.sent: list[Frame] = []
        self.sends = 0
        self.ending: Ending | None = None
        self.open = True
        self.discards: list[tuple[int, int]] = []
        self._released: asyncio.Event | None = None
        self.closed_on_send = False
        self.error_on_send: Exception | None = None
        self.on_send: Any = None

    def hold(self) -> None:
        self._released = asyncio.Event()

    def release(self) -> None:
        if self._released is not None:
            self._released.set()
            self._released = None

    def is_open(self) -> bool:
        return self.open

    async def send(self, frames: list[Frame]) -> None:
        if self.closed_on_send:
            self.open = False
            raise TransportClosed
        if self.error_on_send is not None:
            raise self.error_on_send
        self.sends += 1
        if self.on_send is not None:
            self.on_send(frames)
        if self._released is not None:
            await self._released.wait()
        self.sent.extend(frames)

    def discarded(self, first_seq: int, last_seq: int) -> Frame | None:
        self.discards.append((first_seq, last_seq))
        notice = make_message("discarded", {"first_seq": first_seq, "last_seq": last_seq})
        return Frame.reply("iopub", notice)

    def end(self, ending: Ending) -> None:
        assert self.ending is None, "a stream ends once"
        self.ending = ending
        self.open = False

    def seqs(self) -> list[int]:
        """Every sequence number the client was sent, in order (merged frames expanded)."""
        out: list[int] = []
        for frame in self.sent:
            if frame.first_seq is not None and frame.last_seq is not None:
                out.extend(range(frame.first_seq, frame.last_seq + 1))
        return out

    def text(self) -> str:
        return "".join(frame.text or "" for frame in self.sent if frame.channel == "iopub")


class FastTransport(RecordingTransport):
    """A transport with ``write_now`` (as the WebSocket's): written at once, flushed when
    the test says (``flush()``), or at once when ``flushes_at_once``."""

    def __init__(self) -> None:
        super().__init__()
        self.written_now: list[list[Frame]] = []
        self.pending: list[asyncio.Future[None]] = []
        self.flushes_at_once = False

    def write_now(self, frames: list[Frame]) -> asyncio.Future[None] | None:
        if not self.open:
            raise TransportClosed
        self.written_now.append(frames)
        self.sent.extend(frames)
        if self.flushes_at_once:
            return None
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.pending.append(future)
        return future

    def flush(self, error: Exception | None = None) -> None:
        for future in self.pending:
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)
        self.pending = []


class Kernel:
    """One kernel's records: appended to the store, then published, as the Tap does."""

    def __init__(self, store: MemoryStore, broker: MemoryBroker) -> None:
        self.store = store
        self.broker = broker
        self.seq = store.head
        broker.open_kernel(KERNEL, self.seq)

    def emit(self, count: int = 1, *, parent: str = "parent-1", name: str = "stdout") -> None:
        for _ in range(count):
            self.seq += 1
            self.emit_record(record(self.seq, stream(name, f"{self.seq}\n", parent), KERNEL))

    def emit_record(self, rec: Record) -> None:
        self.seq = rec.seq
        self.store.append(rec)
        self.broker.publish(rec)


def lines(count: int, start: int = 1) -> str:
    return "".join(f"{n}\n" for n in range(start, start + count))


class Setup:
    """A broker (coalescing off unless asked: frames reach subscribers as published), a
    store, a kernel, a registry and shared limits."""

    def __init__(
        self, *, coalesce_window: float = 0.0, coalesce_quiet: float = 0.005, **limits: Any
    ) -> None:
        self.broker = MemoryBroker(coalesce_window=coalesce_window, coalesce_quiet=coalesce_quiet)
        self.store = MemoryStore()
        self.registry = SubscriberRegistry()
        self.limits = ReplayLimits(**limits)
        self.kernel = Kernel(self.store, self.broker)

    def subscriber(
        self, transport: RecordingTransport, since: int | None = None, **queue: Any
    ) -> Subscriber:
        start = since if since is not None else self.broker.head(KERNEL)
        return Subscriber(
            KERNEL,
            self.broker,
            self.store,  # type: ignore[arg-type]
            transport,
            SubscriberQueue(since=start, **queue),
            limits=self.limits,
            registry=self.registry,
        )


async def until(predicate: Any, what: str) -> None:
    """Until ``predicate()``: the loop runs the subscriber's tasks meanwhile (and its
    timers: a slow consumer's ``max_lag`` is real time)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds(WAIT_TIMEOUT)
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0)


async def settle() -> None:
    """Let every ready task run to its next wait."""
    for _ in range(50):
        await asyncio.sleep(0)


# -- live ---------------------------------------------------------------------------------


def test_a_live_subscriber_gets_every_record_after_the_head_it_attached_at() -> None:
    async def scenario() -> None:
        setup = Setup()
        setup.kernel.emit(3)
        transport = RecordingTransport()
        subscriber = setup.subscriber(transport)
        await subscriber.start(None)
        await until(lambda: subscriber.live, "live")
        setup.kernel.emit(5)
        await until(lambda: subscriber.last_seq == 8, "the fifth record sent")
        assert transport.seqs() == [4, 5, 6, 7, 8]
        assert transport.text() == lines(5, start=4)
        assert setup.registry.replays == 0
        assert setup.store.reads == []  # nothing to replay: the store was not read
        assert setup.registry.of(KERNEL) == [subscriber]

    run(scenario())


def test_a_subscriber_past_the_head_is_refused_and_attached_nowhere() -> None:
    async def scenario() -> None:
        setup = Setup()
        setup.kernel.emit(2)
        subscriber = setup.subscriber(RecordingTransport(), since=3)
        with pytest.raises(SequenceAhead):
            await subscriber.start(3)
        assert len(setup.registry) == 0
        assert setup.broker.subscriber_count(KERNEL) == 0

    run(scenario())


# -- replay, then live --------------------------------------------------------------------


def test_a_replay_then_live_sends_every_record_once_in_order() -> None:
    async def scenario() -> None:
        # Small pages and a small live window: many pages, and records published while
        # each page is being sent (a kernel faster than its client).
        setup = Setup(page_records=7, live_within=5)
        setup.kernel.emit(40)
        transport = RecordingTransport()
        transport.on_send = lambda frames: setup.kernel.emit(3)
        subscriber = setup.subscriber(transport, since=0)
        await subscriber.start(0)
        await until(lambda: subscriber.live, "live")
        transport.on_send = None
        setup.kernel.emit(10)
        await until(lambda: subscriber.last_seq == setup.kernel.seq, "every record sent")
        assert transport.seqs() == list(range(1, setup.kernel.seq + 1))
        assert transport.text() == lines(setup.kernel.seq)
        assert setup.registry.replays == 1
        assert len(setup.store.reads) > 2  # it paged
        assert setup.registry.records_replayed >= 40

    run(scenario())


def test_a_replay_from_inside_the_transcript_starts_after_since() -> None:
    async def scenario() -> None:
        setup = Setup()
        setup.kernel.emit(20)
        transport = RecordingTransport()
        subscriber = setup.subscriber(transport, since=12)
        await subscriber.start(12)
        await until(lambda: subscriber.live, "live")
        assert transport.seqs() == list(range(13, 21))
        assert setup.store.reads[0][0] == 12

    run(scenario())


def test_a_subscriber_at_the_head_replays_nothing_and_counts_no_replay() -> None:
    async def scenario() -> None:
        setup = Setup()
        setup.kernel.emit(4)
        transport = RecordingTransport()
        subscriber = setup.subscriber(transport, since=4)
        await subscriber.start(4)
        await until(lambda: subscriber.live, "live")
        assert setup.registry.replays == 0
        setup.kernel.emit()
        await until(lambda: subscriber.last_seq == 5, "the new record sent")
        assert transport.seqs() == [5]

    run(scenario())


def test_live_frames_wait_behind_the_rest_of_the_replay() -> None:
    async def scenario() -> None:
        # Within live_within at once: attached first, then the rest (1..10) is read while
        # live frames (11..13) queue, held; they go out after it, none twice.
        setup = Setup(live_within=100)
        setup.kernel.emit(10)
        setup.store.gate = asyncio.Event()
        transport = RecordingTransport()
        subscriber = setup.subscriber(transport, since=0)
        await subscriber.start(0)
        await until(lambda: setup.broker.subscriber_count(KERNEL) == 1, "attached")
        setup.kernel.emit(3)
        await settle()
        assert transport.sent == []  # held: the replay has not been read yet
        assert len(subscriber.queue) == 3
        setup.store.gate.set()
        await until(lambda: subscriber.last_seq == 13, "every record sent")
        assert transport.seqs() == list(range(1, 14))

    run(scenario())


def test_the_first_replayed_page_is_small() -> None:
    async def scenario() -> None:
        setup = Setup(live_within=0)
        setup.kernel.emit(1200)
        transport = RecordingTransport()
        subscriber = setup.subscriber(transport, since=0)
        await subscriber.start(0)
        await until(lambda: subscriber.live, "live")
        assert transport.seqs() == list(range(1, 1201))
        # The first page: 500 records, so the client sees output at once; then whole pages.
        assert setup.store.reads[:2] == [(0, 1200), (500, 1200)]

    run(scenario())


def test_replayed_stream_records_are_merged_into_fewer_frames() -> None:
    async def scenario() -> None:
        setup = Setup()
        setup.kernel.emit(30)
        transport = RecordingTransport()
        subscriber = setup.subscriber(transport, since=0)
        await subscriber.start(0)
        await until(lambda: subscriber.live, "live")
        assert len(transport.sent) == 1
        assert (transport.sent[0].first_seq, transport.sent[0].last_seq) == (1, 30)
        assert transport.text() == lines(30)

    run(scenario())


def test_a_replay_past_retention_is_told_what_was_discarded_first() -> None:
    async def scenario() -> None:
        setup = Setup()
        setup.kernel.emit(10)
        setup.store.discard_below(6)
        transport = RecordingTransport()
        subscriber = setup.subscriber(transport, since=2)
        await subscriber.start(2)
        await until(lambda: subscriber.live, "live")
        assert transport.discards == [(3, 5)]
        assert transport.sent[0].message.msg_type == "discarded"
        assert transport.seqs() == [6, 7, 8, 9, 10]

    run(scenario())


def test_replies_held_while_away_are_placed_among_the_replayed_output() -> None:
    async def scenario() -> None:
        setup = Setup(page_records=4, live_within=0)
        # Status records between streams: frames of one record each, so places are exact.
        for seq in range(1, 13):
            setup.kernel.emit_record(record(seq, status("busy" if seq % 2 else "idle"), KERNEL))
        early = Frame.reply("shell", make_message("execute_reply", {"n": "early"}))
        middle = Frame.reply("shell", make_message("execute_reply", {"n": "middle"}))
        late = Frame.reply("shell", make_message("execute_reply", {"n": "late"}))
        # Given out of order: the subscriber sorts them by their place.
        held = [HeldReply(12, late), HeldReply(6, middle), HeldReply(0, early)]
        transport = RecordingTransport()
        subscriber = setup.subscriber(transport, since=0)
        await subscriber.start(0, held)
        await until(lambda: subscriber.live, "live")
        order = [
            f.last_seq if f.last_seq is not None else f.message.content()["n"]
            for f in transport.sent
        ]
        assert order == ["early", 1, 2, 3, 4, 5, 6, "middle", 7, 8, 9, 10, 11, 12, "late"]

    run(scenario())


def test_a_held_reply_placed_past_the_replay_goes_out_before_live_frames() -> None:
    async def scenario() -> None:
        setup = Setup()
        setup.kernel.emit(3)
        reply = Frame.reply("shell", make_message("execute_reply", {}))
        transport = RecordingTransport()
        subscriber = setup.subscriber(transport, since=3)
        await subscriber.start(3, [HeldReply(3, reply)])
        await until(lambda: subscriber.live, "live")
        setup.kernel.emit()
        await until(lambda: subscriber.last_seq == 4, "the live record sent")
        assert transport.sent[0] is reply
        assert transport.seqs() == [4]

    run(scenario())


def test_a_filtered_replay_sends_its_execution_and_every_mark() -> None:
    async def scenario() -> None:
        setup = Setup()
        setup.kernel.emit(2, parent="mine")
        setup.kernel.emit(2, parent="other")
        setup.kernel.emit_record(gap_record(KERNEL, 5, 6, "test", now=0.0, date="d"))
        setup.kernel.emit(1, parent="mine")
        transport = RecordingTransport()
        subscriber = setup.subscriber(transport, since=0, parent="mine")
        await subscriber.start(0)
        await until(lambda: subscriber.live, "live")
        setup.kernel.emit(1, parent="other")
        setup.kernel.emit(1, parent="mine")
        await until(lambda: subscriber.last_seq == 9, "the live record of its execution")
        assert transport.seqs() == [1, 2, 5, 6, 7, 9]
        assert [f.message.msg_type for f in transport.sent] == [
            "stream",
            "kernel_gateway_stream_gap",
            "stream",
            "stream",
        ]

    run(scenario())


def test_replays_share_the_gateways_read_slots() -> None:
    async def scenario() -> None:
        setup = Setup(slots=asyncio.Semaphore(1), page_records=5, live_within=0)
        setup.kernel.emit(30)
        setup.store.gate = asyncio.Event()
        transports = [RecordingTransport() for _ in range(3)]
        subscribers = [setup.subscriber(t, since=0) for t in transports]
        for subscriber in subscribers:
            await subscriber.start(0)
        await settle()
        assert setup.store.reading == 1  # one page read at a time, gateway-wide
        setup.store.gate.set()
        await until(lambda: all(s.live for s in subscribers), "every subscriber live")
        assert setup.store.most_reading == 1
        for transport in transports:
            assert transport.seqs() == list(range(1, 31))

    run(scenario())


def test_a_client_that_stops_reading_does_not_hold_a_read_slot() -> None:
    async def scenario() -> None:
        setup = Setup(slots=asyncio.Semaphore(1), page_records=5, live_within=0)
        setup.kernel.emit(30)
        stuck = RecordingTransport()
        stuck.hold()
        first = setup.subscriber(stuck, since=0)
        await first.start(0)
        await until(lambda: stuck.sends == 1, "the stuck client's first page sent")
        other = RecordingTransport()
        second = setup.subscriber(other, since=0)
        await second.start(0)
        await until(lambda: second.live, "the other client live")
        assert other.seqs() == list(range(1, 31))
        assert stuck.sent == []
        first.close()

    run(scenario())


# -- bounds: slow consumers ---------------------------------------------------------------


def test_a_client_that_takes_no_replayed_page_in_time_ends_as_a_slow_consumer() -> None:
    async def scenario() -> None:
        setup = Setup(page_records=5, live_within=0)
        setup.kernel.emit(20)
        transport = RecordingTransport()
        subscriber = setup.subscriber(transport, since=0, max_lag=0.05)
        await subscriber.start(0)
        await until(lambda: transport.sends == 1, "the first page handed over")
        transport.hold()  # the second page is never taken
        await until(lambda: transport.ending is not None, "the stream ended")
        assert transport.ending is not None
        assert transport.ending.reason == "slow_consumer"
        assert transport.ending.last_seq == 5  # what it surely has: the first page
        assert transport.ending.message == "did not take a replayed page in time"
        assert len(setup.registry) == 0
        assert setup.broker.subscriber_count(KERNEL) == 0

    run(scenario())


def test_a_live_client_over_its_byte_bound_ends_as_a_slow_consumer_at_its_last_seq() -> None:
    async def scenario() -> None:
        setup = Setup()
        transport = RecordingTransport()
        subscriber = setup.subscriber(transport, max_bytes=2000)
        await subscriber.start(None)
        await until(lambda: subscriber.live, "live")
        setup.kernel.emit()
        await until(lambda: subscriber.last_seq == 1, "the first record sent")
        transport.hold()
        setup.kernel.emit()  # taken by the writer, whose send now waits
        await until(lambda: transport.sends == 2, "the second send begun")
        for _ in range(200):
            setup.kernel.emit()
            if transport.ending is not None:
                break
        assert transport.ending is not None
        assert transport.ending.reason == "slow_consumer"
        assert "bytes queued" in (transport.ending.message or "")
        assert transport.ending.last_seq == 2  # handed to the transport before it stalled
        assert setup.broker.subscriber_count(KERNEL) == 0
        assert len(setup.registry) == 0
        sent_then = list(transport.seqs())
        setup.kernel.emit(3)
        transport.release()
        await settle()
        assert transport.seqs() == [*sent_then, 2]  # the stalled send finishes; nothing more

    run(scenario())


def test_a_catching_up_client_is_not_on_the_live_feed() -> None:
    async def scenario() -> None:
        # Far behind (more than live_within): it reads without being attached, so the
        # records published meanwhile cost it nothing until it is near.
        setup = Setup(page_records=10, live_within=10)
        setup.kernel.emit(100)
        transport = RecordingTransport()
        transport.hold()
        subscriber = setup.subscriber(transport, since=0, max_bytes=1)
        await subscriber.start(0)
        await until(lambda: transport.sends == 1, "the first page handed over")
        setup.kernel.emit(50)  # would overflow a one-byte queue, were it attached
        assert setup.broker.subscriber_count(KERNEL) == 0
        assert transport.ending is None
        subscriber.close()

    run(scenario())


# -- clients that go away, writes that fail -----------------------------------------------


def test_a_client_gone_during_replay_is_closed_without_an_ending() -> None:
    async def scenario() -> None:
        setup = Setup()
        setup.kernel.emit(5)
        transport = RecordingTransport()
        transport.closed_on_send = True
        subscriber = setup.subscriber(transport, since=0)
        await subscriber.start(0)
        await until(lambda: len(setup.registry) == 0, "removed from the registry")
        assert transport.ending is None
        assert setup.broker.subscriber_count(KERNEL) == 0

    run(scenario())


def test_a_client_gone_while_live_is_detached() -> None:
    async def scenario() -> None:
        setup = Setup()
        transport = RecordingTransport()
        subscriber = setup.subscriber(transport)
        await subscriber.start(None)
        await until(lambda: subscriber.live, "live")
        transport.closed_on_send = True
        setup.kernel.emit()
        await until(lambda: setup.broker.subscriber_count(KERNEL) == 0, "detached")
        assert len(setup.registry) == 0
        assert transport.ending is None
        setup.kernel.emit()  # offered to nobody; the closed subscriber ignores offers
        subscriber.offer(Frame.from_record(record(3, stream("stdout", "x"), KERNEL)), 0.0)
        assert len(subscriber.queue) == 0

    run(scenario())


def test_a_write_that_fails_ends_the_stream_as_a_server_error() -> None:
    async def scenario() -> None:
        setup = Setup()
        transport = RecordingTransport()
        subscriber = setup.subscriber(transport)
        await subscriber.start(None)
        await until(lambda: subscriber.live, "live")
        setup.kernel.emit()
        await until(lambda: subscriber.last_seq == 1, "the first record sent")
        transport.error_on_send = RuntimeError("the socket broke")
        setup.kernel.emit()
        await until(lambda: transport.ending is not None, "the stream ended")
        assert transport.ending is not None
        assert transport.ending.reason == "server_error"
        assert transport.ending.message == "the socket broke"
        assert transport.ending.last_seq == 2  # counted as sent once handed over
        assert len(setup.registry) == 0

    with logged() as records:
        run(scenario())
    assert [r.getMessage() for r in records] == ["Writing to a client of k failed"]


def test_a_replay_that_fails_ends_the_stream_as_a_server_error() -> None:
    async def scenario() -> None:
        setup = Setup(page_records=5, live_within=0)
        setup.kernel.emit(20)
        transport = RecordingTransport()
        subscriber = setup.subscriber(transport, since=0)

        def break_the_store(frames: list[Frame]) -> None:
            setup.store.fail = OSError("disk gone")

        transport.on_send = break_the_store
        await subscriber.start(0)
        await until(lambda: transport.ending is not None, "the stream ended")
        assert transport.ending is not None
        assert transport.ending.reason == "server_error"
        assert transport.ending.last_seq == 5
        assert transport.ending.message == "disk gone"
        assert len(setup.registry) == 0

    with logged() as records:
        run(scenario())
    assert [r.getMessage() for r in records] == ["Replaying to a client of k failed"]


def test_a_replay_goes_on_when_the_store_can_be_reached_again() -> None:
    """Redis restarting under a replay (the fault schedule's clients were closed with
    ``server_error`` for it): the page is read again, and the client gets every record
    once, in order, its stream never ended."""

    async def scenario() -> None:
        setup = Setup(page_records=5, live_within=0)
        setup.kernel.emit(20)
        transport = RecordingTransport()
        subscriber = setup.subscriber(transport, since=0)
        failures = 0

        def store_away(frames: list[Frame]) -> None:
            nonlocal failures
            if failures == 0:
                setup.store.fail = StoreUnavailable("reading from Redis: connection reset")
                failures = 1

        original = setup.store.read

        async def comes_back(*args: Any, **kwargs: Any) -> TranscriptPage:
            nonlocal failures
            try:
                return await original(*args, **kwargs)
            finally:
                if setup.store.fail is not None:
                    failures += 1
                    if failures > 2:  # two reads failed: Redis answers again
                        setup.store.fail = None

        setup.store.read = comes_back  # type: ignore[method-assign]
        transport.on_send = store_away
        await subscriber.start(0)
        await until(lambda: transport.seqs()[-1:] == [20], "every record")
        assert transport.ending is None
        assert transport.seqs() == list(range(1, 21))
        assert failures == 3

    run(scenario())


def test_close_is_idempotent_and_cancels_the_replay() -> None:
    async def scenario() -> None:
        setup = Setup()
        setup.kernel.emit(5)
        setup.store.gate = asyncio.Event()
        transport = RecordingTransport()
        subscriber = setup.subscriber(transport, since=0)
        await subscriber.start(0)
        await until(lambda: setup.store.reading == 1, "reading")
        subscriber.close()
        subscriber.close()
        await settle()
        assert setup.store.reading == 0  # the read was cancelled
        setup.store.gate.set()
        await settle()
        assert transport.sent == []
        assert transport.ending is None
        assert len(setup.registry) == 0

    run(scenario())


# -- the fast path ------------------------------------------------------------------------


def test_a_parked_writer_lets_the_turn_end_write_what_it_brought_at_once() -> None:
    async def scenario() -> None:
        setup = Setup()
        transport = FastTransport()
        transport.flushes_at_once = True
        subscriber = setup.subscriber(transport)
        await subscriber.start(None)
        await until(lambda: subscriber.live, "live")
        await settle()  # the writer parks
        setup.kernel.emit()
        setup.kernel.emit(2)
        assert transport.seqs() == []  # nothing is written within publish
        await asyncio.sleep(0)  # the end of the turn: one callback, no task woken
        assert transport.seqs() == [1, 2, 3]
        assert len(transport.written_now) == 1  # one write, of one merged frame
        assert (transport.sent[0].first_seq, transport.sent[0].last_seq) == (1, 3)
        assert transport.sends == 0
        assert subscriber.last_seq == 3

    run(scenario())


def test_the_turn_end_writes_to_every_subscriber_and_one_failing_ends_only_itself() -> None:
    class Failing(FastTransport):
        def write_now(self, frames: list[Frame]) -> asyncio.Future[None] | None:
            raise RuntimeError("broken transport")

    async def scenario() -> None:
        setup = Setup()
        transports = [FastTransport(), Failing(), FastTransport()]
        subscribers = [setup.subscriber(transport) for transport in transports]
        for transport, subscriber in zip(transports, subscribers, strict=True):
            transport.flushes_at_once = True
            await subscriber.start(None)
        await until(lambda: all(s.live for s in subscribers), "live")
        await settle()
        setup.kernel.emit(2)
        await asyncio.sleep(0)
        assert transports[0].seqs() == transports[2].seqs() == [1, 2]
        ending = transports[1].ending
        assert ending is not None
        assert ending.reason == "server_error"
        assert setup.broker.subscriber_count(KERNEL) == 2

    run(scenario())


def test_a_line_after_slow_writes_is_merged_not_taken_for_one_after_a_quiet_period() -> None:
    """Invariant 6 with many subscribers: the broker tells the coalescer when the turn's
    writes are done, so the time they took is not taken for the kernel's quiet."""

    class Slow(FastTransport):
        def write_now(self, frames: list[Frame]) -> asyncio.Future[None] | None:
            time.sleep(seconds(0.3))  # a thousand subscribers' writes
            return super().write_now(frames)

    async def scenario() -> None:
        setup = Setup(coalesce_window=seconds(5.0), coalesce_quiet=seconds(0.2))
        transport = Slow()
        transport.flushes_at_once = True
        subscriber = setup.subscriber(transport)
        await subscriber.start(None)
        await until(lambda: subscriber.live, "live")
        await settle()
        setup.kernel.emit()  # the first line after a quiet period: at once
        await asyncio.sleep(0)  # written, slowly
        await asyncio.sleep(0)  # the broker tells the coalescer
        setup.kernel.emit()  # more than quiet after the first, but not after its write
        await asyncio.sleep(0)
        assert transport.seqs() == [1]  # held in a run, not sent alone
        assert setup.broker.subscriber_count(KERNEL) == 1

    run(scenario())


def test_frames_offered_during_a_fast_write_wait_for_its_flush_and_go_merged() -> None:
    async def scenario() -> None:
        setup = Setup()
        transport = FastTransport()
        subscriber = setup.subscriber(transport)
        await subscriber.start(None)
        await until(lambda: subscriber.live, "live")
        await settle()
        setup.kernel.emit()
        await asyncio.sleep(0)  # written at the turn's end; its flush is pending
        setup.kernel.emit(4)  # queued behind it
        await settle()
        assert transport.seqs() == [1]
        assert len(subscriber.queue) == 4
        transport.flush()
        await until(lambda: subscriber.last_seq == 5, "the rest sent")
        assert transport.seqs() == [1, 2, 3, 4, 5]
        assert transport.sends == 1  # the rest went as one send of one merged frame
        assert (transport.sent[-1].first_seq, transport.sent[-1].last_seq) == (2, 5)

    run(scenario())


def test_a_fast_write_whose_flush_fails_closes_the_subscriber() -> None:
    async def scenario() -> None:
        setup = Setup()
        transport = FastTransport()
        subscriber = setup.subscriber(transport)
        await subscriber.start(None)
        await until(lambda: subscriber.live, "live")
        await settle()
        setup.kernel.emit()
        await asyncio.sleep(0)  # written at the turn's end
        transport.flush(ConnectionResetError("gone"))
        await until(lambda: len(setup.registry) == 0, "closed")
        assert setup.broker.subscriber_count(KERNEL) == 0

    run(scenario())


# -- endings: the kernel or the gateway goes ----------------------------------------------


def test_kernel_shutdown_sends_what_is_queued_then_ends_at_the_last_seq() -> None:
    async def scenario() -> None:
        setup = Setup()
        transport = RecordingTransport()
        subscriber = setup.subscriber(transport)
        await subscriber.start(None)
        await until(lambda: subscriber.live, "live")
        setup.kernel.emit()
        await until(lambda: transport.sends == 1, "the first send begun")
        transport.hold()
        setup.kernel.emit(3)
        await until(lambda: transport.sends == 2, "the second send begun")
        setup.kernel.emit(2)  # queued behind the held send
        finishing = asyncio.ensure_future(subscriber.finish("kernel_shutdown", 5.0, 6))
        await settle()
        assert transport.ending is None  # it waits for the queue to drain
        transport.release()
        await finishing
        assert transport.seqs() == [1, 2, 3, 4, 5, 6]
        assert transport.ending is not None
        assert (transport.ending.reason, transport.ending.last_seq) == ("kernel_shutdown", 6)
        assert setup.broker.subscriber_count(KERNEL) == 0
        assert len(setup.registry) == 0

    run(scenario())


def test_a_finish_that_cannot_drain_in_time_ends_at_what_was_handed_over() -> None:
    async def scenario() -> None:
        setup = Setup()
        transport = RecordingTransport()
        subscriber = setup.subscriber(transport)
        await subscriber.start(None)
        await until(lambda: subscriber.live, "live")
        transport.hold()
        setup.kernel.emit()
        await until(lambda: transport.sends == 1, "the send begun")
        setup.kernel.emit(2)
        await subscriber.finish("gateway_shutdown", 0.05, None)
        assert transport.ending is not None
        assert (transport.ending.reason, transport.ending.last_seq) == ("gateway_shutdown", 1)

    run(scenario())


def test_a_client_catching_up_when_its_kernel_shuts_down_reads_to_the_end_then_ends() -> None:
    async def scenario() -> None:
        setup = Setup(page_records=5, live_within=0)
        setup.kernel.emit(20)
        transport = RecordingTransport()
        transport.hold()
        subscriber = setup.subscriber(transport, since=0)
        await subscriber.start(0)
        await until(lambda: transport.sends == 1, "the first page handed over")
        setup.kernel.emit(2)
        setup.broker.close_kernel(KERNEL)  # the broker forgets it: head 0 from now on
        await subscriber.finish("kernel_shutdown", 1.0, 22)
        assert transport.ending is None  # the catch-up ends it
        transport.release()
        await until(lambda: transport.ending is not None, "the stream ended")
        assert transport.seqs() == list(range(1, 23))
        assert transport.ending is not None
        assert (transport.ending.reason, transport.ending.last_seq) == ("kernel_shutdown", 22)
        assert len(setup.registry) == 0

    run(scenario())


def test_finish_after_close_does_nothing() -> None:
    async def scenario() -> None:
        setup = Setup()
        transport = RecordingTransport()
        subscriber = setup.subscriber(transport)
        await subscriber.start(None)
        await until(lambda: subscriber.live, "live")
        subscriber.close()
        await subscriber.finish("kernel_shutdown", 1.0, 0)
        assert transport.ending is None

    run(scenario())


# -- with the broker's coalescing on ------------------------------------------------------


def test_coalesced_live_frames_and_the_replay_meet_without_gap_or_overlap() -> None:
    async def scenario() -> None:
        # Coalescing on: attach flushes what is pending, so frames after the head the
        # subscriber attached at lie wholly above it.
        setup = Setup(coalesce_window=0.02, page_records=3, live_within=4)
        transport = RecordingTransport()
        transport.on_send = lambda frames: setup.kernel.emit(2)
        setup.kernel.emit(15)
        subscriber = setup.subscriber(transport, since=0)
        await subscriber.start(0)
        await until(lambda: subscriber.live, "live")
        transport.on_send = None
        setup.kernel.emit(10)
        await until(lambda: subscriber.last_seq == setup.kernel.seq, "every record sent")
        assert transport.seqs() == list(range(1, setup.kernel.seq + 1))
        assert transport.text() == lines(setup.kernel.seq)
        setup.broker.close_kernel(KERNEL)

    run(scenario())


# -- the registry -------------------------------------------------------------------------


def test_the_registry_holds_subscribers_by_kernel() -> None:
    async def scenario() -> None:
        setup = Setup()
        first = setup.subscriber(RecordingTransport())
        second = setup.subscriber(RecordingTransport())
        await first.start(None)
        await second.start(None)
        assert set(setup.registry.of(KERNEL)) == {first, second}
        assert set(setup.registry) == {first, second}
        assert len(setup.registry) == 2
        assert setup.registry.of("other") == []
        first.close()
        assert setup.registry.of(KERNEL) == [second]
        second.close()
        assert len(setup.registry) == 0
        setup.registry.count_ending("slow_consumer")
        setup.registry.count_ending("slow_consumer")
        assert setup.registry.endings == {"slow_consumer": 2}

    run(scenario())
