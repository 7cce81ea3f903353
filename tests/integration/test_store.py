"""The SQLite transcript store on a real file: durability, bounds, faults, retention.

Invariants 1 (no reused number; gaps explicit), 2 (nothing lost on the way to the
transcript) and 4 (the Tap never waits for the disk; every buffer has a bound).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from kernel_gateway_stream.core.errors import StoreUnavailable
from kernel_gateway_stream.core.health import State
from kernel_gateway_stream.core.marks import GAP_MSG_TYPE
from kernel_gateway_stream.core.messages import KernelMessage, Record
from kernel_gateway_stream.stores import sqlite_writer
from kernel_gateway_stream.stores.sqlite import SQLiteTranscriptStore

from ..timing import seconds


def stream_record(kernel_id: str, seq: int, text: str, at: float | None = None) -> Record:
    message = KernelMessage.synthesize(
        "stream", {"name": "stdout", "text": text}, msg_id=f"m{seq}", date="", session="s"
    )
    return Record(kernel_id, seq, time.time() if at is None else at, message)


def kernel_like_record(kernel_id: str, seq: int, text: str, parent: bytes) -> Record:
    """A stream message shaped as ipykernel sends it: a full header, a parent header."""
    header = {
        "msg_id": f"{uuid.uuid4().hex[:24]}_{os.getpid()}_{seq}",
        "msg_type": "stream",
        "username": "user",
        "session": "0f5e5b16-8e5a6b1c0d7f4c3b9a2e",
        "date": "2026-11-22T10:11:12.131415Z",
        "version": "5.3",
    }
    parts = [
        json.dumps(header).encode(),
        parent,
        b"{}",
        json.dumps({"name": "stdout", "text": text}).encode(),
    ]
    return Record(kernel_id, seq, time.time(), KernelMessage.from_parts(parts))


def execute_request_header() -> bytes:
    return json.dumps(
        {
            "msg_id": uuid.uuid4().hex,
            "msg_type": "execute_request",
            "username": "user",
            "session": uuid.uuid4().hex,
            "date": "2026-11-22T10:11:12.131415Z",
            "version": "5.3",
        }
    ).encode()


_CRASH = """
import asyncio, os, signal, time
from kernel_gateway_stream.core.messages import KernelMessage, Record
from kernel_gateway_stream.stores import sqlite_writer
from kernel_gateway_stream.stores.sqlite import SQLiteTranscriptStore

async def main():
    store = SQLiteTranscriptStore(path={path!r}, reserve_ahead=1000)
    store.open()
    for seq in range(1, 301):
        message = KernelMessage.synthesize(
            "stream", {{"name": "stdout", "text": "x"}}, msg_id=str(seq), date="", session=""
        )
        store.append(Record("k", seq, time.time(), message))
    assert await store.flush(60)
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


def open_store(path: str, **traits: Any) -> SQLiteTranscriptStore:
    store = SQLiteTranscriptStore(path=path, **traits)
    store.open()
    return store


def covered(records: list[Record]) -> list[int]:
    """Every sequence number the records stand for (a gap record for its whole span)."""
    return [seq for record in records for seq in range(record.first_seq, record.seq + 1)]


async def test_records_are_readable_at_once_and_durable_after_flush(tmp_path: Path) -> None:
    """A record is readable the moment it is appended (from memory), and identical once
    committed; a second store on the same file sees it (a restart)."""
    path = str(tmp_path / "t.sqlite3")
    store = open_store(path)
    for seq in range(1, 1001):
        store.append(stream_record("k", seq, f"{seq}\n"))
    page = await store.read("k", 0, 5000)
    assert [r.seq for r in page.records] == list(range(1, 1001))
    assert await store.flush(seconds(30))
    again = await store.read("k", 0, 5000)
    assert [r.message.text for r in again.records] == [f"{s}\n" for s in range(1, 1001)]
    assert again.records[0].message.raw_header == page.records[0].message.raw_header
    store.close()
    reopened = open_store(path)
    assert reopened.recovered == []  # a clean stop leaves no gap
    assert await reopened.head("k") == 1000
    page = await reopened.read("k", 990, 100)
    assert [r.seq for r in page.records] == list(range(991, 1001))
    reopened.close()


