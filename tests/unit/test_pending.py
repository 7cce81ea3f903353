"""The store's bounded buffer of records not yet durable (stores/pending.py), without a
writer thread: the test plays the writer (take, commit, untake)."""

from __future__ import annotations

from helpers import record, status, stream

from kernel_gateway_stream.core.marks import gap_record
from kernel_gateway_stream.core.messages import Record
from kernel_gateway_stream.stores.pending import PendingBuffer, cost


def _gap(kernel_id: str, first: int, last: int, now: float) -> Record:
    return gap_record(kernel_id, first, last, "store_backlog_full", now=now, date="")


def covered(records: list[Record]) -> list[int]:
    return [seq for r in records for seq in range(r.first_seq, r.seq + 1)]


def test_readable_at_once_and_gone_once_committed() -> None:
    buffer = PendingBuffer(1 << 20, _gap)
    for seq in range(1, 11):
        assert buffer.push(record(seq, stream("stdout", f"{seq}")))
    records, committed = buffer.snapshot("k", 3, 7)
    assert [r.seq for r in records] == [4, 5, 6, 7]
    assert committed == 0  # nothing durable yet: everything from seq 1 is here
    batch = buffer.take(4)
    assert [r.seq for r in batch] == [1, 2, 3, 4]
    buffer.untake()  # the write failed: the same records are taken again
    batch = buffer.take(4)
    assert [r.seq for r in batch] == [1, 2, 3, 4]
    buffer.commit(batch)
    records, committed = buffer.snapshot("k", 0, 100)
    assert ([r.seq for r in records], committed) == (list(range(5, 11)), 4)
    assert buffer.stats().records == 6
    assert buffer.assigned_head("k") == 10


def test_past_its_bound_records_become_one_gap_for_the_whole_range() -> None:
    """Invariants 1 and 4: the buffer never holds more than its bound (plus one small gap
    record); numbers past it are not kept but stay accounted for: a reader is told of the
    range while it is being dropped, and the writer settles it as one gap record as soon
    as there is room."""
    one = cost(record(1, stream("stdout", "x" * 100)))
    buffer = PendingBuffer(5 * one, _gap)
    kept = [buffer.push(record(seq, stream("stdout", "x" * 100))) for seq in range(1, 21)]
    assert kept == [True] * 5 + [False] * 15
    stats = buffer.stats()
    assert (stats.records, stats.dropped_records, stats.dropping) == (5, 15, 1)
    assert stats.bytes <= 5 * one
    assert covered(buffer.snapshot("k", 0, 100)[0]) == list(range(1, 21))
    buffer.commit(buffer.take(5))
    assert buffer.settle_dropped(now=1.0) == 1
    records, _ = buffer.snapshot("k", 0, 100)
    assert [(r.first_seq, r.seq) for r in records] == [(6, 20)]
    assert buffer.push(record(21, stream("stdout", "after")))
    assert covered(buffer.snapshot("k", 0, 100)[0]) == list(range(6, 22))
    assert buffer.stats().gap_records == 1


def test_a_record_that_fits_after_a_drop_comes_after_its_gap() -> None:
    """Room again before the writer settled it: the gap goes in first, then the record."""
    one = cost(record(1, stream("stdout", "y")))
    buffer = PendingBuffer(2 * one, _gap)
    for seq in range(1, 6):
        buffer.push(record(seq, stream("stdout", "y")))
    buffer.commit(buffer.take(10))
    assert buffer.push(record(6, stream("stdout", "y")))
    records, _ = buffer.snapshot("k", 0, 100)
    assert [(r.first_seq, r.seq) for r in records] == [(3, 5), (6, 6)]


def test_past_its_bound_an_idle_still_passes_after_its_gap_and_output_does_not() -> None:
    """Issue 25 item 5: a full buffer drops output, never an execution's end. The idle
    pushed while the buffer is full is kept, after the gap for what was dropped before it;
    output after it is dropped again (a flood of small prints cannot use the reserve up);
    the buffer stays within its bound plus the reserve of an eighth."""
    one = cost(record(1, stream("stdout", "x" * 100)))
    bound = 16 * one
    buffer = PendingBuffer(bound, _gap)
    kept = [buffer.push(record(seq, stream("stdout", "x" * 100))) for seq in range(1, 31)]
    assert kept == [True] * 16 + [False] * 14
    assert buffer.push(record(31, status("idle")))
    assert not buffer.push(record(32, stream("stdout", "x")))
    records, _ = buffer.snapshot("k", 0, 100)
    spans = [(r.first_seq, r.seq, r.message.msg_type) for r in records[16:]]
    assert spans == [
        (17, 30, "kernel_gateway_stream_gap"),
        (31, 31, "status"),
        (32, 32, "kernel_gateway_stream_gap"),
    ]
    assert covered(records) == list(range(1, 33))
    # A kernel publishing statuses of its own fills the reserve, and no more.
    statuses = [buffer.push(record(seq, status("busy"))) for seq in range(33, 1033)]
    assert statuses.count(True) < len(statuses)
    assert buffer.stats().bytes <= bound + bound // 8


def test_room_ends_an_eighth_before_the_bound_and_comes_back_with_commits() -> None:
    """A Tap whose kernel holds its output stops reading while there is no room (see
    KernelRecorder.accepting): before any record past the bound is dropped."""
    one = cost(record(1, stream("stdout", "x" * 100)))
    buffer = PendingBuffer(16 * one, _gap)
    for seq in range(1, 16):
        assert buffer.has_room()
        assert buffer.push(record(seq, stream("stdout", "x" * 100)))
    assert not buffer.has_room()
    assert buffer.stats().dropped_records == 0
    buffer.commit(buffer.take(10))
    assert buffer.has_room()
