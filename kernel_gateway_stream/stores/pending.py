"""Records appended but not yet durable: readable at once, and bounded.

The Tap appends on the event loop and must never wait for the disk (DESIGN invariant 4);
a writer thread makes records durable in batches. Between the two sits this buffer:

* A record is readable from the moment it is pushed (:meth:`PendingBuffer.snapshot`).
* The writer :meth:`~PendingBuffer.take`\\ s a batch, writes it and
  :meth:`~PendingBuffer.commit`\\ s it out; if the write fails it
  :meth:`~PendingBuffer.untake`\\ s it and retries later. Nothing is lost while it retries.
* The buffer holds at most ``max_bytes`` (every buffer has a bound), and a reserve for
  control records past it (:mod:`..core.reserve`: an execution's ``idle``, the gateway's
  marks). Any other record pushed while it is full is not kept: its sequence number joins
  the kernel's *dropped range*, and the next record that fits is preceded by one gap record
  for the whole range, so the transcript says exactly what it could not keep (DESIGN
  invariant 1). Live clients got those records all the same: fan-out does not go through
  the store.

Shared by the loop and the writer thread; every method takes the lock briefly.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..core.messages import Record
from ..core.reserve import fits, is_control

__all__ = ["PendingBuffer", "PendingStats"]

#: ``make_gap(kernel_id, first_seq, last_seq, now) -> Record``.
GapFactory = Callable[[str, int, int, float], Record]


@dataclass(frozen=True, slots=True)
class PendingStats:
    """What the buffer holds and has had to drop, for health and metrics."""

    records: int
    bytes: int
    max_bytes: int
    dropped_records: int
    gap_records: int
    #: Kernels whose records are being dropped right now.
    dropping: int


class _KernelQueue:
    __slots__ = ("bytes", "dropped", "records", "seqs", "taken")

    def __init__(self) -> None:
        self.records: list[Record] = []
        #: ``seq`` of each record, for bisecting reads.
        self.seqs: list[int] = []
        #: How many records from the front the writer has taken and not committed yet.
        self.taken = 0
        self.bytes = 0
        #: ``[first, last]`` sequence numbers dropped since the last record kept.
        self.dropped: list[int] | None = None


class PendingBuffer:
    """See the module docstring. ``make_gap`` builds the gap record for a dropped range."""

    def __init__(self, max_bytes: int, make_gap: GapFactory) -> None:
        self.max_bytes = max_bytes
        self._make_gap = make_gap
        self._lock = threading.Lock()
        self._kernels: dict[str, _KernelQueue] = {}
        self._bytes = 0
        self._records = 0
        self._dropped_records = 0
        self._gap_records = 0
        #: The highest sequence number pushed (kept or dropped) per kernel.
        self._assigned: dict[str, int] = {}

    def push(self, record: Record) -> bool:
        """Keep ``record`` until it is durable; False if it was dropped (buffer full)."""
        size = cost(record)
        with self._lock:
            queue = self._kernels.get(record.kernel_id)
            if queue is None:
                queue = self._kernels[record.kernel_id] = _KernelQueue()
            self._assigned[record.kernel_id] = record.seq
            control = is_control(record.message)
            if self._records and not fits(self._bytes, size, self.max_bytes, control):
                self._dropped_records += 1
                if queue.dropped is None:
                    queue.dropped = [record.first_seq, record.seq]
                else:
                    queue.dropped[1] = record.seq
                return False
            if queue.dropped is not None:
                # Room again: the gap goes in first, however full that makes the buffer
                # (a gap record is small, and it is what keeps the transcript honest).
                first, last = queue.dropped
                queue.dropped = None
                self._gap_records += 1
                gap = self._make_gap(record.kernel_id, first, last, record.time)
                self._keep(queue, gap, cost(gap))
            self._keep(queue, record, size)
            return True

    def _keep(self, queue: _KernelQueue, record: Record, size: int) -> None:
        queue.records.append(record)
        queue.seqs.append(record.seq)
        queue.bytes += size
        self._bytes += size
        self._records += 1

    def settle_dropped(self, now: float) -> int:
        """Where records were dropped and there is room again, put the gap record in now
        (rather than before the kernel's next record, which may be long in coming).
        Called by the writer after a commit; returns how many gaps it put in."""
        settled = 0
        with self._lock:
            for kernel_id, queue in self._kernels.items():
                if queue.dropped is not None and self._bytes < self.max_bytes:
                    first, last = queue.dropped
                    queue.dropped = None
                    self._gap_records += 1
                    gap = self._make_gap(kernel_id, first, last, now)
                    self._keep(queue, gap, cost(gap))
                    settled += 1
        return settled

    def take(self, max_records: int) -> list[Record]:
        """Up to ``max_records`` records the writer has not taken yet, each kernel's in
        order. They stay readable until committed."""
        batch: list[Record] = []
        with self._lock:
            for queue in self._kernels.values():
                room = max_records - len(batch)
                if room <= 0:
                    break
                if queue.taken < len(queue.records):
                    taken = queue.records[queue.taken : queue.taken + room]
                    queue.taken += len(taken)
                    batch.extend(taken)
        return batch

    def untake(self) -> None:
        """The writer could not write what it took: it will take it again."""
        with self._lock:
            for queue in self._kernels.values():
                queue.taken = 0

    def commit(self, batch: list[Record]) -> None:
        """``batch`` (as taken) is durable: forget it."""
        counts: dict[str, int] = {}
        for record in batch:
            counts[record.kernel_id] = counts.get(record.kernel_id, 0) + 1
        with self._lock:
            for kernel_id, count in counts.items():
                queue = self._kernels[kernel_id]
                size = sum(cost(record) for record in queue.records[:count])
                del queue.records[:count]
                del queue.seqs[:count]
                queue.taken -= count
                queue.bytes -= size
                self._bytes -= size
                self._records -= count
                if not queue.records and queue.dropped is None:
                    del self._kernels[kernel_id]

    def snapshot(self, kernel_id: str, since: int, until: int) -> tuple[list[Record], int]:
        """``(records, committed)``: the pending records with ``since < seq <= until``, a
        gap record for a range being dropped right now if it falls in there, and the
        sequence number below which everything is durable (or dropped)."""
        with self._lock:
            queue = self._kernels.get(kernel_id)
            if queue is None:
                return [], 1 << 62
            low = bisect.bisect_right(queue.seqs, since)
            high = bisect.bisect_right(queue.seqs, until)
            records = queue.records[low:high]
            committed = queue.seqs[0] - 1 if queue.seqs else 1 << 62
            dropped = queue.dropped
        if dropped is not None and dropped[1] > since and dropped[0] <= until:
            if not records:
                committed = min(committed, dropped[0] - 1)
            last = min(dropped[1], until)
            records.append(self._make_gap(kernel_id, dropped[0], last, 0.0))
        return records, committed

    def has_room(self) -> bool:
        """Whether records pushed now are kept: an eighth of the bound is left (a batch of
        the Tap's, and the reserve for control records, fit in it)."""
        return self._bytes <= self.max_bytes - self.max_bytes // 8

    def durable_head(self, kernel_id: str) -> int:
        """The highest sequence number up to which every record of ``kernel_id`` pushed
        is durable (or was not kept, and is a gap)."""
        with self._lock:
            queue = self._kernels.get(kernel_id)
            if queue is not None and queue.seqs:
                return queue.seqs[0] - 1
            return self._assigned.get(kernel_id, 0)

    def assigned_head(self, kernel_id: str) -> int:
        """The highest sequence number pushed for ``kernel_id`` (0: none)."""
        return self._assigned.get(kernel_id, 0)

    def assigned(self) -> dict[str, int]:
        """The highest sequence number pushed, per kernel."""
        with self._lock:
            return dict(self._assigned)

    def holds(self, kernel_id: str) -> bool:
        """True while records of ``kernel_id`` wait to be written (or are being dropped)."""
        with self._lock:
            return kernel_id in self._kernels

    def forget(self, kernel_id: str) -> None:
        """The kernel's transcript is gone (retention): forget its numbering."""
        with self._lock:
            self._assigned.pop(kernel_id, None)

    def stats(self) -> PendingStats:
        with self._lock:
            return PendingStats(
                records=self._records,
                bytes=self._bytes,
                max_bytes=self.max_bytes,
                dropped_records=self._dropped_records,
                gap_records=self._gap_records,
                dropping=sum(1 for queue in self._kernels.values() if queue.dropped),
            )


#: What a pending record costs in memory besides its parts and its text: the Record, the
#: KernelMessage and the bytes and str objects around them (measured: about 400 bytes).
RECORD_OVERHEAD = 400


def cost(record: Record) -> int:
    """A pending record's memory, as the bound counts it: its parts, the stream text decoded
    from them, and the objects around them."""
    message = record.message
    return message.size + (len(message.text) if message.text else 0) + RECORD_OVERHEAD
