"""Committed-only delivery (core/committed.py) and the owner's step-down clock
(core/ownership.py): pure, with no event loop and no clock but the one passed in."""

from __future__ import annotations

from helpers import record, stream

from kernel_gateway_stream.core.committed import CommittedFeed
from kernel_gateway_stream.core.marks import gap_record
from kernel_gateway_stream.core.ownership import STEP_DOWN_MARGIN, overdue, step_down_at


def test_written_records_are_fanned_out_once_in_order() -> None:
    feed = CommittedFeed()
    first = [record(seq, stream("stdout", f"{seq}\n")) for seq in (1, 2, 3)]
    assert feed.written(first) == first
    assert feed.head == 3
    # A retried append that had landed: written again, fanned out no more.
    again = [*first[1:], record(4, stream("stdout", "4\n"))]
    assert [r.seq for r in feed.written(again)] == [4]
    assert feed.written([]) == []
    assert feed.head == 4


def test_a_gap_the_store_wrote_instead_of_records_is_what_clients_get() -> None:
    """The pending buffer dropped 2-4 and wrote one gap record for them: the clients get
    the gap, as the transcript has it, never the lines it stands for."""
    feed = CommittedFeed(1)
    gap = gap_record("k", 2, 4, "store_backlog_full", now=0.0, date="")
    five = record(5, stream("stdout", "5\n"))
    assert feed.written([gap, five]) == [gap, five]
    assert feed.head == 5


def test_nothing_at_or_below_the_head_is_fanned_out_again() -> None:
    """A node that took a kernel back after losing it starts at its takeover gap: its
    writer's older records, numbered before it lost the lease, are never fanned out."""
    feed = CommittedFeed(1000)
    stale = [record(seq, stream("stdout", "old\n")) for seq in (998, 999, 1000)]
    assert feed.written(stale) == []
    assert feed.head == 1000


def test_an_owner_steps_down_before_its_lease_can_run_out_at_redis() -> None:
    ttl = 10.0
    at = step_down_at(100.0, ttl)
    assert 100.0 < at < 100.0 + ttl
    assert at == 100.0 + ttl * (1 - STEP_DOWN_MARGIN)
    renewed = {"a": 100.0, "b": 105.0}
    assert overdue(renewed, ttl, at - 0.001) == []
    assert overdue(renewed, ttl, at) == ["a"]
    assert overdue(renewed, ttl, at + 5.0) == ["a", "b"]
    # Paused for an hour: everything is overdue the moment the node looks.
    assert overdue(renewed, ttl, 3700.0) == ["a", "b"]
