"""Per-kernel sequence numbers (Invariant 1)."""

from __future__ import annotations

import pytest
from helpers import status, stream

from kernel_gateway_stream.core.sequencer import Sequencer


def test_numbers_are_strictly_increasing_and_gap_free() -> None:
    """Invariant 1: every message gets exactly one number: 1, 2, 3, ... with no gap."""
    sequencer = Sequencer("kernel-a")
    assert sequencer.head == 0
    messages = [stream("stdout", str(i)) if i % 3 else status() for i in range(100)]

    records = [sequencer.assign(m, now=50.0 + i) for i, m in enumerate(messages)]

    assert [r.seq for r in records] == list(range(1, 101))
    assert sequencer.head == 100
    assert all(r.kernel_id == "kernel-a" for r in records)
    assert all(r.message is m for r, m in zip(records, messages, strict=True))
    assert [r.time for r in records] == [50.0 + i for i in range(100)]


def test_the_same_message_twice_gets_two_numbers() -> None:
    """Invariant 1: numbering counts receptions, not distinct messages."""
    sequencer = Sequencer("k")
    message = status()
    assert [sequencer.assign(message, now=0.0).seq for _ in range(3)] == [1, 2, 3]


def test_numbering_continues_from_the_store_head() -> None:
    """Invariant 1: after a gateway restart numbering continues at head + 1."""
    sequencer = Sequencer("kernel-b", head=41)
    assert sequencer.head == 41
    first = sequencer.assign(stream("stdout", "x"), now=1.5)
    second = sequencer.assign(status(), now=1.5)
    assert (first.seq, second.seq) == (42, 43)
    assert (first.kernel_id, first.time) == ("kernel-b", 1.5)
    assert sequencer.head == 43


def test_sequencers_of_different_kernels_are_independent() -> None:
    """Invariant 1: numbers are per kernel."""
    a, b = Sequencer("a"), Sequencer("b", head=7)
    assert a.assign(status(), now=0.0).seq == 1
    assert b.assign(status(), now=0.0).seq == 8
    assert a.assign(status(), now=0.0).seq == 2


@pytest.mark.parametrize("head", [-1, -100])
def test_negative_head_is_rejected(head: int) -> None:
    """Invariant 1: a head below zero is not a transcript position."""
    with pytest.raises(ValueError, match="head must be >= 0"):
        Sequencer("k", head=head)
