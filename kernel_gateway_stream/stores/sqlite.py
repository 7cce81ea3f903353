"""The embedded default store: SQLite in WAL mode, written by one thread in batches.

Durability: each batch is one transaction; with ``synchronous=NORMAL`` (the default) a
committed batch survives the gateway being killed, and the loss window on SIGKILL is the
batch being written (typically a few milliseconds of output). ``synchronous=FULL`` also
survives power loss, at the cost of an fsync per batch.

Reads run on a small thread pool with their own connections. A record is readable from
the moment :meth:`append` returns: until its batch commits it is served from memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import sqlite3
import struct
import threading
import time
from collections import deque
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from jupyter_core.paths import jupyter_data_dir
from traitlets import Enum, Float, Int, Unicode, default

from ..core.messages import KernelMessage, Record, peek_stream
from .base import TranscriptInfo, TranscriptPage, TranscriptStore

__all__ = ["SQLiteTranscriptStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kernels (
    kernel_id TEXT PRIMARY KEY,
    head INTEGER NOT NULL DEFAULT 0,
    first_seq INTEGER NOT NULL DEFAULT 1,
    bytes INTEGER NOT NULL DEFAULT 0,
    started REAL,
    ended REAL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS records (
    kernel_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    time REAL NOT NULL,
    msg_type TEXT NOT NULL,
    msg_id TEXT NOT NULL,
    parent_msg_id TEXT,
    stream_name TEXT,
    header BLOB NOT NULL,
    parent_header BLOB NOT NULL,
    metadata BLOB NOT NULL,
    content BLOB NOT NULL,
    buffers BLOB,
    size INTEGER NOT NULL,
    PRIMARY KEY (kernel_id, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS records_by_parent ON records (kernel_id, parent_msg_id, seq);
CREATE TABLE IF NOT EXISTS cursors (
    kernel_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY (kernel_id, session_id)
) WITHOUT ROWID;
"""

_COLUMNS = (
    "kernel_id, seq, time, msg_type, msg_id, parent_msg_id, stream_name,"
    " header, parent_header, metadata, content, buffers, size"
)


@dataclass(frozen=True, slots=True)
class _Control:
    """A non-record job for the writer thread."""

    sql: str
    args: tuple[Any, ...]


class _Flush:
    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = threading.Event()


_STOP = object()


