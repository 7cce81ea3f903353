"""The benchmark's counter of delivered lines: what "complete, in order" means in the
tables rests on it, so it is tested like the rest."""

from __future__ import annotations

from typing import Any

from benchmarks.wsclient import Tally


def _stream(text: str, parent: str = "run", seq: int | None = None) -> dict[str, Any]:
    metadata = {"kernel_gateway_stream": {"seq": seq}} if seq is not None else {}
    return {
        "header": {"msg_type": "stream"},
        "parent_header": {"msg_id": parent},
        "metadata": metadata,
        "content": {"name": "stdout", "text": text},
    }


def _idle(parent: str = "run") -> dict[str, Any]:
    return {
        "header": {"msg_type": "status"},
        "parent_header": {"msg_id": parent},
        "metadata": {},
        "content": {"execution_state": "idle"},
    }


def test_merged_and_split_lines_count_once_in_order() -> None:
    tally = Tally("run")
    tally.feed(_stream("0 a\n1 b\n2 c\n", seq=3))
    tally.feed(_stream("3 d\n4 "))  # a line flushed in two messages
    tally.feed(_stream("e\n5 f\n", seq=9))
    assert not tally.done
    assert tally.feed(_idle())
    assert (tally.lines, tally.gaps, tally.next_index, tally.last_seq) == (6, 0, 6, 9)
    assert tally.last_line == "5 f\n"


def test_a_missing_line_is_a_gap_and_other_executions_are_ignored() -> None:
    tally = Tally("run")
    tally.feed(_stream("0\n1\n"))
    tally.feed(_stream("0\n", parent="other"))
    tally.feed(_stream("3\n"))  # 2 never came
    tally.feed(_stream("4\n6\n"))  # 5 missing inside one merged message
    assert tally.lines == 5
    assert tally.gaps == 2
    assert not tally.feed(_idle(parent="other"))


def test_unnumbered_lines_are_counted_without_an_order_check() -> None:
    tally = Tally("run")
    tally.feed(_stream("warm\n"))
    assert (tally.lines, tally.gaps) == (1, 0)