async def test_a_page_holds_every_record_up_to_the_head_it_gives(tmp_path: Path) -> None:
    """Invariant 1 as a reader sees it: a page from 0 holds every seq from 1 to its head,
    even when records arrive and are committed while the read waits on SQLite. (A fresh
    clone's ``test_every_iopub_message_has_one_seq_gap_free`` once got head 317 and
    records up to 310: the records in memory were taken before the head was read, and in
    between the kernel's last 7 messages came and everything was committed.)"""
    path = str(tmp_path / "t.sqlite3")
    store = open_store(path)
    blocker = sqlite3.connect(path, timeout=30)  # nothing is committed yet: all in memory
    blocker.execute("BEGIN EXCLUSIVE")
    for seq in range(1, 101):
        store.append(stream_record("k", seq, f"{seq}\n"))
    run = store._run
    arrived: list[int] = []

    async def meanwhile(sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        if not arrived:  # the read's first wait on SQLite: the kernel goes on printing
            arrived.extend(range(101, 108))
            for seq in arrived:
                store.append(stream_record("k", seq, f"{seq}\n"))
            blocker.rollback()  # and the writer commits all of it
            assert await store.flush(seconds(30))
        return await run(sql, args)

    store._run = meanwhile  # type: ignore[method-assign]
    page = await store.read("k", 0, 5000)
    assert arrived, "the read waited on SQLite"
    assert page.head >= 100
    assert [r.seq for r in page.records] == list(range(1, page.head + 1))
    blocker.close()
    store.close()


async def test_filters_limits_and_byte_bounded_pages(tmp_path: Path) -> None:
    """Reads filter by parent and type (from disk and from memory alike), stop at a limit
    or a byte bound, and with ``marks`` let lifecycle statuses through every filter."""
    store = open_store(str(tmp_path / "t.sqlite3"), chunk_max_bytes=2000)
    parent = execute_request_header()
    parent_id = json.loads(parent)["msg_id"]
    for seq in range(1, 11):
        store.append(kernel_like_record("k", seq, "x", parent if seq % 2 else b"{}"))
    dead = KernelMessage.synthesize(
        "status", {"execution_state": "dead", "reason": "shutdown"}, msg_id="d", date="", session=""
    )
    store.append(Record("k", 11, time.time(), dead))
    assert await store.flush(seconds(30))
    for seq in range(12, 21):  # still in memory: filters apply there too
        store.append(kernel_like_record("k", seq, "y", parent if seq % 2 else b"{}"))
    page = await store.read("k", 5, 8)
    assert [r.seq for r in page.records] == list(range(6, 14))
    page = await store.read("k", 0, 100, until=12)
    assert page.records[-1].seq == 12
    assert (await store.read("k", 0, 100, msg_types=["execute_result"])).records == []
    own = await store.read("k", 0, 100, parent=parent_id)
    assert [r.seq for r in own.records] == [1, 3, 5, 7, 9, 13, 15, 17, 19]
    assert all(r.message.parent_msg_id == parent_id for r in own.records)
    with_marks = await store.read("k", 0, 100, parent=parent_id, marks=True)
    assert [r.seq for r in with_marks.records] == [1, 3, 5, 7, 9, 11, 13, 15, 17, 19]
    size = own.records[0].message.size
    assert [r.seq for r in (await store.read("k", 0, 100, max_bytes=size)).records] == [1]
    bounded = await store.read("k", 0, 100, max_bytes=size + 1)
    assert [r.seq for r in bounded.records] == [1, 2]
    assert [r.seq for r in await store.marks("k", 0)] == [11]
    store.close()


async def test_writer_blocked_by_the_disk_loses_nothing(tmp_path: Path) -> None:
    """Invariant 4: while the database is locked, append() does not wait, reads are served
    from memory and the store says it is degraded; once the lock goes, everything is
    committed and it is ok again."""
    path = str(tmp_path / "t.sqlite3")
    store = open_store(path, batch_linger=0.0)
    blocker = sqlite3.connect(path, timeout=30)
    blocker.execute("BEGIN EXCLUSIVE")
    started = time.monotonic()
    for seq in range(1, 5001):
        store.append(stream_record("k", seq, "z"))
    assert time.monotonic() - started < seconds(5)  # generous: it must not wait on the lock
    page = await store.read("k", 0, 10000)
    assert len(page.records) == 5000
    assert not await store.flush(0.5)
    blocker.rollback()
    blocker.close()
    assert await store.flush(seconds(60))
    assert store.health().state is State.OK
    store.close()
    reopened = open_store(path)
    assert covered((await reopened.read("k", 0, 10000)).records) == list(range(1, 5001))
    reopened.close()


async def test_backlog_past_its_bound_becomes_one_explicit_gap(tmp_path: Path) -> None:
    """Invariants 1 and 4: with the disk refusing writes, what waits in memory stays under
    max_pending_bytes; records past it are numbered but not kept, the store says failing,
    and once writes go through the transcript holds one gap record for exactly the dropped
    range: every number 1..N is accounted for, none twice."""
    path = str(tmp_path / "t.sqlite3")
    store = open_store(path, max_pending_bytes=100_000, batch_linger=0.0)
    blocker = sqlite3.connect(path, timeout=30)
    blocker.execute("BEGIN EXCLUSIVE")
    for seq in range(1, 2001):
        store.append(stream_record("k", seq, "x" * 100))
    stats = store.pending.stats()
    assert stats.bytes <= 100_000
    assert stats.dropped_records > 0
    health = store.health()
    assert (health.state, health.reason) == (State.FAILING, "backlog_full_records_dropped")
    # While dropping, a reader is told (a gap record for the open range).
    assert covered((await store.read("k", 0, 10000)).records) == list(range(1, 2001))
    blocker.rollback()
    blocker.close()
    assert await store.flush(seconds(60))
    store.append(stream_record("k", 2001, "after"))
    assert await store.flush(seconds(60))
    records = (await store.read("k", 0, 10000)).records
    assert covered(records) == list(range(1, 2002))
    gaps = [r for r in records if r.message.msg_type == GAP_MSG_TYPE]
    assert len(gaps) == 1
    assert gaps[0].message.content()["reason"] == "store_backlog_full"
    assert gaps[0].span == stats.dropped_records
    assert records[-1].message.text == "after"
    assert store.health().state is State.OK
    store.close()


async def test_after_a_crash_numbers_continue_above_the_reservation(tmp_path: Path) -> None:
    """Invariant 1 (item 11c): the store reserves numbers durably ahead of those given
    out; a store opened after an unclean stop (here: the first one never closed) starts
    above the reservation and records the range it skipped as one gap record, so no
    number a client may have seen is given to another message."""
    path = str(tmp_path / "t.sqlite3")
    crash = subprocess.run(
        [sys.executable, "-c", _CRASH.format(path=path)], capture_output=True, timeout=seconds(60)
    )
    assert crash.returncode == -signal.SIGKILL, crash.stderr
    reopened = open_store(path, reserve_ahead=1000)
    assert reopened.recovered == [("k", 301, 1300)]
    assert await reopened.head("k") == 1300
    page = await reopened.read("k", 250, 100)
    assert covered(page.records) == list(range(251, 1301))
    gap = page.records[-1]
    assert (gap.message.msg_type, gap.first_seq, gap.seq) == (GAP_MSG_TYPE, 301, 1300)
    assert gap.message.content()["reason"] == "gateway_stopped"
    assert [r.seq for r in await reopened.marks("k", 0)] == [1300]
    reopened.close()


@pytest.mark.parametrize("text_bytes", [64, 1024, 65536])
async def test_bytes_on_disk_per_byte_of_output(tmp_path: Path, text_bytes: int) -> None:
    """Item 17: the database takes at most 1.5 bytes on disk per byte of output (the
    messages as the kernel sent them), for small, medium and large messages, and retention
    counts bytes on disk: what the store counts is within 25 % of the file's size."""
    path = str(tmp_path / "t.sqlite3")
    store = open_store(path)
    parent = execute_request_header()
    count = max(200, 8_000_000 // (text_bytes + 500))
    payload = 0
    for seq in range(1, count + 1):
        record = kernel_like_record("k", seq, "x" * (text_bytes - 1) + "\n", parent)
        payload += record.message.size
        store.append(record)
    assert await store.flush(seconds(120))
    store.close()
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    (counted,) = connection.execute("SELECT bytes FROM kernels").fetchone()
    connection.close()
    on_disk = sum(os.stat(name).st_size for name in (path, path + "-wal") if os.path.exists(name))
    ratio = on_disk / payload
    print(f"{text_bytes} B messages: {ratio:.2f} bytes on disk per byte of output")
    assert ratio <= 1.5
    assert 0.75 <= counted / on_disk <= 1.25


@pytest.mark.parametrize("step_bytes", [sqlite_writer.RETENTION_STEP_BYTES, 5000])
async def test_retention_by_size_and_the_discarded_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step_bytes: int
) -> None:
    """Retention discards the oldest records past the byte limit (bytes on disk); a reader
    asking for them is told which range is gone. It goes in steps of at most
    RETENTION_STEP_BYTES (batches are written between them): with small steps, several,
    and the same result."""
    monkeypatch.setattr(sqlite_writer, "RETENTION_STEP_BYTES", step_bytes)
    steps: list[int] = []
    discard = sqlite_writer.TranscriptWriter._discard

    def counted_discard(self: Any, connection: Any, key: int, kernel_id: str, *rest: int) -> None:
        steps.append(rest[-1])
        discard(self, connection, key, kernel_id, *rest)

    monkeypatch.setattr(sqlite_writer.TranscriptWriter, "_discard", counted_discard)
    path = str(tmp_path / "t.sqlite3")
    store = open_store(path, max_bytes_per_kernel=40000, max_age=0.0, chunk_max_bytes=2000)
    for seq in range(1, 401):
        store.append(stream_record("k", seq, "x" * 100))
    assert await store.flush(seconds(30))
    await store.apply_retention()
    # Over the bound by far more than 5,000 bytes: then several steps, else one.
    assert len(steps) > 1 if step_bytes == 5000 else len(steps) == 1
    assert steps == sorted(steps)
    page = await store.read("k", 0, 1000)
    assert page.first_seq > 1
    assert page.discarded == (1, page.first_seq - 1)
    assert page.records[0].seq == page.first_seq
    assert page.records[-1].seq == 400
    (counted,) = sqlite3.connect(path).execute("SELECT bytes FROM kernels").fetchone()
    assert counted <= 40000
    assert (await store.read("k", page.first_seq - 1, 10)).discarded is None
    store.close()


async def test_retention_after_shutdown_and_by_age(tmp_path: Path) -> None:
    """A shut-down kernel's transcript goes whole after keep_after_shutdown (its row too:
    nothing is kept for kernels long gone); records older than max_age go."""
    path = str(tmp_path / "t.sqlite3")
    store = open_store(path, keep_after_shutdown=60.0, max_age=3600.0, chunk_max_bytes=100)
    now = time.time()
    store.kernel_started("ended", now - 1000)
    store.append(stream_record("ended", 1, "a", at=now - 1000))
    store.kernel_ended("ended", now - 120)
    store.append(stream_record("old", 1, "old", at=now - 7200))
    store.append(stream_record("old", 2, "new", at=now))
    assert await store.flush(seconds(30))
    await store.apply_retention()
    assert await store.info("ended") is None
    old = await store.read("old", 0, 10)
    assert [r.message.text for r in old.records] == ["new"]
    assert old.discarded == (1, 1)
    store.close()


async def test_old_session_cursors_are_purged(tmp_path: Path) -> None:
    path = str(tmp_path / "t.sqlite3")
    store = open_store(path, max_age=3600.0, keep_after_shutdown=60.0)
    store.save_cursor("k", "fresh", 7)
    assert await store.flush(seconds(30))
    connection = sqlite3.connect(path)
    with connection:
        connection.execute("INSERT INTO cursors VALUES ('k', 'stale', 3, ?)", (time.time() - 7200,))
    await store.apply_retention()
    rows = connection.execute("SELECT session_id FROM cursors").fetchall()
    assert rows == [("fresh",)]
    store.close()


async def test_session_cursors_survive_a_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "t.sqlite3")
    store = open_store(path)
    store.save_cursor("k", "session", 42)
    assert await store.load_cursor("k", "session") == 42
    assert await store.flush(seconds(30))
    store.close()
    reopened = open_store(path)
    assert await reopened.load_cursor("k", "session") == 42
    assert await reopened.load_cursor("k", "other") is None
    reopened.close()