class SQLiteTranscriptStore(TranscriptStore):
    """Transcripts in one SQLite database (WAL), batched on a writer thread."""

    path = Unicode(
        config=True,
        help="Path of the SQLite database file. Default: kernel_gateway_stream/transcripts.sqlite3 "
        "under the Jupyter data directory.",
    )

    @default("path")
    def _default_path(self) -> str:
        return os.path.join(jupyter_data_dir(), "kernel_gateway_stream", "transcripts.sqlite3")

    synchronous = Enum(
        ["OFF", "NORMAL", "FULL"],
        default_value="NORMAL",
        config=True,
        help="SQLite synchronous pragma. NORMAL keeps every committed batch across a crash of "
        "the gateway; FULL also across power loss (one fsync per batch); OFF leaves it to the OS.",
    )
    batch_max_records = Int(
        5000,
        config=True,
        help="Most records written in one transaction; the writer takes whatever is queued, "
        "up to this many, each time it commits.",
    )
    batch_linger = Float(
        0.01,
        config=True,
        help="Seconds the writer waits after a record arrives so that what follows is "
        "committed with it. Larger: fewer commits and less CPU; it is also how much recent "
        "output a killed gateway can lose from the transcript (live clients still get it).",
    )
    max_bytes_per_kernel = Int(
        256 * 1024 * 1024,
        config=True,
        help="Retention: once a kernel's transcript holds more than this many bytes, its oldest "
        "records are discarded (down to 90%% of it). 0 keeps everything.",
    )
    max_age = Float(
        7 * 24 * 3600.0,
        config=True,
        help="Retention: records older than this many seconds are discarded. 0 keeps them forever.",
    )
    keep_after_shutdown = Float(
        24 * 3600.0,
        config=True,
        help="Seconds a kernel's transcript is kept after the kernel shuts down. 0 keeps it "
        "until retention discards it by size or age.",
    )
    close_timeout = Float(
        30.0, config=True, help="Seconds shutdown waits for the writer to commit what is queued."
    )
    retention_interval = Float(
        30.0, config=True, help="Seconds between two retention passes of the writer thread."
    )

    def open(self) -> None:
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        self._lock = threading.Lock()
        self._pending: dict[str, deque[Record]] = {}
        self._cursors: dict[tuple[str, str], int] = {}
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._local = threading.local()
        self._readers = ThreadPoolExecutor(2, thread_name_prefix="transcript-read")
        self._error: BaseException | None = None
        connection = self._connect()
        connection.executescript(_SCHEMA)
        connection.commit()
        self._writer = threading.Thread(
            target=self._write_loop, args=(connection,), name="transcript-writer", daemon=True
        )
        self._writer.start()
        self.log.info("Transcripts in %s", self.path)

    def close(self) -> None:
        if not hasattr(self, "_writer"):
            return
        self._queue.put(_STOP)
        self._writer.join(self.close_timeout)
        if self._writer.is_alive():
            self.log.error("Transcript writer still busy after %.0f s; giving up on it",
                           self.close_timeout)  # fmt: skip
        self._readers.shutdown(wait=False)

    # -- writes (event loop) ---------------------------------------------------------

    def append(self, record: Record) -> None:
        with self._lock:
            pending = self._pending.get(record.kernel_id)
            if pending is None:
                pending = self._pending[record.kernel_id] = deque()
            pending.append(record)
        self._queue.put(record)

    def kernel_started(self, kernel_id: str, now: float) -> None:
        self._queue.put(
            _Control(
                "INSERT INTO kernels (kernel_id, started) VALUES (?, ?) "
                "ON CONFLICT (kernel_id) DO UPDATE SET ended = NULL",
                (kernel_id, now),
            )
        )

    def kernel_ended(self, kernel_id: str, now: float) -> None:
        self._queue.put(
            _Control("UPDATE kernels SET ended = ? WHERE kernel_id = ?", (now, kernel_id))
        )

    def save_cursor(self, kernel_id: str, session_id: str, seq: int) -> None:
        self._cursors[(kernel_id, session_id)] = seq
        self._queue.put(
            _Control(
                "INSERT INTO cursors (kernel_id, session_id, seq, updated) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (kernel_id, session_id) DO UPDATE SET seq = excluded.seq, "
                "updated = excluded.updated",
                (kernel_id, session_id, seq, time.time()),
            )
        )

    async def flush(self) -> None:
        marker = _Flush()
        self._queue.put(marker)
        await asyncio.get_running_loop().run_in_executor(None, marker.event.wait)

    # -- reads ---------------------------------------------------------------------

    async def head(self, kernel_id: str) -> int:
        info = await self.info(kernel_id)
        return info.head if info else 0

    async def info(self, kernel_id: str) -> TranscriptInfo | None:
        with self._lock:
            pending = self._pending.get(kernel_id)
            pending_head = pending[-1].seq if pending else 0
        row = await self._run(
            "SELECT head, first_seq, started, ended FROM kernels WHERE kernel_id = ?",
            (kernel_id,),
        )
        if not row and not pending_head:
            return None
        head, first_seq, started, ended = row[0] if row else (0, 1, None, None)
        return TranscriptInfo(kernel_id, first_seq, max(head, pending_head), started, ended)

    async def read(
        self,
        kernel_id: str,
        since: int,
        limit: int,
        *,
        until: int | None = None,
        parent: str | None = None,
        msg_types: Collection[str] | None = None,
    ) -> TranscriptPage:
        upper = until if until is not None else 2**62
        with self._lock:
            pending = self._pending.get(kernel_id)
            # Everything below the first pending record is committed.
            committed = pending[0].seq - 1 if pending else 2**62
            in_memory = [r for r in pending if since < r.seq <= upper] if pending else []
        info = await self.info(kernel_id)
        head = info.head if info else 0
        first_seq = info.first_seq if info else 1
        where = ["kernel_id = ?", "seq > ?", "seq <= ?"]
        args: list[Any] = [kernel_id, since, min(upper, committed)]
        if parent is not None:
            where.append("parent_msg_id = ?")
            args.append(parent)
        if msg_types:
            where.append("msg_type IN ({})".format(",".join("?" * len(msg_types))))
            args.extend(msg_types)
        args.append(limit)
        # Rows become Records in the reader thread, overlapping the loop's sending.
        loop = asyncio.get_running_loop()
        records = await loop.run_in_executor(
            self._readers,
            self._query_records,
            f"SELECT {_COLUMNS} FROM records WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?",
            tuple(args),
        )
        if len(records) < limit:
            for record in in_memory:
                if record.seq <= committed:
                    continue
                if parent is not None and record.message.parent_msg_id != parent:
                    continue
                if msg_types and record.message.msg_type not in msg_types:
                    continue
                records.append(record)
                if len(records) >= limit:
                    break
        discarded = (since + 1, first_seq - 1) if since + 1 < first_seq else None
        return TranscriptPage(records, head, first_seq, discarded)

    async def load_cursor(self, kernel_id: str, session_id: str) -> int | None:
        cached = self._cursors.get((kernel_id, session_id))
        if cached is not None:
            return cached
        rows = await self._run(
            "SELECT seq FROM cursors WHERE kernel_id = ? AND session_id = ?",
            (kernel_id, session_id),
        )
        return int(rows[0][0]) if rows else None

    async def _run(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers, self._query, sql, args)

    def _query_records(self, sql: str, args: tuple[Any, ...]) -> list[Record]:
        return [_record_from_row(row) for row in self._query(sql, args)]

    def _query(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = self._connect()
        return connection.execute(sql, args).fetchall()

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, check_same_thread=False, timeout=30)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute(f"PRAGMA synchronous={self.synchronous}")
        return connection

    # -- the writer thread ---------------------------------------------------------

    def _write_loop(self, connection: sqlite3.Connection) -> None:
        next_retention = time.monotonic() + self.retention_interval
        stopping = False
        while not stopping:
            batch = [self._queue.get()]
            if self.batch_linger > 0 and isinstance(batch[0], Record):
                # Let a batch gather: one commit per linger instead of one per record
                # (and one wake-up of this thread, not one per append).
                time.sleep(self.batch_linger)
            while len(batch) < self.batch_max_records:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            records = [item for item in batch if isinstance(item, Record)]
            self._write_until_done(connection, batch, records)
            self._forget_committed(records)
            if time.monotonic() >= next_retention:
                next_retention = time.monotonic() + self.retention_interval
                try:
                    self.apply_retention(connection, time.time())
                except sqlite3.Error as error:
                    self.log.error("Transcript retention failed: %s", error)
            for item in batch:
                if isinstance(item, _Flush):
                    item.event.set()
                elif item is _STOP:
                    stopping = True
        connection.close()

    def _write_until_done(
        self, connection: sqlite3.Connection, batch: list[Any], records: list[Record]
    ) -> None:
        """Write a batch, retrying while the disk refuses for now (locked, busy, full).

        Nothing is dropped while it retries: the records stay readable from memory, and
        live fan-out does not wait for this thread (DESIGN invariant 4). An error that
        retrying cannot cure (a record SQLite will not take) is isolated to its records,
        written one by one, so one bad record cannot stop the transcript of every kernel.
        """
        delay = 0.05
        while True:
            try:
                self._write_batch(connection, batch, records)
            except sqlite3.OperationalError as error:  # transient: log once, retry
                if self._error is None:
                    self.log.error("Transcript write failed, retrying: %s", error)
                self._error = error
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            except Exception as error:  # the writer's outermost loop: isolate, go on
                self.log.error("Transcript batch refused (%s); writing it record by record", error)
                self._write_one_by_one(connection, batch, records)
            if self._error is not None:
                self.log.warning("Transcript writes recovered")
                self._error = None
            return

    def _write_one_by_one(
        self, connection: sqlite3.Connection, batch: list[Any], records: list[Record]
    ) -> None:
        """Each record alone; one that is refused is stored as a placeholder under its
        sequence number, so numbering stays gap-free (DESIGN invariant 1)."""
        for record in records:
            try:
                self._write_batch(connection, [], [record])
            except Exception as error:
                self.log.error("Transcript record %s/%s refused: %s", record.kernel_id,
                               record.seq, error)  # fmt: skip
                placeholder = KernelMessage.synthesize(
                    "kernel_gateway_stream_unstored",
                    {
                        "reason": str(error)[:200],
                        "msg_type": record.message.msg_type,
                        "size": record.message.size,
                    },
                    msg_id=record.message.msg_id,
                    date="",
                    session="",
                )
                with contextlib.suppress(Exception):
                    self._write_batch(connection, [], [replace(record, message=placeholder)])
        for item in batch:
            if isinstance(item, _Control):
                try:
                    with connection:
                        connection.execute(item.sql, item.args)
                except Exception as error:
                    self.log.error("Transcript bookkeeping refused: %s", error)

    def _write_batch(
        self, connection: sqlite3.Connection, batch: list[Any], records: list[Record]
    ) -> None:
        heads: dict[str, list[Any]] = {}  # kernel_id -> [head, bytes added, first time]
        for record in records:
            entry = heads.setdefault(record.kernel_id, [0, 0, record.time])
            entry[0] = record.seq
            entry[1] += record.message.size
        with connection:
            connection.executemany(
                f"INSERT OR REPLACE INTO records ({_COLUMNS}) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [_row_from_record(record) for record in records],
            )
            for kernel_id, (head, size, started) in heads.items():
                connection.execute(
                    "INSERT INTO kernels (kernel_id, head, bytes, started) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (kernel_id) DO UPDATE SET head = max(head, excluded.head), "
                    "bytes = bytes + excluded.bytes",
                    (kernel_id, head, size, started),
                )
            for item in batch:
                if isinstance(item, _Control):
                    connection.execute(item.sql, item.args)

    def _forget_committed(self, records: list[Record]) -> None:
        if not records:
            return
        last: dict[str, int] = {}
        for record in records:
            last[record.kernel_id] = record.seq
        with self._lock:
            for kernel_id, seq in last.items():
                pending = self._pending.get(kernel_id)
                while pending and pending[0].seq <= seq:
                    pending.popleft()
                if pending is not None and not pending:
                    del self._pending[kernel_id]

    def apply_retention(self, connection: sqlite3.Connection, now: float) -> None:
        """Discard what retention says to discard. Runs on the writer thread (tests may
        call it with a connection of their own)."""
        horizon = max(self.max_age, self.keep_after_shutdown)
        if horizon:
            with connection:
                connection.execute("DELETE FROM cursors WHERE updated < ?", (now - horizon,))
        kernels = connection.execute(
            "SELECT kernel_id, head, first_seq, bytes, ended FROM kernels"
        ).fetchall()
        for kernel_id, head, first_seq, size, ended in kernels:
            cutoff = first_seq - 1
            if (
                ended is not None
                and self.keep_after_shutdown
                and now - ended > self.keep_after_shutdown
            ):
                cutoff = head
            if self.max_age:
                (aged,) = connection.execute(
                    "SELECT max(seq) FROM records WHERE kernel_id = ? AND time < ?",
                    (kernel_id, now - self.max_age),
                ).fetchone()
                cutoff = max(cutoff, aged or 0)
            if self.max_bytes_per_kernel and size > self.max_bytes_per_kernel:
                excess = size - int(self.max_bytes_per_kernel * 0.9)
                row = connection.execute(
                    "SELECT seq FROM (SELECT seq, sum(size) OVER (ORDER BY seq) AS total "
                    "FROM records WHERE kernel_id = ?) WHERE total >= ? LIMIT 1",
                    (kernel_id, excess),
                ).fetchone()
                cutoff = max(cutoff, row[0] if row else head)
            if cutoff < first_seq:
                continue
            with connection:
                connection.execute(
                    "DELETE FROM records WHERE kernel_id = ? AND seq <= ?", (kernel_id, cutoff)
                )
                connection.execute(
                    "UPDATE kernels SET first_seq = ?, bytes = (SELECT coalesce(sum(size), 0) "
                    "FROM records WHERE kernel_id = ?) WHERE kernel_id = ?",
                    (cutoff + 1, kernel_id, kernel_id),
                )
            self.log.debug("Retention discarded %s records up to seq %s", kernel_id, cutoff)


