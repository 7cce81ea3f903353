"""The SQLite store's writer thread.

One thread writes every kernel's transcript, one transaction per batch:

* **Batches.** It takes what the :class:`~.pending.PendingBuffer` holds (up to
  ``batch_max_records``), lingering ``batch_linger`` first when the buffer was nearly
  empty, and writes each kernel's records as chunks (:mod:`..core.records`), each parent
  header once, marks again in their table, and the kernel's head, byte count and
  reservation, in one transaction. Under load batches grow by themselves: whatever
  arrives during a commit is the next batch.
* **Reservation** (DESIGN invariant 1). With each batch a kernel's ``reserved`` becomes
  the highest number the Tap has given out plus ``reserve_ahead``: numbers up to it may
  have been seen by a client. After a crash the store starts above it and records the
  numbers it could not keep as one gap record (see ``recover``).
* **Faults.** A write the disk refuses (full, read-only, I/O error, locked) is retried
  with backoff while the records stay in the pending buffer, readable; the store is
  ``degraded`` meanwhile, and ``failing`` once the buffer overflows and records become
  gap records. A database deleted under the gateway is restored from the open
  connection (``VACUUM INTO``); one replaced by another file too, once that file is moved
  aside (``<path>.replaced-<time>-<inode>``, kept whole): a kernel's seqs have one
  history, the one the gateway numbered.
* **Retention** every ``retention_interval``: by age, by bytes on disk, and whole
  transcripts some time after their kernel shut down.
"""

from __future__ import annotations

import bisect
import contextlib
import datetime
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.marks import is_mark
from ..core.messages import Record, unstored_placeholder
from ..core.records import NO_PARENT, encode_record
from .pending import PendingBuffer
from .sqlite_schema import chunk_id, connect, create_private_file, kernel_range

__all__ = ["ROW_OVERHEAD", "Control", "TranscriptWriter", "WriterSettings", "WriterState"]

#: Bytes a row costs on disk besides its payload (record header, cell pointer, page
#: slack): what retention adds per row to count bytes on disk, not payload.
ROW_OVERHEAD = 48
#: Most bytes one retention step discards: a larger discard holds the writer up (about
#: 0.1 s per 8 MiB here), and meanwhile the backlog of a flooding kernel grows. What is
#: left is discarded in the next steps, with batches written between them.
RETENTION_STEP_BYTES = 8 * 1024 * 1024
#: Records in a write tried while writes fail (then whole batches again once one lands).
PROBE_RECORDS = 100

#: Upper bounds of the batch-latency histogram's buckets, in seconds (the last is +Inf).
BATCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, float("inf"))
#: Parent headers each writer remembers per kernel (then a parent is stored again).
PARENT_CACHE = 4096


@dataclass(frozen=True, slots=True)
class Control:
    """A bookkeeping statement for the writer's next transaction (kernel started/ended,
    a session cursor)."""

    sql: str
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class WriterSettings:
    path: str
    synchronous: str
    batch_max_records: int
    batch_linger: float
    chunk_max_bytes: int
    reserve_ahead: int
    max_bytes_per_kernel: int
    max_age: float
    keep_after_shutdown: float
    retention_interval: float
    file_check_interval: float
    max_file_bytes: int


@dataclass
class WriterState:
    """What the writer knows of itself; read by the store's health and by tests."""

    #: The last write error while it persists ("database or disk is full"), else None.
    write_error: str | None = None
    #: Since when writes have been failing (monotonic seconds), else None.
    failing_since: float | None = None
    #: ``"database_deleted"`` / ``"database_replaced"`` while the file is not ours.
    file_problem: str | None = None
    batches: int = 0
    records_written: int = 0
    failures: int = 0
    restored: int = 0
    #: Kernels whose given-out numbers are above their durable reservation.
    unreserved: set[str] = field(default_factory=set)
    last_batch_seconds: float = 0.0
    #: Batches written within each of :data:`BATCH_BUCKETS` (cumulative counts
    #: are made when read), and the seconds they took in all: a latency histogram.
    batch_seconds_counts: list[int] = field(default_factory=lambda: [0] * len(BATCH_BUCKETS))
    batch_seconds_sum: float = 0.0

    def observe_batch(self, seconds: float) -> None:
        self.last_batch_seconds = seconds
        self.batch_seconds_sum += seconds
        self.batch_seconds_counts[bisect.bisect_left(BATCH_BUCKETS, seconds)] += 1