async def test_a_record_sqlite_refuses_does_not_stop_the_others(tmp_path: Path) -> None:
    """A permanent error on one record (here: a row over SQLite's length limit) is isolated:
    the other records are committed, the refused one is kept as a placeholder under its
    seq (saying what was lost), and flush() returns."""
    path = str(tmp_path / "t.sqlite3")
    store = open_store(path)
    assert store.writer._connection is not None
    store.writer._connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 10000)
    store.append(stream_record("k", 1, "small"))
    store.append(stream_record("k", 2, "x" * 50000))
    store.append(stream_record("k", 3, "after"))
    # The flush wakes once they are durable (it had waited out its whole timeout when the
    # last batch went record by record): its own timeout must not be waited out.
    assert await asyncio.wait_for(store.flush(seconds(120)), seconds(30))
    page = await store.read("k", 0, 10)
    assert [r.seq for r in page.records] == [1, 2, 3]
    assert page.records[1].message.msg_type == "kernel_gateway_stream_unstored"
    assert page.records[1].message.content()["msg_type"] == "stream"
    assert page.records[2].message.text == "after"
    store.close()


async def test_records_read_back_equal_those_appended(tmp_path: Path) -> None:
    """What the store returns after a commit is the record that went in, with the peeked
    fields readers use (stream text, execution_state, the parent's msg_id and type)."""
    store = open_store(str(tmp_path / "t.sqlite3"))
    status = KernelMessage.synthesize(
        "status", {"execution_state": "idle"}, msg_id="s1", date="", session="s"
    )
    parent = execute_request_header()
    buffered = KernelMessage.from_parts(
        [b'{"msg_id": "b", "msg_type": "display_data"}', parent, b'{"m": 1}', b"{}", b"\x00", b""]
    )
    records = [
        stream_record("k", 1, "text"),
        Record("k", 2, time.time(), status),
        kernel_like_record("k", 3, "ünï\n", parent),
        Record("k", 4, time.time(), buffered),
    ]
    for record in records:
        store.append(record)
    assert await store.flush(seconds(30))
    page = await store.read("k", 0, 10)
    assert page.records == records
    store.close()