def _pack_buffers(buffers: tuple[bytes, ...]) -> bytes | None:
    if not buffers:
        return None
    lengths = struct.pack("<%dI" % (len(buffers) + 1), len(buffers), *(len(b) for b in buffers))
    return lengths + b"".join(buffers)


def _unpack_buffers(blob: bytes | None) -> tuple[bytes, ...]:
    if not blob:
        return ()
    (count,) = struct.unpack_from("<I", blob, 0)
    lengths = struct.unpack_from("<%dI" % count, blob, 4)
    offset = 4 * (count + 1)
    buffers = []
    for length in lengths:
        buffers.append(blob[offset : offset + length])
        offset += length
    return tuple(buffers)


def _row_from_record(record: Record) -> tuple[Any, ...]:
    message = record.message
    return (
        record.kernel_id,
        record.seq,
        record.time,
        message.msg_type,
        message.msg_id,
        message.parent_msg_id,
        message.stream_name,
        message.raw_header,
        message.raw_parent_header,
        message.raw_metadata,
        message.raw_content,
        _pack_buffers(message.buffers),
        message.size,
    )


def _record_from_row(row: tuple[Any, ...]) -> Record:
    (kernel_id, seq, at, msg_type, msg_id, parent, stream_name, header, parent_header,
     metadata, content, buffers, _size) = row  # fmt: skip
    # The fields KernelMessage peeks at when it is decoded, restored without a full decode.
    text = execution_state = None
    # Decoding to str first spares json.loads its per-call encoding detection.
    if stream_name is not None:
        peeked = peek_stream(content)
        text = peeked[1] if peeked is not None else json.loads(content.decode()).get("text")
    elif msg_type == "status":
        execution_state = json.loads(content.decode()).get("execution_state")
    message = KernelMessage(
        msg_type=msg_type,
        msg_id=msg_id,
        parent_msg_id=parent,
        raw_header=header,
        raw_parent_header=parent_header,
        raw_metadata=metadata,
        raw_content=content,
        buffers=_unpack_buffers(buffers),
        stream_name=stream_name,
        text=text,
        execution_state=execution_state,
    )
    return Record(kernel_id, seq, at, message)
