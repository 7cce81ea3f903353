"""The SQLite transcript store on a real file: durability, resume points, retention."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from typing import Any

from kernel_gateway_stream.core.messages import KernelMessage, Record
from kernel_gateway_stream.stores.sqlite import SQLiteTranscriptStore

from ..timing import seconds


def stream_record(kernel_id: str, seq: int, text: str, at: float | None = None) -> Record:
    message = KernelMessage.synthesize(
        "stream", {"name": "stdout", "text": text}, msg_id=f"m{seq}", date="", session="s"
    )
    return Record(kernel_id, seq, time.time() if at is None else at, message)


def open_store(path: str, **traits: Any) -> SQLiteTranscriptStore:
    store = SQLiteTranscriptStore(path=path, **traits)
    store.open()
    return store


async def test_records_are_readable_at_once_and_durable_after_flush(tmp_path: Any) -> None:
    """A record is readable the moment it is appended (from memory), and identical once
    committed; a second store on the same file sees it (a restart)."""
    path = str(tmp_path / "t.sqlite3")
    store = open_store(path)
    for seq in range(1, 1001):
        store.append(stream_record("k", seq, f"{seq}\n"))
    page = await store.read("k", 0, 5000)
    assert [r.seq for r in page.records] == list(range(1, 1001))
    await store.flush()
    again = await store.read("k", 0, 5000)
    assert [r.message.text for r in again.records] == [f"{s}\n" for s in range(1, 1001)]
    assert again.records[0].message.raw_header == page.records[0].message.raw_header
    store.close()
    reopened = open_store(path)
    assert await reopened.head("k") == 1000
    page = await reopened.read("k", 990, 100)
    assert [r.seq for r in page.records] == list(range(991, 1001))
    reopened.close()


async def test_filters_and_limits(tmp_path: Any) -> None:
    store = open_store(str(tmp_path / "t.sqlite3"))
    for seq in range(1, 11):
        store.append(stream_record("k", seq, "x"))
    await store.flush()
    for seq in range(11, 21):  # still in memory: filters apply there too
        store.append(stream_record("k", seq, "y"))
    page = await store.read("k", 5, 8)
    assert [r.seq for r in page.records] == list(range(6, 14))
    page = await store.read("k", 0, 100, until=12)
    assert page.records[-1].seq == 12
    page = await store.read("k", 0, 100, msg_types=["status"])
    assert page.records == []
    store.close()


async def test_writer_blocked_by_the_disk_loses_nothing(tmp_path: Any) -> None:
    """Invariant 4: while the database is locked, append() does not wait and reads are
    served from memory; once the lock goes, everything is committed."""
    path = str(tmp_path / "t.sqlite3")
    store = open_store(path)
    blocker = sqlite3.connect(path, timeout=30)
    blocker.execute("BEGIN EXCLUSIVE")
    started = time.monotonic()
    for seq in range(1, 5001):
        store.append(stream_record("k", seq, "z"))
    assert time.monotonic() - started < seconds(5)  # generous: it must not wait on the lock
    page = await store.read("k", 0, 10000)
    assert len(page.records) == 5000
    flushed = asyncio.ensure_future(store.flush())
    await asyncio.sleep(0.5)
    assert not flushed.done()
    blocker.rollback()
    blocker.close()
    await asyncio.wait_for(flushed, seconds(60))
    (count,) = sqlite3.connect(path).execute("SELECT count(*) FROM records").fetchone()
    assert count == 5000
    store.close()


async def test_retention_by_size_and_the_discarded_marker(tmp_path: Any) -> None:
    """Retention discards the oldest records past the byte limit; a reader asking for them
    is told which range is gone."""
    path = str(tmp_path / "t.sqlite3")
    store = open_store(path, max_bytes_per_kernel=20000, max_age=0.0)
    for seq in range(1, 401):
        store.append(stream_record("k", seq, "x" * 100))
    await store.flush()
    connection = sqlite3.connect(path)
    store.apply_retention(connection, time.time())
    page = await store.read("k", 0, 1000)
    assert page.first_seq > 1
    assert page.discarded == (1, page.first_seq - 1)
    assert page.records[0].seq == page.first_seq
    assert page.records[-1].seq == 400
    assert sum(r.message.size for r in page.records) <= 20000
    assert (await store.read("k", page.first_seq - 1, 10)).discarded is None
    store.close()


async def test_retention_after_shutdown_and_by_age(tmp_path: Any) -> None:
    path = str(tmp_path / "t.sqlite3")
    store = open_store(path, keep_after_shutdown=60.0, max_age=3600.0)
    now = time.time()
    store.kernel_started("ended", now - 1000)
    store.append(stream_record("ended", 1, "a", at=now - 1000))
    store.kernel_ended("ended", now - 120)
    store.append(stream_record("old", 1, "old", at=now - 7200))
    store.append(stream_record("old", 2, "new", at=now))
    await store.flush()
    store.apply_retention(sqlite3.connect(path), now)
    ended = await store.info("ended")
    assert ended is not None
    assert ended.head == 1
    assert ended.first_seq == 2
    assert (await store.read("ended", 0, 10)).records == []
    old = await store.read("old", 0, 10)
    assert [r.message.text for r in old.records] == ["new"]
    assert old.discarded == (1, 1)
    store.close()


async def test_old_session_cursors_are_purged(tmp_path: Any) -> None:
    path = str(tmp_path / "t.sqlite3")
    store = open_store(path, max_age=3600.0, keep_after_shutdown=60.0)
    store.save_cursor("k", "fresh", 7)
    await store.flush()
    connection = sqlite3.connect(path)
    with connection:
        connection.execute("INSERT INTO cursors VALUES ('k', 'stale', 3, ?)", (time.time() - 7200,))
    store.apply_retention(connection, time.time())
    rows = connection.execute("SELECT session_id FROM cursors").fetchall()
    assert rows == [("fresh",)]
    store.close()


async def test_session_cursors_survive_a_restart(tmp_path: Any) -> None:
    path = str(tmp_path / "t.sqlite3")
    store = open_store(path)
    store.save_cursor("k", "session", 42)
    assert await store.load_cursor("k", "session") == 42
    await store.flush()
    store.close()
    reopened = open_store(path)
    assert await reopened.load_cursor("k", "session") == 42
    assert await reopened.load_cursor("k", "other") is None
    reopened.close()


async def test_a_record_sqlite_refuses_does_not_stop_the_others(tmp_path: Any) -> None:
    """A permanent error on one record (here: a row over SQLite's length limit) is isolated:
    the other records are committed, the refused one is kept as a placeholder under its
    seq (numbering stays gap-free), and flush() returns."""
    path = str(tmp_path / "t.sqlite3")
    store = open_store(path)
    store._write_batch = _with_limit(store._write_batch)  # type: ignore[method-assign]
    store.append(stream_record("k", 1, "small"))
    store.append(stream_record("k", 2, "x" * 50000))
    store.append(stream_record("k", 3, "after"))
    await asyncio.wait_for(store.flush(), seconds(30))
    page = await store.read("k", 0, 10)
    assert [r.seq for r in page.records] == [1, 2, 3]
    assert page.records[1].message.msg_type == "kernel_gateway_stream_unstored"
    assert page.records[2].message.text == "after"
    store.close()


def _with_limit(write_batch: Any) -> Any:
    """The writer's batch function, with SQLite's length limit lowered on its connection."""

    def limited(connection: sqlite3.Connection, batch: list[Any], records: list[Record]) -> None:
        connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 10000)
        write_batch(connection, batch, records)

    return limited


async def test_records_read_back_equal_those_appended(tmp_path: Any) -> None:
    """What the store returns after a commit is the record that went in, with the peeked
    fields readers use (stream text, execution_state); parent_msg_type is not kept."""
    store = open_store(str(tmp_path / "t.sqlite3"))
    status = KernelMessage.synthesize(
        "status", {"execution_state": "idle"}, msg_id="s1", date="", session="s"
    )
    records = [stream_record("k", 1, "text"), Record("k", 2, time.time(), status)]
    for record in records:
        store.append(record)
    await store.flush()
    page = await store.read("k", 0, 10)
    assert [r.message for r in page.records] == [r.message for r in records]
    store.close()