async def test_transcript_files_are_private(tmp_path: Path) -> None:
    """Item 5: the database, its WAL and shared-memory files are 0600 and the store's own
    directory 0700, including files that an older version left 0644."""
    directory = tmp_path / "kernel_gateway_stream"
    directory.mkdir(mode=0o755)
    path = directory / "transcripts.sqlite3"
    path.touch(mode=0o644)
    store = open_store(str(path))
    store.append(stream_record("k", 1, "x"))
    assert await store.flush(seconds(30))
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        assert stat.S_IMODE(name.stat().st_mode) == 0o600, name
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    store.close()
    fresh = tmp_path / "new" / "deeper" / "t.sqlite3"
    open_store(str(fresh)).close()
    assert stat.S_IMODE(fresh.parent.stat().st_mode) == 0o700


async def test_a_path_that_cannot_be_opened_stops_the_start(tmp_path: Path) -> None:
    """Item 12: a path that cannot be created raises StoreUnavailable at open, so the
    start stops (a read-only database: tests/faults, on a read-only mount)."""
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(StoreUnavailable, match="cannot"):
        open_store(str(blocked / "t.sqlite3"))
    with pytest.raises(StoreUnavailable, match="is a directory"):
        open_store(str(tmp_path))


async def test_a_deleted_database_is_detected_and_restored(tmp_path: Path) -> None:
    """Item 12: a database deleted under the gateway is reported (failing,
    database_deleted) and restored from the open copy, with everything it held; one
    replaced by another file too, that file set aside."""
    path = tmp_path / "t.sqlite3"
    store = open_store(str(path), file_check_interval=0.05)
    for seq in range(1, 101):
        store.append(stream_record("k", seq, f"{seq}\n"))
    assert await store.flush(seconds(30))
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        name.unlink()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds(30)
    while store.writer.state.restored == 0 and loop.time() < deadline:
        await asyncio.sleep(0.05)
    assert store.writer.state.restored == 1
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for seq in range(101, 201):
        store.append(stream_record("k", seq, f"{seq}\n"))
    assert await store.flush(seconds(30))
    assert store.health().state is State.OK
    texts = [r.message.text for r in (await store.read("k", 0, 1000)).records]
    assert texts == [f"{seq}\n" for seq in range(1, 201)]
    store.close()
    reopened = open_store(str(path))
    assert covered((await reopened.read("k", 0, 1000)).records) == list(range(1, 201))
    reopened.close()

    # Replaced by another database (an empty one, as a careless restore or copy would
    # put there): that file is moved aside, kept whole, and ours restored in its place,
    # so the kernel's transcript is served and numbered on, never begun again.
    other = tmp_path / "other.sqlite3"
    open_store(str(other)).close()
    other_bytes = other.read_bytes()
    store = open_store(str(path), file_check_interval=0.05)
    other.replace(path)
    deadline = loop.time() + seconds(30)
    while store.writer.state.restored == 0 and loop.time() < deadline:
        await asyncio.sleep(0.05)
    assert store.writer.state.restored == 1
    [aside] = tmp_path.glob("t.sqlite3.replaced-*")
    assert aside.read_bytes() == other_bytes
    for seq in range(201, 301):
        store.append(stream_record("k", seq, f"{seq}\n"))
    assert await store.flush(seconds(30))
    assert store.health().state is State.OK
    texts = [r.message.text for r in (await store.read("k", 0, 1000)).records]
    assert texts == [f"{seq}\n" for seq in range(1, 301)]
    store.close()
    reopened = open_store(str(path))
    assert covered((await reopened.read("k", 0, 1000)).records) == list(range(1, 301))
    reopened.close()