class TranscriptWriter(threading.Thread):
    """See the module docstring. Started by the store; stopped by :meth:`stop`."""

    def __init__(
        self,
        settings: WriterSettings,
        pending: PendingBuffer,
        keys: dict[str, int],
        log: Any,
        on_reconnect: Callable[[], None],
    ) -> None:
        super().__init__(name="transcript-writer", daemon=True)
        self.settings = settings
        self.pending = pending
        #: kernel_id -> key, shared with the store's readers (the writer assigns keys).
        self.keys = keys
        self.log = log
        self._on_reconnect = on_reconnect
        self.state = WriterState()
        self.controls: list[Control] = []
        self._controls_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        #: True while the thread waits for work (set before it checks for work last).
        self._idle = False
        #: Set by :meth:`request_retention`; the event is set once the pass has run.
        self._retention_now: threading.Event | None = None
        #: Notified after every commit (flush waits on it).
        self.committed = threading.Condition()
        self._connection: sqlite3.Connection | None = None
        self._identity: tuple[int, int] | None = None
        self._parents: dict[str, dict[bytes, int]] = {}
        self._next_ref: dict[str, int] = {}
        self._reserved: dict[str, int] = {}

    # -- for the store (any thread) -------------------------------------------------

    def open(self) -> sqlite3.Connection:
        """Connect and remember which file is ours. Called by the store before start()."""
        settings = self.settings
        self._connection = connect(settings.path, settings.synchronous, settings.max_file_bytes)
        self._identity = _identity(settings.path)
        return self._connection

    def wake(self) -> None:
        """New work: wake the thread if it waits (an Event.set per record would cost the
        Tap a lock round trip per message)."""
        if self._idle:
            self._wake.set()

    def add_control(self, control: Control) -> None:
        with self._controls_lock:
            self.controls.append(control)
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def request_retention(self) -> threading.Event:
        """Run a retention pass now (on the writer thread); the event is set after it."""
        done = threading.Event()
        self._retention_now = done
        self._wake.set()
        return done

    # -- the thread -------------------------------------------------------------------

    def run(self) -> None:
        settings = self.settings
        next_retention = time.monotonic() + settings.retention_interval
        next_check = time.monotonic() + settings.file_check_interval
        delay = 0.05
        while True:
            stopping = self._stopping.is_set()
            timeout = min(next_retention, next_check) - time.monotonic()
            self._idle = True
            if not stopping and not self._has_work() and self._retention_now is None:
                self._wake.wait(max(0.0, timeout))
                self._wake.clear()
                self._idle = False
                if self._has_work() and settings.batch_linger > 0:
                    # A first record after a quiet spell: let what follows join its commit.
                    time.sleep(settings.batch_linger)
            self._idle = False
            now = time.monotonic()
            if now >= next_check:
                next_check = now + settings.file_check_interval
                self._check_file()
            if self._has_work():
                if self._write_once():
                    delay = 0.05
                elif self._stopping.is_set() and self._give_up():
                    break
                else:
                    self._stopping.wait(delay)
                    delay = min(delay * 2, 2.0)
                    continue
            elif stopping:
                break
            requested, self._retention_now = self._retention_now, None
            if requested is not None:
                while self._retention(time.time()):
                    pass
                requested.set()
                next_retention = time.monotonic() + settings.retention_interval
            elif time.monotonic() >= next_retention:
                more = self._retention(time.time())
                # More to discard: the next step comes after the batches waiting now.
                next_retention = time.monotonic() + (0 if more else settings.retention_interval)
        self._close_cleanly()

    def _has_work(self) -> bool:
        stats = self.pending.stats()
        return bool(stats.records or stats.dropping or self.controls)

    def _give_up(self) -> bool:
        """Stopping and the disk still refuses: stop retrying at once (the store's close
        has a deadline of its own; what is left is covered by the reservation)."""
        return True

    def _write_once(self) -> bool:
        """Write one batch; False if the disk refused it (it will be retried)."""
        # While writes fail (a full disk), a retry is a probe of a few records: a whole
        # batch, encoded and refused again and again, costs its size in memory and CPU.
        failing = self.state.write_error is not None
        batch = self.pending.take(PROBE_RECORDS if failing else self.settings.batch_max_records)
        with self._controls_lock:
            controls, self.controls = self.controls, []
        started = time.monotonic()
        try:
            self._write(batch, controls)
        except sqlite3.Error as error:
            self.pending.untake()
            with self._controls_lock:
                self.controls[:0] = controls
            self._failed(error, batch)
            return False
        self.pending.commit(batch)
        self.pending.settle_dropped(time.time())
        state = self.state
        state.batches += 1
        state.records_written += len(batch)
        state.observe_batch(time.monotonic() - started)
        if state.write_error is not None:
            self.log.warning("Transcript writes recovered after: %s", state.write_error)
            state.write_error = state.failing_since = None
        with self.committed:
            self.committed.notify_all()
        return True

    def _failed(self, error: sqlite3.Error, batch: list[Record]) -> None:
        state = self.state
        state.failures += 1
        if isinstance(error, sqlite3.OperationalError) or not batch:
            if state.write_error != str(error):
                self.log.error(
                    "Transcript write failed (%s); %d records wait in memory and are retried",
                    error,
                    len(batch),
                )
            state.write_error = str(error)
            if state.failing_since is None:
                state.failing_since = time.monotonic()
            return
        # Not the disk: something in these records SQLite will not take. Write them one
        # by one, so one bad record cannot stop every kernel's transcript.
        self.log.error("Transcript batch refused (%s); writing it record by record", error)
        try:
            self._write_one_by_one(batch)
        finally:
            # What was committed one by one is durable: a flush waiting for it wakes now
            # (it waited out its whole timeout before).
            with self.committed:
                self.committed.notify_all()

    def _write_one_by_one(self, batch: list[Record]) -> None:
        """Each record alone; one SQLite refuses is stored as a placeholder under its
        sequence number (DESIGN invariant 1: the slot stays, saying what was lost)."""
        for record in self.pending.take(len(batch)):
            try:
                self._write([record], [])
            except sqlite3.OperationalError:
                self.pending.untake()  # the disk, not the record: retried as a batch
                return
            except sqlite3.Error as error:
                self.log.error("Transcript record %s/%s refused: %s", record.kernel_id,
                               record.seq, error)  # fmt: skip
                message = unstored_placeholder(record.message, str(error), date=_iso(record.time))
                try:
                    self._write([replace(record, message=message)], [])
                except sqlite3.Error:
                    self.pending.untake()
                    return
            self.pending.commit([record])

    # -- one transaction ------------------------------------------------------------

    def _write(self, batch: list[Record], controls: list[Control]) -> None:
        connection = self._connection
        assert connection is not None
        by_kernel: dict[str, list[Record]] = {}
        for record in batch:
            by_kernel.setdefault(record.kernel_id, []).append(record)
        assigned = self.pending.assigned()
        connection.execute("BEGIN IMMEDIATE")
        try:
            for kernel_id, records in by_kernel.items():
                self._write_kernel(connection, kernel_id, records, assigned.get(kernel_id, 0))
            for control in controls:
                connection.execute(control.sql, control.args)
            connection.execute("COMMIT")
        except BaseException:
            _rollback(connection)
            self._forget_uncommitted(by_kernel)
            raise
        self.state.unreserved.difference_update(by_kernel)

    def _write_kernel(
        self, connection: sqlite3.Connection, kernel_id: str, records: list[Record], assigned: int
    ) -> None:
        key = self._key(connection, kernel_id)
        parents = self._parents.setdefault(kernel_id, {})
        chunks: list[tuple[int, int, float, bytes]] = []
        chunk_parents: set[tuple[int, int, int]] = set()
        marks: list[tuple[int, int, bytes]] = []
        new_parents: list[tuple[int, int, str | None, str | None, bytes]] = []
        parts: list[bytes] = []
        size = 0
        first = previous = records[0]
        stored = 0
        max_bytes = self.settings.chunk_max_bytes
        last_ref = -1
        for record in records:
            message = record.message
            raw_parent = message.raw_parent_header
            ref = NO_PARENT
            if raw_parent != b"{}":
                ref = parents.get(raw_parent, NO_PARENT)
                if ref == NO_PARENT:
                    ref = self._new_ref(connection, kernel_id, key)
                    if len(parents) >= PARENT_CACHE:
                        parents.clear()
                    parents[raw_parent] = ref
                    new_parents.append(
                        (key, ref, message.parent_msg_id, message.parent_msg_type, raw_parent)
                    )
                    stored += len(raw_parent) + ROW_OVERHEAD
            encoded = encode_record(record, ref)
            if parts and size + len(encoded) > max_bytes:
                chunks.append(_chunk(key, first, parts, previous))
                parts, size, first, last_ref = [], 0, record, -1
            parts.append(encoded)
            size += len(encoded)
            previous = record
            if ref != last_ref:
                last_ref = ref
                if ref != NO_PARENT:
                    chunk_parents.add((key, ref, chunk_id(key, first.first_seq)))
            if is_mark(message):
                marks.append((key, record.seq, encoded))
                stored += len(encoded) + ROW_OVERHEAD
        chunks.append(_chunk(key, first, parts, previous))
        stored += sum(len(chunk[3]) + ROW_OVERHEAD for chunk in chunks)
        stored += len(chunk_parents) * ROW_OVERHEAD
        connection.executemany(
            "INSERT OR REPLACE INTO chunks (id, last_seq, time, data) VALUES (?, ?, ?, ?)", chunks
        )
        if new_parents:
            connection.executemany(
                "INSERT OR REPLACE INTO parents (kernel_key, ref, msg_id, msg_type, header) "
                "VALUES (?, ?, ?, ?, ?)",
                new_parents,
            )
        if chunk_parents:
            connection.executemany(
                "INSERT OR IGNORE INTO chunk_parents (kernel_key, ref, chunk) VALUES (?, ?, ?)",
                sorted(chunk_parents),
            )
        if marks:
            connection.executemany(
                "INSERT OR REPLACE INTO marks (kernel_key, seq, data) VALUES (?, ?, ?)", marks
            )
        reserved = max(assigned, records[-1].seq) + self.settings.reserve_ahead
        connection.execute(
            "UPDATE kernels SET head = max(head, ?), bytes = bytes + ?, "
            "reserved = max(reserved, ?) WHERE key = ?",
            (records[-1].seq, stored, reserved, key),
        )
        self._reserved[kernel_id] = reserved

    def _key(self, connection: sqlite3.Connection, kernel_id: str) -> int:
        key = self.keys.get(kernel_id)
        if key is None:
            row = connection.execute(
                "INSERT INTO kernels (kernel_id, started) VALUES (?, ?) "
                "ON CONFLICT (kernel_id) DO UPDATE SET kernel_id = excluded.kernel_id "
                "RETURNING key, reserved",
                (kernel_id, time.time()),
            ).fetchone()
            key = self.keys[kernel_id] = int(row[0])
            self._reserved[kernel_id] = int(row[1])
        return key

    def _new_ref(self, connection: sqlite3.Connection, kernel_id: str, key: int) -> int:
        ref = self._next_ref.get(kernel_id)
        if ref is None:
            (highest,) = connection.execute(
                "SELECT coalesce(max(ref), 0) FROM parents WHERE kernel_key = ?", (key,)
            ).fetchone()
            ref = int(highest)
        ref += 1
        self._next_ref[kernel_id] = ref
        return ref

    def _forget_uncommitted(self, by_kernel: dict[str, list[Record]]) -> None:
        """A rolled-back transaction: parent references and keys it made do not exist."""
        for kernel_id in by_kernel:
            self._parents.pop(kernel_id, None)
            self._next_ref.pop(kernel_id, None)
        self.keys.clear()

    def reservation_check(self) -> None:
        """Note the kernels whose given-out numbers passed their durable reservation (the
        store is failing to write; a crash now could reuse those numbers)."""
        for kernel_id, assigned in self.pending.assigned().items():
            reserved = self._reserved.get(kernel_id)
            if reserved is not None and assigned > reserved:
                self.state.unreserved.add(kernel_id)

    # -- the file ---------------------------------------------------------------------

    def _check_file(self) -> None:
        """Is the database at the path still the one we write? Restore it if deleted or
        replaced (the file in its place is set aside)."""
        self.reservation_check()
        current = _identity(self.settings.path)
        state = self.state
        if current == self._identity:
            if state.file_problem is not None:
                self.log.warning("Transcript database is back in place")
                state.file_problem = None
            return
        problem = "database_deleted" if current is None else "database_replaced"
        if state.file_problem != problem:
            self.log.error(
                "Transcript database %s was %s under the gateway",
                self.settings.path,
                "deleted" if current is None else "replaced by another file",
            )
            state.file_problem = problem
        if current is not None and not self._set_aside(current):
            return
        self._restore()

    def _set_aside(self, current: tuple[int, int]) -> bool:
        """Move the file that took the database's place aside (kept whole, beside it), so
        that the database we hold open is restored to its path: numbering and serving on
        from another file would give a live kernel's seqs a second history (and answer
        404 for its transcript). True once the path is free."""
        path = self.settings.path
        aside = f"{path}.replaced-{time.strftime('%Y%m%dT%H%M%S')}-{current[1]}"
        try:
            if _identity(path) != current:  # replaced again meanwhile: look again next time
                return False
            os.rename(path, aside)
        except OSError as error:
            self.log.error("Could not set the file that replaced the database aside: %s", error)
            return False
        self.log.error("The file that replaced the transcript database is kept as %s", aside)
        return True

    def _restore(self) -> None:
        """Write the database we still hold open back to its path, and reopen it there."""
        connection = self._connection
        assert connection is not None
        path = self.settings.path
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
            create_private_file(path)
            connection.execute("VACUUM INTO ?", (path,))
        except Exception as error:  # an adapter's edge: report and retry at the next check
            self.log.error("Could not restore the transcript database: %s", error)
            return
        connection.close()
        self.open()
        self._on_reconnect()
        self.state.restored += 1
        self.state.file_problem = None
        self.log.warning("Transcript database restored to %s from the open copy", path)

    # -- retention --------------------------------------------------------------------

    def _retention(self, now: float) -> bool:
        """One retention step; True if there is more to discard."""
        try:
            return self.apply_retention(now)
        except sqlite3.Error as error:
            self.log.error("Transcript retention failed: %s", error)
            return False

    def apply_retention(self, now: float) -> bool:
        """Discard what retention says to (oldest first, whole chunks), up to
        :data:`RETENTION_STEP_BYTES` per kernel; True if more is left to discard. Writer
        thread."""
        connection = self._connection
        assert connection is not None
        settings = self.settings
        horizon = max(settings.max_age, settings.keep_after_shutdown)
        if horizon:
            connection.execute("DELETE FROM cursors WHERE updated < ?", (now - horizon,))
        rows = connection.execute("SELECT key, kernel_id, bytes, ended FROM kernels").fetchall()
        more = False
        for key, kernel_id, size, ended in rows:
            low, high = kernel_range(key)
            if (
                ended is not None
                and settings.keep_after_shutdown
                and now - ended > settings.keep_after_shutdown
                and not self.pending.holds(kernel_id)
            ):
                self._drop_kernel(connection, key, kernel_id)
                continue
            cutoff = 0  # the last chunk id to discard
            if settings.max_age:
                (aged,) = connection.execute(
                    "SELECT max(id) FROM chunks WHERE id BETWEEN ? AND ? AND time < ?",
                    (low, high, now - settings.max_age),
                ).fetchone()
                cutoff = max(cutoff, aged or 0)
            if settings.max_bytes_per_kernel and size > settings.max_bytes_per_kernel:
                excess = size - int(settings.max_bytes_per_kernel * 0.9)
                row = connection.execute(
                    "SELECT id FROM (SELECT id, sum(length(data) + ?) OVER (ORDER BY id) AS "
                    "total FROM chunks WHERE id BETWEEN ? AND ?) WHERE total >= ? LIMIT 1",
                    (ROW_OVERHEAD, low, high, excess),
                ).fetchone()
                if row:
                    cutoff = max(cutoff, row[0])
            if cutoff:
                step = connection.execute(
                    "SELECT id FROM (SELECT id, sum(length(data) + ?) OVER (ORDER BY id) AS "
                    "total FROM chunks WHERE id BETWEEN ? AND ?) WHERE total >= ? LIMIT 1",
                    (ROW_OVERHEAD, low, cutoff, RETENTION_STEP_BYTES),
                ).fetchone()
                if step and step[0] < cutoff:
                    cutoff, more = step[0], True
                self._discard(connection, key, kernel_id, low, cutoff)
        return more

    def _discard(
        self, connection: sqlite3.Connection, key: int, kernel_id: str, low: int, cutoff: int
    ) -> None:
        (last,) = connection.execute(
            "SELECT last_seq FROM chunks WHERE id = ?", (cutoff,)
        ).fetchone()
        connection.execute("BEGIN IMMEDIATE")
        try:
            connection.execute("DELETE FROM chunks WHERE id BETWEEN ? AND ?", (low, cutoff))
            connection.execute(
                "DELETE FROM chunk_parents WHERE kernel_key = ? AND chunk <= ?", (key, cutoff)
            )
            connection.execute("DELETE FROM marks WHERE kernel_key = ? AND seq <= ?", (key, last))
            connection.execute(
                "DELETE FROM parents WHERE kernel_key = ? AND ref NOT IN "
                "(SELECT ref FROM chunk_parents WHERE kernel_key = ?)",
                (key, key),
            )
            connection.execute(
                "UPDATE kernels SET first_seq = max(first_seq, ?), bytes = ("
                " (SELECT coalesce(sum(length(data) + ?), 0) FROM chunks WHERE id BETWEEN ? AND ?)"
                " + (SELECT coalesce(sum(length(header) + ?), 0) FROM parents WHERE kernel_key = ?)"
                " + (SELECT coalesce(sum(length(data) + ?), 0) FROM marks WHERE kernel_key = ?)"
                ") WHERE key = ?",
                (last + 1, ROW_OVERHEAD, low, low | ((1 << 40) - 1), ROW_OVERHEAD, key,
                 ROW_OVERHEAD, key, key),
            )  # fmt: skip
            connection.execute("COMMIT")
        except BaseException:
            _rollback(connection)
            raise
        self._parents.pop(kernel_id, None)
        self.log.debug("Retention discarded %s records up to seq %s", kernel_id, last)

    def _drop_kernel(self, connection: sqlite3.Connection, key: int, kernel_id: str) -> None:
        low, high = kernel_range(key)
        connection.execute("BEGIN IMMEDIATE")
        try:
            connection.execute("DELETE FROM chunks WHERE id BETWEEN ? AND ?", (low, high))
            for table in ("chunk_parents", "marks", "parents"):
                connection.execute(f"DELETE FROM {table} WHERE kernel_key = ?", (key,))
            connection.execute("DELETE FROM cursors WHERE kernel_id = ?", (kernel_id,))
            connection.execute("DELETE FROM links WHERE kernel_id = ?", (kernel_id,))
            connection.execute("DELETE FROM kernels WHERE key = ?", (key,))
            connection.execute("COMMIT")
        except BaseException:
            _rollback(connection)
            raise
        self.keys.pop(kernel_id, None)
        self._parents.pop(kernel_id, None)
        self._next_ref.pop(kernel_id, None)
        self._reserved.pop(kernel_id, None)
        self.pending.forget(kernel_id)
        self.log.debug("Retention discarded the transcript of %s", kernel_id)

    # -- stopping ---------------------------------------------------------------------

    def _close_cleanly(self) -> None:
        """Everything given out is durable: give back the reservations (no gap at the next
        start), then close."""
        connection = self._connection
        if connection is None:
            return
        if not self.pending.stats().records and not self.pending.stats().dropping:
            try:
                connection.execute("UPDATE kernels SET reserved = head")
            except sqlite3.Error as error:
                self.log.error("Could not release transcript reservations: %s", error)
        connection.close()
        self._connection = None
        with self.committed:
            self.committed.notify_all()


def _rollback(connection: sqlite3.Connection) -> None:
    """Roll back the transaction a failed write began, if SQLite has not already: after
    some errors (a full disk, an I/O error) it rolls back by itself, and a ROLLBACK then
    raised "cannot rollback - no transaction is active" in place of the error, skipping
    what undoes the writer's own bookkeeping."""
    if connection.in_transaction:
        # A broken connection fails this too: the error being raised says why.
        with contextlib.suppress(sqlite3.Error):
            connection.execute("ROLLBACK")


def _chunk(
    key: int, first: Record, parts: list[bytes], last: Record
) -> tuple[int, int, float, bytes]:
    return (chunk_id(key, first.first_seq), last.seq, last.time, b"".join(parts))


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat()


def _identity(path: str) -> tuple[int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino
