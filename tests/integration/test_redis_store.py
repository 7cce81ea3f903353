"""The Redis Streams transcript store and its leases, on this machine's real Redis.

Invariant 1 across nodes: a node that lost a kernel's lease cannot append (fencing), a
retried append cannot duplicate, and a node taking over numbers on above everything the
last owner may have given out, after an explicit gap record.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest

from kernel_gateway_stream.core.errors import StoreUnavailable
from kernel_gateway_stream.core.marks import GAP_MSG_TYPE, lifecycle_status
from kernel_gateway_stream.core.messages import Record
from kernel_gateway_stream.stores.redis import Fenced, RedisTranscriptStore

from .test_several_nodes import redis_url
from .test_store import execute_request_header, kernel_like_record, stream_record


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


async def owned(store: RedisTranscriptStore, node: str = "a") -> str:
    kernel_id = str(uuid.uuid4())
    lease = await store.acquire(kernel_id, node, 30)
    assert lease is not None
    store.leases[kernel_id] = lease
    return kernel_id


def texts(records: list[Record]) -> list[str]:
    return [r.message.text or "" for r in records]


async def test_records_are_readable_at_once_and_read_back_equal(
    store: RedisTranscriptStore,
) -> None:
    kernel_id = await owned(store)
    parent = execute_request_header()
    appended = [kernel_like_record(kernel_id, seq, f"line {seq}\n", parent) for seq in range(1, 51)]
    for record in appended:
        store.append(record)
    # Before any write reached Redis: from the pending buffer.
    early = await store.read(kernel_id, 0, 1000)
    assert [r.seq for r in early.records] == list(range(1, 51))
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


async def test_a_node_that_lost_the_lease_cannot_append(store: RedisTranscriptStore) -> None:
    kernel_id = await owned(store, "a")
    fenced: list[str] = []
    store.on_fenced.append(fenced.append)
    store.append(stream_record(kernel_id, 1, "a's\n"))
    assert await store.flush(10)
    # A's lease is gone (expired while A was paused); B takes the kernel over.
    await store.redis.delete(store.keys.of(kernel_id, "lease"))
    lease_b = await store.acquire(kernel_id, "b", 30)
    assert lease_b is not None
    assert lease_b != store.leases[kernel_id]
    # A, unaware, appends: refused by the script, not written.
    store.append(stream_record(kernel_id, 2, "stale\n"))
    await store.flush(10)
    assert fenced == [kernel_id]
    entries = await store.redis.xrange(store.keys.of(kernel_id, "log"))
    assert len(entries) == 1
    with pytest.raises(Fenced):
        await store.append_now(kernel_id, [stream_record(kernel_id, 3, "x\n")], "a:1")
    # B's token is the next one: a token is never handed out twice.
    assert int(lease_b.rpartition(":")[2]) == int(store.leases[kernel_id].rpartition(":")[2]) + 1


async def test_a_retried_append_is_written_once(store: RedisTranscriptStore) -> None:
    kernel_id = await owned(store)
    lease = store.leases[kernel_id]
    records = [stream_record(kernel_id, seq, f"{seq}\n") for seq in range(1, 6)]
    assert await store.append_now(kernel_id, records, lease) == 5
    # The reply was lost and the client sent it again (redis-py's retries do).
    assert await store.append_now(kernel_id, records, lease) == 5
    page = await store.read(kernel_id, 0, 100)
    assert texts(page.records) == [f"{seq}\n" for seq in range(1, 6)]


async def test_a_takeover_numbers_on_above_the_reservation_after_a_gap(
    store: RedisTranscriptStore,
) -> None:
    store.reserve_ahead = 100
    kernel_id = await owned(store, "a")
    for seq in range(1, 11):
        store.append(stream_record(kernel_id, seq, f"{seq}\n"))
    assert await store.flush(10)
    # A dies having handed out numbers up to its reservation (110) that it never wrote.
    await store.redis.delete(store.keys.of(kernel_id, "lease"))
    lease_b = await store.acquire(kernel_id, "b", 30)
    assert lease_b is not None
    gap = await store.take_over(kernel_id, lease_b, "owner_lost")
    assert gap is not None
    assert (gap.first_seq, gap.seq) == (11, 110)
    assert await store.head(kernel_id) == 110
    page = await store.read(kernel_id, 0, 100)
    assert page.records[-1].message.msg_type == GAP_MSG_TYPE
    assert page.records[-1].message.content()["reason"] == "owner_lost"
    marks = await store.marks(kernel_id, 0)
    assert [m.seq for m in marks] == [110]


async def test_retention_keeps_the_newest_and_says_what_was_discarded(
    store: RedisTranscriptStore,
) -> None:
    store.max_records_per_kernel = 100
    kernel_id = await owned(store)
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


async def test_leases_renew_expire_and_release(store: RedisTranscriptStore) -> None:
    kernel_id = str(uuid.uuid4())
    lease = await store.acquire(kernel_id, "a", 0.3)
    assert lease is not None
    assert await store.acquire(kernel_id, "b", 0.3) is None
    assert await store.renew(kernel_id, lease, 0.3)
    await asyncio.sleep(0.5)
    assert await store.holder(kernel_id) is None  # expired: nobody renewed it
    assert not await store.renew(kernel_id, lease, 0.3)
    taken = await store.acquire(kernel_id, "b", 30)
    assert taken is not None
    assert not await store.release(kernel_id, lease)  # not a's any more
    assert await store.release(kernel_id, taken)
    assert await store.holder(kernel_id) is None


async def test_an_unreachable_redis_stops_the_start_with_one_clear_line() -> None:
    redis_url()  # the same precondition as the others
    unreachable = RedisTranscriptStore(url="redis://:secret@127.0.0.1:1/0")
    with pytest.raises(StoreUnavailable) as refused:
        unreachable.open()
    assert "127.0.0.1:1" in str(refused.value)
    assert "secret" not in str(refused.value)
