"""The Redis Streams transcript store and its leases, on this machine's real Redis.

Invariant 1 across nodes: a node that lost a kernel's lease cannot append (fencing), a
retried append cannot duplicate, and a node taking over numbers on above everything the
last owner may have given out, after an explicit gap record.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kernel_gateway_stream.cluster.bus import RecordBus
from kernel_gateway_stream.cluster.leases import LeaseMap
from kernel_gateway_stream.core.errors import StoreUnavailable
from kernel_gateway_stream.core.executions import SummaryBuilder
from kernel_gateway_stream.core.health import State
from kernel_gateway_stream.core.marks import GAP_MSG_TYPE, lifecycle_status
from kernel_gateway_stream.core.messages import KernelMessage, Record
from kernel_gateway_stream.stores.pending import cost
from kernel_gateway_stream.stores.redis import Fenced, Forked, RedisTranscriptStore, StoreLost

from ..timing import seconds
from .redis_server import RedisServer, require_redis_server
from .test_several_nodes import redis_url
from .test_store import execute_request_header, kernel_like_record, stream_record
from .waits import wait_until


@pytest.fixture
def store() -> Iterator[RedisTranscriptStore]:
    """A store under a key prefix of its own (its client connects on the test's loop)."""
    import redis

    instance = RedisTranscriptStore(url=redis_url(), key_prefix=f"kgs-test-{uuid.uuid4().hex}:")
    instance.open()
    yield instance
    client = redis.Redis.from_url(instance.url)
    keys = list(client.scan_iter(match=f"{instance.key_prefix}*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def leases(store: RedisTranscriptStore) -> LeaseMap:
    """Node a's leases, the ones the store appends with."""
    return LeaseMap(store, "a", 30, logging.getLogger(__name__))


async def owned(leases: LeaseMap, node: str = "a") -> str:
    kernel_id = str(uuid.uuid4())
    lease = await leases.acquire(kernel_id, node, 30)
    assert lease is not None
    leases.hold(kernel_id, lease)
    return kernel_id


def texts(records: list[Record]) -> list[str]:
    return [r.message.text or "" for r in records]


async def test_records_are_readable_at_once_and_read_back_equal(
    store: RedisTranscriptStore,
    leases: LeaseMap,
) -> None:
    kernel_id = await owned(leases)
    parent = execute_request_header()
    appended = [kernel_like_record(kernel_id, seq, f"line {seq}\n", parent) for seq in range(1, 51)]
    for record in appended:
        store.append(record)
    # What is read is what Redis holds, never the pending buffer: a pending record is
    # not the history yet (its append may yet be fenced).
    early = await store.read(kernel_id, 0, 1000)
    assert [r.seq for r in early.records] == list(range(1, early.head + 1))
    assert await store.flush(10)
    page = await store.read(kernel_id, 0, 1000)
    assert page.head == 50
    for got, sent in zip(page.records, appended, strict=True):
        assert got.seq == sent.seq
        assert got.message.raw_header == sent.message.raw_header
        assert got.message.raw_parent_header == sent.message.raw_parent_header
        assert got.message.raw_content == sent.message.raw_content
        assert got.message.parent_msg_id == sent.message.parent_msg_id
        assert got.message.text == sent.message.text
    # Filters and bounds, as the SQLite store's.
    parent_id = appended[0].message.parent_msg_id
    assert parent_id is not None
    filtered = await store.read(kernel_id, 10, 5, parent=parent_id, msg_types=["stream"])
    assert [r.seq for r in filtered.records] == [11, 12, 13, 14, 15]
    assert filtered.scanned == 15
    ranged = await store.read(kernel_id, 40, 100, until=45)
    assert [r.seq for r in ranged.records] == [41, 42, 43, 44, 45]


async def test_a_node_that_lost_the_lease_cannot_append(
    store: RedisTranscriptStore, leases: LeaseMap
) -> None:
    kernel_id = await owned(leases, "a")
    fenced: list[str] = []
    leases.on_fenced.append(fenced.append)
    store.append(stream_record(kernel_id, 1, "a's\n"))
    assert await store.flush(10)
    # A's lease is gone (expired while A was paused); B takes the kernel over.
    await store.redis.delete(store.keys.of(kernel_id, "lease"))
    lease_b = await leases.acquire(kernel_id, "b", 30)
    assert lease_b is not None
    assert lease_b != leases.value(kernel_id)
    # A, unaware, appends: refused by the script, not written.
    store.append(stream_record(kernel_id, 2, "stale\n"))
    await store.flush(10)
    assert fenced == [kernel_id]
    entries = await store.redis.xrange(store.keys.of(kernel_id, "log"))
    assert len(entries) == 1
    with pytest.raises(Fenced):
        await store.append_now(kernel_id, [stream_record(kernel_id, 3, "x\n")], "a:1")
    # B's token is the next one: a token is never handed out twice.
    assert int(lease_b.rpartition(":")[2]) == int(leases.value(kernel_id).rpartition(":")[2]) + 1


async def test_a_retried_append_is_written_once(
    store: RedisTranscriptStore, leases: LeaseMap
) -> None:
    kernel_id = await owned(leases)
    lease = leases.value(kernel_id)
    records = [stream_record(kernel_id, seq, f"{seq}\n") for seq in range(1, 6)]
    assert await store.append_now(kernel_id, records, lease) == 5
    # The reply was lost and the client sent it again (redis-py's retries do).
    assert await store.append_now(kernel_id, records, lease) == 5
    page = await store.read(kernel_id, 0, 100)
    assert texts(page.records) == [f"{seq}\n" for seq in range(1, 6)]


async def test_a_paused_owner_cannot_take_back_a_kernel_another_node_numbered_on(
    store: RedisTranscriptStore, leases: LeaseMap
) -> None:
    """A wrote 1-5 and was paused; B took the kernel over and wrote 6-20, then B's lease
    ran out (B slow to renew). A, resumed, with 6-8 numbered before its pause: it must
    not take the lease back as if only it had been slow (the head is not the one it
    wrote), and its 6-8 are never confirmed as written, even under a lease of its own
    (they would reach its clients as seqs that hold B's lines: a fork)."""
    kernel_id = await owned(leases, "a")
    value_a = leases.value(kernel_id)
    assert (
        await store.append_now(
            kernel_id, [stream_record(kernel_id, s, f"a{s}\n") for s in range(1, 6)], value_a
        )
        == 5
    )
    await store.redis.delete(store.keys.of(kernel_id, "lease"))
    node_b = RedisTranscriptStore(url=store.url, key_prefix=store.key_prefix)
    node_b.open()
    try:
        lease_b = await LeaseMap(node_b, "b", 30, logging.getLogger(__name__)).acquire(
            kernel_id, "b", 30
        )
        assert lease_b is not None
        b_records = [stream_record(kernel_id, s, f"b{s}\n") for s in range(6, 21)]
        assert await node_b.append_now(kernel_id, b_records, lease_b) == 20
    finally:
        node_b.close()
    await store.redis.delete(store.keys.of(kernel_id, "lease"))  # B's ran out
    assert not await leases.reacquire(kernel_id, value_a)
    assert await store.redis.get(store.keys.of(kernel_id, "lease")) is None
    # However A came to hold a lease again, its stale numbers are refused, not skipped.
    value_a2 = await leases.acquire(kernel_id, "a", 30)
    assert value_a2 is not None
    stale = [stream_record(kernel_id, s, f"a{s}\n") for s in range(6, 9)]
    with pytest.raises(Forked):
        await store.append_now(kernel_id, stale, value_a2)
    # The writer: not told written, fenced for good, nothing of A's in the transcript.
    leases.hold(kernel_id, value_a2)
    fenced: list[str] = []
    leases.on_fenced.append(fenced.append)
    told: list[int] = []
    store.written = lambda kernel, records: told.extend(r.seq for r in records)
    for record in stale:
        store.append(record)
    await wait_for(lambda: fenced == [kernel_id])
    assert told == []
    page = await store.read(kernel_id, 0, 100)
    assert texts(page.records) == [f"a{s}\n" for s in range(1, 6)] + [
        f"b{s}\n" for s in range(6, 21)
    ]
    # A record inside another writer's gap is refused the same way.
    gap = await leases.take_over(kernel_id, value_a2, "owner_lost")
    assert gap is not None
    with pytest.raises(Forked):
        await store.append_now(kernel_id, [stream_record(kernel_id, gap.seq - 1, "x\n")], value_a2)


async def test_a_takeover_numbers_on_above_the_reservation_after_a_gap(
    store: RedisTranscriptStore,
    leases: LeaseMap,
) -> None:
    store.reserve_ahead = 100
    kernel_id = await owned(leases, "a")
    for seq in range(1, 11):
        store.append(stream_record(kernel_id, seq, f"{seq}\n"))
    assert await store.flush(10)
    # A dies having handed out numbers up to its reservation (110) that it never wrote.
    await store.redis.delete(store.keys.of(kernel_id, "lease"))
    lease_b = await leases.acquire(kernel_id, "b", 30)
    assert lease_b is not None
    gap = await leases.take_over(kernel_id, lease_b, "owner_lost")
    assert gap is not None
    assert (gap.first_seq, gap.seq) == (11, 110)
    assert await store.head(kernel_id) == 110
    page = await store.read(kernel_id, 0, 100)
    assert page.records[-1].message.msg_type == GAP_MSG_TYPE
    assert page.records[-1].message.content()["reason"] == "owner_lost"
    marks = await store.marks(kernel_id, 0)
    assert [m.seq for m in marks] == [110]


async def forget_kernel(store: RedisTranscriptStore, kernel_id: str) -> None:
    """What a Redis restarted empty has of ``kernel_id``: nothing (its keys deleted)."""
    keys = [
        store.keys.of(kernel_id, what)
        for what in ("log", "marks", "ends", "handed_ends", "meta", "lease", "fence", "cursors")
    ]
    await store.redis.delete(*keys)


async def test_fencing_tokens_never_go_backwards_when_redis_forgets(
    store: RedisTranscriptStore, leases: LeaseMap
) -> None:
    """After an empty restart INCR starts at 1 again: the next lease's token is above every
    token this node has seen for the kernel, its own and its holders'."""
    kernel_id = str(uuid.uuid4())
    for node in ("a", "b", "c"):
        taken = await leases.acquire(kernel_id, node, 30)
        assert taken is not None
        await store.redis.delete(store.keys.of(kernel_id, "lease"))
    assert await leases.acquire(kernel_id, "d", 30) == "d:4"
    await forget_kernel(store, kernel_id)
    assert await leases.acquire(kernel_id, "a", 30) == "a:5"
    assert await store.redis.get(store.keys.of(kernel_id, "fence")) == b"5"


async def test_an_append_after_redis_forgot_waits_for_a_gap_over_what_it_lost(
    store: RedisTranscriptStore, leases: LeaseMap
) -> None:
    """Records 1-5 written, then Redis forgets the kernel: the next append is refused
    (StoreLost, not appended after a silent hole) until a gap record covers 1-5; the
    owner's lease taken again with a new value is not mistaken for another node's."""
    kernel_id = await owned(leases)
    lost: list[tuple[str, int]] = []
    leases.on_store_lost.append(lambda k: lost.append((k, leases.lost[k])))
    before = leases.value(kernel_id)
    for seq in range(1, 6):
        store.append(stream_record(kernel_id, seq, f"{seq}\n"))
    assert await store.flush(10)
    await forget_kernel(store, kernel_id)
    with pytest.raises(StoreLost):
        await store.append_now(kernel_id, [stream_record(kernel_id, 6, "6\n")], before)
    assert await leases.renew(kernel_id, before, 30) == (False, 0)
    # The writer on its own: kept, and the node told.
    store.append(stream_record(kernel_id, 6, "6\n"))
    await wait_for(lambda: bool(lost))
    assert lost[0] == (kernel_id, 0)
    assert (await store.read(kernel_id, 0, 100)).head == 0  # 6 pending: not the history
    # The node takes the lease again (a new value) and covers the loss.
    value = await leases.acquire(kernel_id, "a", 30)
    assert value is not None
    assert value != before
    leases.hold(kernel_id, value)
    assert await leases.reacquire(kernel_id, before)  # its own new value, not another's
    gaps = await leases.cover_loss(kernel_id, value, 5)
    assert [(gap.first_seq, gap.seq) for gap in gaps] == [(1, 5)]
    assert await store.flush(10)
    page = await store.read(kernel_id, 0, 100)
    assert [(r.first_seq, r.seq) for r in page.records] == [(1, 5), (6, 6)]
    assert page.records[0].message.content()["reason"] == "store_lost"
    assert texts(page.records)[1] == "6\n"


def reply_record(kernel_id: str, seq: int, msg_type: str, content: dict, parent: str) -> Record:
    """An IOPub message of ``msg_type`` replying to the execute request ``parent``."""
    header = {"msg_id": f"m{seq}", "msg_type": msg_type, "session": "s", "date": ""}
    parts = [
        json.dumps(header).encode(),
        json.dumps({"msg_id": parent, "msg_type": "execute_request"}).encode(),
        b"{}",
        json.dumps(content).encode(),
    ]
    return Record(kernel_id, seq, time.time(), KernelMessage.from_parts(parts))


async def forgotten_and_covered(
    store: RedisTranscriptStore, leases: LeaseMap, kernel_id: str, known: int
) -> list[Record]:
    """Redis forgets the kernel; node a takes its lease again and covers what it had
    written up to ``known``: the gap records written."""
    await forget_kernel(store, kernel_id)
    value = await leases.acquire(kernel_id, "a", 30)
    assert value is not None
    leases.hold(kernel_id, value)
    return await leases.cover_loss(kernel_id, value, known)


async def test_the_execution_ends_a_node_wrote_are_written_back_when_redis_forgets(
    store: RedisTranscriptStore, leases: LeaseMap
) -> None:
    """Two executions (busy, execute_input, output, idle; the second fails) written, then
    Redis forgets the kernel: the node writes back what says how each ended (input, error,
    idle) at their seqs, with store_lost gaps for the rest, so both still end in the
    transcript with their status; the ends kept are bounded in bytes, the newest kept."""
    kernel_id = await owned(leases)
    records = []
    error = {"ename": "ValueError", "evalue": "x", "traceback": []}
    for run, first, last in (("run-1", 1, ("stream", {"name": "stdout", "text": "1\n"})),
                             ("run-2", 5, ("error", error))):  # fmt: skip
        records.append(reply_record(kernel_id, first, "status", {"execution_state": "busy"}, run))
        records.append(reply_record(kernel_id, first + 1, "execute_input", {"code": "x"}, run))
        records.append(reply_record(kernel_id, first + 2, *last, run))
        records.append(
            reply_record(kernel_id, first + 3, "status", {"execution_state": "idle"}, run)
        )
    records.append(stream_record(kernel_id, 9, "after\n"))
    for record in records:
        store.append(record)
    assert await store.flush(10)
    gaps = await forgotten_and_covered(store, leases, kernel_id, 9)
    assert [(gap.first_seq, gap.seq) for gap in gaps] == [(1, 1), (3, 3), (5, 5), (9, 9)]
    page = await store.read(kernel_id, 0, 100)
    got = [(r.first_seq, r.seq, r.message.msg_type) for r in page.records]
    assert got == [
        (1, 1, GAP_MSG_TYPE), (2, 2, "execute_input"), (3, 3, GAP_MSG_TYPE), (4, 4, "status"),
        (5, 5, GAP_MSG_TYPE), (6, 6, "execute_input"), (7, 7, "error"), (8, 8, "status"),
        (9, 9, GAP_MSG_TYPE),
    ]  # fmt: skip
    for record in page.records:
        if record.message.msg_type == GAP_MSG_TYPE:
            assert record.message.content()["reason"] == "store_lost"
        else:
            assert record.message.raw_content == records[record.seq - 1].message.raw_content
    statuses = []
    for run in ("run-1", "run-2"):
        builder = SummaryBuilder(run)
        builder.feed([r for r in page.records if r.message.parent_msg_id == run])
        builder.feed_marks(page.records)
        summary = builder.result()
        assert summary is not None
        statuses.append((summary.status, summary.gaps != []))
    # run-1 lost its output (a gap inside it), run-2 only its busy status (before it).
    assert statuses == [("ok", True), ("error", False)]
    # The gaps are marks (summaries read them) but not ends: a node keeps none of them, and
    # after Redis loses it again the same ends go back with gaps of their own.
    marks = await store.marks(kernel_id, 0)
    assert [(m.first_seq, m.seq) for m in marks] == [(1, 1), (3, 3), (5, 5), (9, 9)]
    again = await forgotten_and_covered(store, leases, kernel_id, 9)
    assert [(gap.first_seq, gap.seq) for gap in again] == [(1, 1), (3, 3), (5, 5), (9, 9)]
    assert [r.seq for r in store.ends_since(kernel_id, 0, 9)] == [2, 4, 6, 7, 8]
    # Bounded: room for one record only, the newest.
    store.keep_ends_bytes = cost(records[-2]) + 1
    store.append(reply_record(kernel_id, 10, "status", {"execution_state": "idle"}, "run-3"))
    assert await store.flush(10)
    assert [r.seq for r in store.ends_since(kernel_id, 0, 100)] == [10]


async def test_a_follower_keeps_the_ends_it_reads_off_the_bus_and_writes_them_back(
    store: RedisTranscriptStore, leases: LeaseMap
) -> None:
    """Node b records the kernel; node a follows it over the record bus and keeps the
    execution ends it reads, so that a takes the kernel over able to write them back if
    Redis then loses them (the 50-fault run's executions that never ended were those
    whose ends only an earlier owner kept)."""
    kernel_id = str(uuid.uuid4())
    node_b = RedisTranscriptStore(url=store.url, key_prefix=store.key_prefix)
    node_b.open()
    got: list[int] = []

    class Follower:
        def deliver(self, record: Record) -> None:
            got.append(record.seq)

    bus = RecordBus(store, 1.0, lambda kernel: Follower(), logging.getLogger(__name__))
    bus.follow(kernel_id, 0)
    reading = asyncio.ensure_future(bus.run())
    try:
        lease_b = await LeaseMap(node_b, "b", 30, logging.getLogger(__name__)).acquire(
            kernel_id, "b", 30
        )
        assert lease_b is not None
        records = [
            reply_record(kernel_id, 1, "status", {"execution_state": "busy"}, "run-1"),
            reply_record(kernel_id, 2, "execute_input", {"code": "x"}, "run-1"),
            stream_record(kernel_id, 3, "out\n"),
            reply_record(kernel_id, 4, "status", {"execution_state": "idle"}, "run-1"),
        ]
        assert await node_b.append_now(kernel_id, records, lease_b) == 4
        await wait_for(lambda: len(got) >= 4)
        assert got == [1, 2, 3, 4]
        assert [r.seq for r in store.ends_since(kernel_id, 0, 10)] == [2, 4]
        # A node that joins later (or starts again) loads them from the ends stream, also
        # after newer ones came off the bus.
        late = RedisTranscriptStore(url=store.url, key_prefix=store.key_prefix)
        late.open()
        try:
            newer = reply_record(kernel_id, 6, "status", {"execution_state": "idle"}, "run-2")
            late.keep_ends(kernel_id, [newer])
            await late.load_ends(kernel_id)
            assert [r.seq for r in late.ends_since(kernel_id, 0, 10)] == [2, 4, 6]
            loaded = late.ends_since(kernel_id, 0, 4)
            assert [r.message.raw_content for r in loaded] == [
                records[1].message.raw_content,
                records[3].message.raw_content,
            ]
        finally:
            late.close()
        # Redis forgets the kernel, and b with it (its lease gone): a, which had seen up to
        # seq 4, takes it over and writes back the ends it kept before its gap.
        await forget_kernel(store, kernel_id)
        gap, layout = await taken_over_by_a(store, leases, kernel_id, seen=4)
        assert (gap.first_seq, gap.seq, gap.message.content()["reason"]) == (5, 14, "store_lost")
        assert layout == [
            (1, 1, GAP_MSG_TYPE), (2, 2, "execute_input"), (3, 3, GAP_MSG_TYPE),
            (4, 4, "status"), (5, 14, GAP_MSG_TYPE),
        ]  # fmt: skip
    finally:
        reading.cancel()  # as the node stops it: a blocking read may hold on to it
        await asyncio.wait([reading], timeout=2)
        await bus.close()
        node_b.close()


async def test_the_ends_an_owner_wrote_before_it_lost_its_lease_are_handed_to_the_next(
    store: RedisTranscriptStore, leases: LeaseMap
) -> None:
    """Node b records the kernel and writes two executions; node a follows it but never
    read them off the bus (Redis went away first). Redis comes back empty and b, which
    could not renew its lease meanwhile, only follows now: it hands the ends it kept over,
    and a, taking the kernel over, writes them back at their seqs before its gap. Without
    it both executions never ended in the transcript (issue 25's 50-fault runs: 4 to 11 a
    run, each an idle only its earlier owner kept)."""
    kernel_id = str(uuid.uuid4())
    node_b = RedisTranscriptStore(url=store.url, key_prefix=store.key_prefix)
    node_b.open()
    try:
        leases_b = LeaseMap(node_b, "b", 30, logging.getLogger(__name__))
        lease_b = await leases_b.acquire(kernel_id, "b", 30)
        assert lease_b is not None
        leases_b.hold(kernel_id, lease_b)
        records = []
        for run, first in (("run-1", 1), ("run-2", 5)):
            records += [
                reply_record(kernel_id, first, "status", {"execution_state": "busy"}, run),
                reply_record(kernel_id, first + 1, "execute_input", {"code": "x"}, run),
                stream_record(kernel_id, first + 2, "out\n"),
                reply_record(kernel_id, first + 3, "status", {"execution_state": "idle"}, run),
            ]
        for record in records:
            node_b.append(record)
        assert await node_b.flush(10)
        assert [r.seq for r in node_b.ends_since(kernel_id, 0, 100)] == [2, 4, 6, 8]
        await forget_kernel(store, kernel_id)
        assert await node_b.hand_ends(kernel_id) == 4
        await store.load_ends(kernel_id)
        # a had seen up to seq 1 only.
        gap, layout = await taken_over_by_a(store, leases, kernel_id, seen=1)
        assert (gap.first_seq, gap.seq, gap.message.content()["reason"]) == (9, 18, "store_lost")
        assert layout == [
            (1, 1, GAP_MSG_TYPE), (2, 2, "execute_input"), (3, 3, GAP_MSG_TYPE),
            (4, 4, "status"), (5, 5, GAP_MSG_TYPE), (6, 6, "execute_input"),
            (7, 7, GAP_MSG_TYPE), (8, 8, "status"), (9, 18, GAP_MSG_TYPE),
        ]  # fmt: skip
        page = await store.read(kernel_id, 0, 100)
        for record in page.records:
            if record.message.msg_type != GAP_MSG_TYPE:
                assert record.message.raw_content == records[record.seq - 1].message.raw_content
    finally:
        node_b.close()


async def taken_over_by_a(
    store: RedisTranscriptStore, leases: LeaseMap, kernel_id: str, seen: int
) -> tuple[Record, list[tuple[int, int, str]]]:
    """Node a takes the kernel over, having seen up to ``seen`` (``reserve_ahead`` 10):
    its gap record, and the transcript as ``(first_seq, seq, msg_type)``."""
    lease_a = await leases.acquire(kernel_id, "a", 30)
    assert lease_a is not None
    store.reserve_ahead = 10
    gap = await leases.take_over(kernel_id, lease_a, "owner_lost", seen=seen)
    assert gap is not None
    page = await store.read(kernel_id, 0, 100)
    return gap, [(r.first_seq, r.seq, r.message.msg_type) for r in page.records]


async def wait_for(predicate: Any, timeout: float = 10) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_retention_keeps_the_newest_and_says_what_was_discarded(
    store: RedisTranscriptStore,
    leases: LeaseMap,
) -> None:
    store.max_records_per_kernel = 100
    kernel_id = await owned(leases)
    for seq in range(1, 2001):
        store.append(stream_record(kernel_id, seq, f"{seq}\n"))
    store.append(
        Record(
            kernel_id,
            2001,
            time.time(),
            lifecycle_status("dead", "shutdown", msg_id="m", date="", session="s"),
        )
    )
    assert await store.flush(10)
    page = await store.read(kernel_id, 0, 10)
    assert page.first_seq > 1
    assert page.first_seq <= 1902  # MAXLEN ~ keeps at least the last 100
    assert page.discarded == (1, page.first_seq - 1)
    assert page.records[0].seq == page.first_seq
    # Marks live in their own stream, so a summary still finds the end.
    assert [m.seq for m in await store.marks(kernel_id, 0)] == [2001]


async def test_leases_renew_expire_and_release(
    store: RedisTranscriptStore, leases: LeaseMap
) -> None:
    kernel_id = str(uuid.uuid4())
    lease = await leases.acquire(kernel_id, "a", 0.3)
    assert lease is not None
    assert await leases.acquire(kernel_id, "b", 0.3) is None
    assert await leases.renew(kernel_id, lease, 0.3) == (True, 0)
    await asyncio.sleep(0.5)
    assert await leases.holder(kernel_id) is None  # expired: nobody renewed it
    assert await leases.renew(kernel_id, lease, 0.3) == (False, 0)
    taken = await leases.acquire(kernel_id, "b", 30)
    assert taken is not None
    assert not await leases.release(kernel_id, lease)  # not a's any more
    assert await leases.release(kernel_id, taken)
    assert await leases.holder(kernel_id) is None


async def test_an_unreachable_redis_stops_the_start_with_one_clear_line() -> None:
    redis_url()  # the same precondition as the others
    unreachable = RedisTranscriptStore(url="redis://:secret@127.0.0.1:1/0")
    with pytest.raises(StoreUnavailable) as refused:
        unreachable.open()
    assert "127.0.0.1:1" in str(refused.value)
    assert "secret" not in str(refused.value)


async def test_a_paused_redis_makes_health_say_the_writes_are_stalled(tmp_path: Any) -> None:
    """A paused Redis (or one the network cut off) fails no write until the socket times
    out, seconds later, while nothing becomes durable: health says ``writes_stalled``
    (degraded) once a write has waited ``stall_after``, and ``ok`` again once it lands,
    with every record written once. Before, it said ``ok`` throughout a pause shorter than
    the socket timeout (issue 25: health ``ok`` while failing)."""
    require_redis_server()
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        await server.wait_ready()
        store = RedisTranscriptStore(url=server.url, stall_after=0.3)
        store.open()
        leases = LeaseMap(store, "a", 60, logging.getLogger(__name__))
        kernel_id = await owned(leases)
        store.append(stream_record(kernel_id, 1, "before\n"))
        assert await store.flush(seconds(10))
        assert store.health().state is State.OK
        assert server.process is not None
        server.process.send_signal(signal.SIGSTOP)
        try:
            store.append(stream_record(kernel_id, 2, "during\n"))
            await wait_until(
                lambda: store.health().reason == "writes_stalled", "health to say so", 10
            )
            health = store.health()
            assert health.state is State.DEGRADED
            assert health.details["write_waiting_seconds"] >= 0.3
        finally:
            server.process.send_signal(signal.SIGCONT)
        assert await store.flush(seconds(10))
        assert store.health().state is State.OK
        page = await store.read(kernel_id, 0, 10)
        assert texts(page.records) == ["before\n", "during\n"]
        store.close()
    finally:
        server.stop()


async def test_the_first_requests_after_redis_restarted_are_answered(tmp_path: Any) -> None:
    """Redis restarted: every pooled connection is dead. A read (several at once, as the
    pool holds several) is sent again on a new connection and answered; before, the first
    request on each dead connection failed (the transcript API answered 500 in the
    50-fault run)."""
    require_redis_server()
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        await server.wait_ready()
        store = RedisTranscriptStore(url=server.url)
        store.open()
        kernel_id = str(uuid.uuid4())
        # Four connections in the pool, each used once.
        await asyncio.gather(*(store.read(kernel_id, 0, 10) for _ in range(4)))
        server.kill()
        server.start()
        await server.wait_ready()
        pages = await asyncio.gather(*(store.read(kernel_id, 0, 10) for _ in range(4)))
        assert [page.head for page in pages] == [0, 0, 0, 0]
        store.close()
    finally:
        server.stop()
