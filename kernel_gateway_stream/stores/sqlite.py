"""The embedded default store: SQLite in WAL mode, written by one thread in batches.

Records are stored in chunks (:mod:`..core.records`), about one byte on disk per byte of
output. What the store promises (docs/guarantees.md measures each):

* **Readable at once.** A record can be read from the moment :meth:`append` returns; until
  its batch commits it is served from memory (:class:`.pending.PendingBuffer`).
* **Durable within a batch.** With ``synchronous=NORMAL`` (the default) a committed batch
  survives the gateway being killed; a batch commits a few milliseconds after its first
  record (``batch_linger``) or, under load, as soon as the previous one has. ``FULL``
  also survives power loss, at the cost of an fsync per batch.
* **Bounded.** At most ``max_pending_bytes`` wait to be written. Past that (a disk too slow
  or refusing writes) records are not kept but numbered on; the transcript gets one gap
  record per dropped range, and the store reports ``failing`` until it keeps up again.
* **No reused numbers.** A kernel's numbers up to its durable reservation may have been
  seen; after a crash the store starts above it, with a gap record for what was lost.

Reads run on a small thread pool with their own connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import os
import sqlite3
import threading
import time
from collections.abc import Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jupyter_core.paths import jupyter_data_dir
from traitlets import Enum, Float, Int, Unicode, default

from ..core.errors import MalformedMessage, StoreUnavailable
from ..core.health import ComponentHealth, State
from ..core.marks import backlog_gap, gap_record, is_mark, iso_date
from ..core.messages import Record
from ..core.records import NO_PARENT, ParentHeader, decode_chunk, encode_record
from .base import TranscriptInfo, TranscriptPage, TranscriptStore
from .lock import hold_store_lock
from .numbered import NumberedMarks
from .pending import PendingBuffer
from .query import Query
from .sqlite_schema import (
    SCHEMA,
    SCHEMA_VERSION,
    chunk_id,
    connect_reader,
    create_private_file,
    kernel_range,
    prepare_directory,
)
from .sqlite_writer import Control, TranscriptWriter, WriterSettings

__all__ = ["SQLiteTranscriptStore"]

_DEFAULT_DIRECTORY = "kernel_gateway_stream"
_FAR = 1 << 62


class SQLiteTranscriptStore(TranscriptStore):
    """Transcripts in one SQLite database (WAL), batched on a writer thread."""

    path = Unicode(
        config=True,
        help="Path of the SQLite database file. Default: kernel_gateway_stream/transcripts.sqlite3 "
        "under the Jupyter data directory. The database and its directory are made private "
        "(0600 and, when the store creates it or it is the default one, 0700).",
    )

    @default("path")
    def _default_path(self) -> str:
        return os.path.join(jupyter_data_dir(), _DEFAULT_DIRECTORY, "transcripts.sqlite3")

    synchronous = Enum(
        ["OFF", "NORMAL", "FULL"],
        default_value="NORMAL",
        config=True,
        help="SQLite synchronous pragma. NORMAL keeps every committed batch across a crash of "
        "the gateway; FULL also across power loss (one fsync per batch); OFF leaves it to the OS.",
    )
    batch_max_records = Int(
        20000,
        config=True,
        help="Most records written in one transaction.",
    )
    batch_linger = Float(
        0.005,
        config=True,
        help="Seconds the writer waits after the first record of a quiet spell so that what "
        "follows is committed with it (under load, batches form by themselves). Part of what "
        "a killed gateway can lose from the transcript (live clients still get it).",
    )
    chunk_max_bytes = Int(
        64 * 1024,
        config=True,
        help="Largest run of records stored in one row (a single larger record is one row).",
    )
    writes_failing_after = Float(
        10.0,
        config=True,
        help="Seconds of failing writes (a full or read-only disk, the files gone) after which "
        "the store reports 'failing' (health 503: nothing new becomes durable) rather than "
        "'degraded' (a short stall, such as another process holding the database's lock).",
    )
    max_pending_bytes = Int(
        64 * 1024 * 1024,
        config=True,
        help="Most bytes of records waiting to be written (plus one gap record, a few hundred "
        "bytes, per kernel). Past it (a disk too slow, or refusing writes) records are "
        "numbered and sent to live clients but not kept: the transcript gets a gap record for "
        "them, and the store reports 'failing'. Statuses and the gateway's own records have "
        "a reserve of an eighth more, so that every execution still ends in the transcript. "
        "Kernels started by the gateway's launcher lose nothing here: within an eighth of the "
        "bound their Taps stop reading, and each kernel keeps what it publishes (up to its "
        "iopub_hold_bytes) until the store has room again, for 30 s at most; their live "
        "output pauses meanwhile.",
    )
    reserve_ahead = Int(
        100000,
        config=True,
        help="Sequence numbers reserved durably ahead of those given out. After a crash a "
        "kernel's numbering continues above its reservation, so no number a client may have "
        "seen is reused; the skipped range is one gap record.",
    )
    max_bytes_per_kernel = Int(
        256 * 1024 * 1024,
        config=True,
        help="Retention: once a kernel's transcript takes more than this many bytes on disk, its "
        "oldest records are discarded (down to 90%% of it), at most 8 MiB per step with "
        "batches written between steps. 0 keeps everything.",
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
    max_file_bytes = Int(
        0,
        config=True,
        help="A hard cap on the database file, in bytes (0: none). Past it writes are refused "
        "as on a full disk; retention (max_bytes_per_kernel) should keep it below.",
    )
    close_timeout = Float(
        10.0,
        config=True,
        help="Seconds shutdown waits for the writer to commit what is pending; a store that "
        "cannot write by then is abandoned (the reservation covers what it held).",
    )
    retention_interval = Float(
        30.0, config=True, help="Seconds between two retention passes of the writer thread."
    )
    file_check_interval = Float(
        2.0,
        config=True,
        help="Seconds between checks that the database file is still the one being written "
        "(deleted: restored from the open copy; replaced: the other file is moved aside, "
        "kept whole, and the open copy restored).",
    )

    # -- life cycle -------------------------------------------------------------------

    def open(self) -> None:
        """Create or open the database, recover from an unclean stop, start the writer.

        Raises:
            StoreUnavailable: the database cannot be created, opened or written.
        """
        path = self.path
        default_directory = os.path.basename(os.path.dirname(os.path.abspath(path)))
        prepare_directory(path, private=default_directory == _DEFAULT_DIRECTORY)
        self._lock = hold_store_lock(path)  # one writer per store (stores/lock.py)
        create_private_file(path)
        self._numbered = NumberedMarks(path + "-numbered")
        self.pending = PendingBuffer(self.max_pending_bytes, backlog_gap)
        self._keys: dict[str, int] = {}
        self._cursors: dict[tuple[str, str], int] = {}
        self._generation = 0
        self._local = threading.local()
        self.writer = TranscriptWriter(
            WriterSettings(
                path=path,
                synchronous=self.synchronous,
                batch_max_records=self.batch_max_records,
                batch_linger=self.batch_linger,
                chunk_max_bytes=self.chunk_max_bytes,
                reserve_ahead=self.reserve_ahead,
                max_bytes_per_kernel=self.max_bytes_per_kernel,
                max_age=self.max_age,
                keep_after_shutdown=self.keep_after_shutdown,
                retention_interval=self.retention_interval,
                file_check_interval=self.file_check_interval,
                max_file_bytes=self.max_file_bytes,
            ),
            self.pending,
            self._keys,
            self.log,
            self._reconnect_readers,
        )
        try:
            connection = self.writer.open()
            connection.executescript(SCHEMA)
            connection.execute(
                "INSERT OR REPLACE INTO meta (name, value) VALUES ('schema_version', ?), "
                "('opened', ?)",
                (SCHEMA_VERSION, time.time()),
            )
            self.recovered = self._recover(connection, time.time())
            transcripts, records, unended = connection.execute(
                "SELECT count(*), coalesce(sum(head), 0), coalesce(sum(ended IS NULL), 0) "
                "FROM kernels"
            ).fetchone()
        except sqlite3.Error as error:
            raise StoreUnavailable(f"transcript database {path}: {error}") from error
        self._readers = ThreadPoolExecutor(2, thread_name_prefix="transcript-read")
        self.writer.start()
        # What a start finds: an operator reading the log after a crash learns here what
        # survived (each kernel's gap is logged by the application, one line each).
        self.log.info(
            "Transcripts in %s: %d kept (%d records numbered in all), %d of kernels that were "
            "running when the gateway last stopped, %d with a gap from an unclean stop",
            path,
            transcripts,
            records,
            unended,
            len(self.recovered),
        )

    def _recover(self, connection: sqlite3.Connection, now: float) -> list[tuple[str, int, int]]:
        """After an unclean stop: numbers up to a kernel's reservation may have been seen
        and are not reused. One gap record covers what was given out but not kept (and the
        rest of the reservation). Returns ``(kernel_id, first, last)`` per gap."""
        rows = connection.execute(
            "SELECT key, kernel_id, head, reserved FROM kernels WHERE reserved > head"
        ).fetchall()
        gaps = []
        numbered = self._numbered.found
        for key, kernel_id, head, reserved in rows:
            gap = gap_record(
                kernel_id, head + 1, reserved, "gateway_stopped", now=now, date=iso_date(now)
            )
            data = encode_record(gap, NO_PARENT)
            connection.execute("BEGIN IMMEDIATE")
            connection.execute(
                "INSERT OR REPLACE INTO chunks (id, last_seq, time, data) VALUES (?, ?, ?, ?)",
                (chunk_id(key, head + 1), reserved, now, data),
            )
            connection.execute(
                "INSERT OR REPLACE INTO marks (kernel_key, seq, data) VALUES (?, ?, ?)",
                (key, reserved, data),
            )
            connection.execute(
                "UPDATE kernels SET head = ?, bytes = bytes + ? WHERE key = ?",
                (reserved, 2 * len(data), key),
            )
            connection.execute("COMMIT")
            gaps.append((kernel_id, head + 1, reserved))
            last = numbered.get(kernel_id)
            missing = (
                f"{last - head}" if last is not None and head <= last else "an unknown number of"
            )
            self.log.warning(
                "Transcript of kernel %s: %s records were given out but not kept when the "
                "gateway stopped; one gap record covers them and the rest of the "
                "reservation (seqs %d-%d)",
                kernel_id,
                missing,
                head + 1,
                reserved,
            )
        return gaps

    def close(self) -> None:
        if not hasattr(self, "writer"):
            return
        self.writer.stop()
        self.writer.join(self.close_timeout)
        if self.writer.is_alive():
            self.log.error(
                "Transcript writer still busy after %.0f s; giving up on it (%d records not "
                "written are covered by the reservation)",
                self.close_timeout,
                self.pending.stats().records,
            )
        self._readers.shutdown(wait=False)
        self._lock.release()

    def _reconnect_readers(self) -> None:
        """The database was reopened (restored): readers reconnect before their next read."""
        self._generation += 1

    # -- writes (event loop) ---------------------------------------------------------

    def append(self, record: Record) -> None:
        self._numbered.note(record.kernel_id, record.seq)
        self.pending.push(record)
        self.writer.wake()

    def kernel_started(self, kernel_id: str, now: float) -> None:
        self.writer.add_control(
            Control(
                "INSERT INTO kernels (kernel_id, started) VALUES (?, ?) "
                "ON CONFLICT (kernel_id) DO UPDATE SET ended = NULL",
                (kernel_id, now),
            )
        )

    def kernel_ended(self, kernel_id: str, now: float) -> None:
        self._numbered.forget(kernel_id)
        self.writer.add_control(
            Control("UPDATE kernels SET ended = ? WHERE kernel_id = ?", (now, kernel_id))
        )

    def save_link(self, kernel_id: str, link: dict[str, Any] | None) -> None:
        if link is None:
            control = Control("DELETE FROM links WHERE kernel_id = ?", (kernel_id,))
        else:
            control = Control(
                "INSERT INTO links (kernel_id, data, updated) VALUES (?, ?, ?) "
                "ON CONFLICT (kernel_id) DO UPDATE SET data = excluded.data, "
                "updated = excluded.updated",
                (kernel_id, json.dumps(link), time.time()),
            )
        self.writer.add_control(control)

    async def load_links(self) -> dict[str, dict[str, Any]]:
        rows = await self._run("SELECT kernel_id, data FROM links", ())
        links: dict[str, dict[str, Any]] = {}
        for kernel_id, data in rows:
            try:
                link = json.loads(data)
            except ValueError:
                continue
            if isinstance(link, dict):
                links[str(kernel_id)] = link
        return links

    def save_cursor(self, kernel_id: str, session_id: str, seq: int) -> None:
        self._cursors[(kernel_id, session_id)] = seq
        self.writer.add_control(
            Control(
                "INSERT INTO cursors (kernel_id, session_id, seq, updated) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (kernel_id, session_id) DO UPDATE SET seq = excluded.seq, "
                "updated = excluded.updated",
                (kernel_id, session_id, seq, time.time()),
            )
        )
        if len(self._cursors) > 10000:  # a cache of recent ones; the table has them all
            self._cursors.clear()

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until what was appended so far is durable; False if not within ``timeout``."""
        target = self.pending.assigned()
        writer = self.writer

        def done() -> bool:
            if not writer.is_alive():
                return True
            for kernel_id, head in target.items():
                records, _ = self.pending.snapshot(kernel_id, 0, head)
                if records:
                    return False
            return not writer.controls

        def wait() -> bool:
            with writer.committed:
                writer.wake()
                return writer.committed.wait_for(done, timeout)

        return await asyncio.get_running_loop().run_in_executor(None, wait)

    async def apply_retention(self) -> None:
        """Run a retention pass now and wait for it (operators' tools and tests)."""
        done = self.writer.request_retention()
        await asyncio.get_running_loop().run_in_executor(None, done.wait, self.close_timeout)

    # -- reads ---------------------------------------------------------------------

    def has_room(self) -> bool:
        return self.pending.has_room()

    def durable_head(self, kernel_id: str) -> int:
        return self.pending.durable_head(kernel_id)

    async def head(self, kernel_id: str) -> int:
        info = await self.info(kernel_id)
        return info.head if info else 0

    async def info(self, kernel_id: str) -> TranscriptInfo | None:
        assigned = self.pending.assigned_head(kernel_id)
        rows = await self._run(
            "SELECT head, first_seq, started, ended FROM kernels WHERE kernel_id = ?",
            (kernel_id,),
        )
        if not rows and not assigned:
            return None
        head, first_seq, started, ended = rows[0] if rows else (0, 1, None, None)
        return TranscriptInfo(kernel_id, first_seq, max(head, assigned), started, ended)

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
        # The head first, then what is in memory, and nothing past that head: the other
        # way round, records that came and were committed while the head was read were
        # in neither the snapshot nor the durable read (below ``committed``), and the page
        # gave a head past its last record with nothing to say what was between.
        info = await self.info(kernel_id)
        head = info.head if info else 0
        first_seq = info.first_seq if info else 1
        upper = min(until if until is not None else _FAR, head)
        pending, committed = self.pending.snapshot(kernel_id, since, upper)
        query = Query(since, min(upper, committed), limit, parent, msg_types, marks, max_bytes)
        loop = asyncio.get_running_loop()
        records = await loop.run_in_executor(self._readers, self._read_durable, kernel_id, query)
        last = records[-1].seq if records else since
        taken = sum(record.message.size for record in records)
        full = query.full(len(records), taken)
        if not full:
            for record in pending:  # all above ``committed``, so above what was read
                if record.seq <= last or not query.wants(record):
                    continue
                records.append(record)
                last = record.seq
                taken += record.message.size
                if query.full(len(records), taken):
                    full = True
                    break
        scanned = records[-1].seq if full else max(since, min(upper, head))

        discarded = (since + 1, first_seq - 1) if since + 1 < first_seq else None
        return TranscriptPage(records, head, first_seq, discarded, scanned)

    async def marks(self, kernel_id: str, since: int) -> list[Record]:
        """The kernel's marks (lifecycle statuses, gap records) after ``since``, in order."""
        pending, committed = self.pending.snapshot(kernel_id, since, _FAR)
        loop = asyncio.get_running_loop()
        stored = await loop.run_in_executor(
            self._readers, self._read_marks, kernel_id, since, committed
        )
        return stored + [record for record in pending if is_mark(record.message)]

    async def load_cursor(self, kernel_id: str, session_id: str) -> int | None:
        cached = self._cursors.get((kernel_id, session_id))
        if cached is not None:
            return cached
        rows = await self._run(
            "SELECT seq FROM cursors WHERE kernel_id = ? AND session_id = ?",
            (kernel_id, session_id),
        )
        return int(rows[0][0]) if rows else None

    # -- reader threads ----------------------------------------------------------------

    async def _run(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers, self._query, sql, args)

    def _query(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        return self._connection().execute(sql, args).fetchall()

    def _connection(self) -> sqlite3.Connection:
        local = self._local
        connection = getattr(local, "connection", None)
        if connection is None or local.generation != self._generation:
            if connection is not None:
                connection.close()
            connection = local.connection = connect_reader(self.path)
            local.generation = self._generation
            local.parents = {}
        return connection

    def _key(self, connection: sqlite3.Connection, kernel_id: str) -> int | None:
        key = self._keys.get(kernel_id)
        if key is None:
            row = connection.execute(
                "SELECT key FROM kernels WHERE kernel_id = ?", (kernel_id,)
            ).fetchone()
            key = None if row is None else int(row[0])
        return key

    def _read_durable(self, kernel_id: str, query: Query) -> list[Record]:
        connection = self._connection()
        key = self._key(connection, kernel_id)
        if key is None or query.upper <= query.since:
            return []
        source = self._chunk_records(connection, kernel_id, key, query)
        if query.parent is not None and query.marks:
            # Marks have no parent, so the parent's chunks do not hold them: merge them in.
            marks = self._read_marks(kernel_id, query.since, query.upper)
            source = heapq.merge(source, marks, key=lambda record: record.seq)
        records: list[Record] = []
        last = query.since
        taken = 0
        for record in source:
            if record.seq <= last:
                continue  # before since, or a chunk written twice by a retried batch
            if record.seq > query.upper:
                break
            last = record.seq
            if not query.wants(record):
                continue
            records.append(record)
            taken += record.message.size
            if query.full(len(records), taken):
                break
        return records

    def _chunk_records(
        self, connection: sqlite3.Connection, kernel_id: str, key: int, query: Query
    ) -> Iterator[Record]:
        """The records of the chunks that may hold what ``query`` wants, in order."""
        low, high = kernel_range(key)
        upper_id = chunk_id(key, min(query.upper, high - low))
        start = connection.execute(
            "SELECT id FROM chunks WHERE id BETWEEN ? AND ? ORDER BY id DESC LIMIT 1",
            (low, chunk_id(key, query.since + 1)),
        ).fetchone()
        first_id = start[0] if start else low
        if query.parent is None:
            cursor = connection.execute(
                "SELECT data FROM chunks WHERE id BETWEEN ? AND ? ORDER BY id",
                (first_id, upper_id),
            )
        else:
            refs = [
                row[0]
                for row in connection.execute(
                    "SELECT ref FROM parents WHERE kernel_key = ? AND msg_id = ?",
                    (key, query.parent),
                )
            ]
            if not refs:
                return
            cursor = connection.execute(
                "SELECT data FROM chunks WHERE id IN (SELECT chunk FROM chunk_parents "
                f"WHERE kernel_key = ? AND ref IN ({','.join('?' * len(refs))}) "
                "AND chunk BETWEEN ? AND ?) ORDER BY id",
                (key, *refs, first_id, upper_id),
            )
        parents = self._parents_of(connection, key)
        for (data,) in cursor:
            try:
                yield from decode_chunk(data, kernel_id, parents)
            except MalformedMessage as error:
                self.log.error("Skipping a damaged chunk of %s: %s", kernel_id, error)

    def _parents_of(self, connection: sqlite3.Connection, key: int) -> Any:
        cache: dict[tuple[int, int], ParentHeader | None] = self._local.parents
        if len(cache) > 4096:
            cache.clear()

        def resolve(ref: int) -> ParentHeader | None:
            found = cache.get((key, ref), False)
            if found is False:
                row = connection.execute(
                    "SELECT header, msg_id, msg_type FROM parents WHERE kernel_key = ? AND ref = ?",
                    (key, ref),
                ).fetchone()
                found = cache[(key, ref)] = None if row is None else ParentHeader(*row)
            return found  # type: ignore[return-value]

        return resolve

    def _read_marks(self, kernel_id: str, since: int, committed: int) -> list[Record]:
        connection = self._connection()
        key = self._key(connection, kernel_id)
        if key is None:
            return []
        rows = connection.execute(
            "SELECT data FROM marks WHERE kernel_key = ? AND seq > ? AND seq <= ? ORDER BY seq",
            (key, since, committed),
        ).fetchall()
        records = []
        for (data,) in rows:
            records.extend(decode_chunk(data, kernel_id, lambda ref: None))
        return records

    # -- health --------------------------------------------------------------------

    def health(self) -> ComponentHealth:
        pending = self.pending.stats()
        state = self.writer.state
        details = {
            "path": self.path,
            "pending_records": pending.records,
            "pending_bytes": pending.bytes,
            "max_pending_bytes": pending.max_bytes,
            "dropped_records": pending.dropped_records,
            "gap_records": pending.gap_records,
            "write_batches": state.batches,
            "write_failures": state.failures,
            "last_error": state.write_error,
            "bytes_on_disk": self.bytes_on_disk(),
        }
        if not self.writer.is_alive():
            return ComponentHealth("store", State.FAILING, "writer_stopped", details)
        if state.file_problem is not None:
            return ComponentHealth("store", State.FAILING, state.file_problem, details)
        if pending.dropping:
            return ComponentHealth("store", State.FAILING, "backlog_full_records_dropped", details)
        if state.unreserved:
            return ComponentHealth("store", State.FAILING, "numbering_above_reservation", details)
        if state.write_error is not None:
            since = state.failing_since
            failing = since is not None and time.monotonic() - since >= self.writes_failing_after
            level = State.FAILING if failing else State.DEGRADED
            return ComponentHealth("store", level, "writes_failing", details)
        if pending.bytes > pending.max_bytes // 2:
            return ComponentHealth("store", State.DEGRADED, "backlog_high", details)
        return ComponentHealth("store", State.OK, None, details)

    def bytes_on_disk(self) -> int:
        """The database's files, as the file system counts them."""
        total = 0
        for name in (self.path, self.path + "-wal", self.path + "-shm"):
            with contextlib.suppress(OSError):
                total += os.stat(name).st_size
        return total