async def test_a_full_database_wedges_nothing_and_every_record_lands_after(
    tmp_path: Path,
) -> None:
    """SQLite rolls a transaction back by itself when the disk is full; the writer's own
    ROLLBACK then failed ("no transaction is active") in place of the error, and its
    bookkeeping of the failed batch stayed. Full, then given room: every record lands, in
    order, and the store is ok again."""
    path = str(tmp_path / "t.sqlite3")
    store = open_store(path, batch_linger=0.0, writes_failing_after=0.5)
    assert await store.flush(seconds(30))
    connection = store.writer._connection
    assert connection is not None
    pages = connection.execute("PRAGMA page_count").fetchone()[0]
    # Room for a few more pages: the batches below do not fit.
    connection.execute(f"PRAGMA max_page_count = {pages + 4}")
    for seq in range(1, 3001):
        store.append(stream_record("k", seq, f"{seq:06d}" + "x" * 200 + "\n"))
    assert not await store.flush(1.0)
    # Nothing new becomes durable: failing (503), not merely degraded, once it lasts.
    health = store.health()
    assert health.state is State.FAILING, health
    assert health.reason == "writes_failing"
    assert store.writer.state.write_error is not None
    assert "full" in store.writer.state.write_error
    connection.execute("PRAGMA max_page_count = 1073741823")
    assert await store.flush(seconds(60))
    assert store.health().state is State.OK
    store.close()
    reopened = open_store(path)
    records = (await reopened.read("k", 0, 10000)).records
    assert covered(records) == list(range(1, 3001))
    assert [r.message.text[:6] for r in records] == [f"{s:06d}" for s in range(1, 3001)]
    reopened.close()
