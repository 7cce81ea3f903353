"""Executions for programs: normalized events, and the summary rebuilt from records."""

from __future__ import annotations

import json

from helpers import make_message, record, status, stream

from kernel_gateway_stream.core.executions import SummaryBuilder, normalize, summarize
from kernel_gateway_stream.core.frames import Frame
from kernel_gateway_stream.core.marks import gap_record, lifecycle_status
from kernel_gateway_stream.core.wire import Protocol

RUN = "run-1"


def test_normalized_events() -> None:
    assert normalize(stream("stdout", "a\n", RUN)) == ("stdout", {"text": "a\n"})
    assert normalize(stream("stderr", "b", RUN), text="merged") == ("stderr", {"text": "merged"})
    error = make_message("error", {"ename": "E", "evalue": "v", "traceback": ["t"]}, RUN)
    assert normalize(error) == ("error", {"ename": "E", "evalue": "v", "traceback": ["t"]})
    result = make_message(
        "execute_result", {"data": {"text/plain": "1"}, "metadata": {}, "execution_count": 3}, RUN
    )
    assert normalize(result) == (
        "result",
        {"data": {"text/plain": "1"}, "metadata": {}, "execution_count": 3},
    )
    display = make_message("display_data", {"data": {"text/html": "x"}, "metadata": {}}, RUN)
    assert normalize(display) == (
        "display",
        {"data": {"text/html": "x"}, "metadata": {}, "transient": None},
    )
    assert normalize(status("busy", RUN)) == ("status", {"execution_state": "busy"})
    assert (
        normalize(make_message("execute_input", {"code": "1", "execution_count": 1}, RUN)) is None
    )


def test_execution_encoding_is_an_sse_event_with_the_seq_as_id() -> None:
    frame = Frame.from_record(record(7, stream("stdout", "hi\n", RUN)))
    payload, binary = frame.encode(Protocol.EXECUTION)
    assert not binary
    assert payload == b'id: 7\nevent: stdout\ndata: {"text": "hi\\n"}\n\n'
    assert Frame.from_record(record(8, make_message("execute_input", {}, RUN))).encode(
        Protocol.EXECUTION
    ) == (b"", False)


def _run(*messages: object, error: dict[str, object] | None = None) -> list[object]:
    records = []
    for seq, message in enumerate(messages, start=1):
        records.append(record(seq, message, time=float(seq)))  # type: ignore[arg-type]
    return records


def test_summary_of_a_finished_run() -> None:
    records = _run(
        status("busy", RUN),
        make_message("execute_input", {"code": "x", "execution_count": 4}, RUN),
        stream("stdout", "a", RUN),
        stream("stderr", "b", RUN),
        stream("stdout", "c", RUN),
        make_message(
            "execute_result",
            {"data": {"text/plain": "1"}, "metadata": {}, "execution_count": 4},
            RUN,
        ),
        stream("stdout", "other run", "run-2"),
        status("idle", RUN),
    )
    summary = summarize(RUN, records)  # type: ignore[arg-type]
    assert summary is not None
    assert (summary.status, summary.stdout, summary.stderr) == ("ok", "ac", "b")
    assert summary.execution_count == 4
    assert [o["type"] for o in summary.outputs] == ["result"]
    assert (summary.started, summary.ended, summary.duration, summary.last_seq) == (
        1.0,
        8.0,
        7.0,
        8,
    )
    assert json.loads(json.dumps(summary.to_json()))["status"] == "ok"


def test_summary_statuses() -> None:
    def status_of(*messages: object) -> str | None:
        summary = summarize(RUN, _run(*messages))  # type: ignore[arg-type]
        return None if summary is None else summary.status

    started = (status("busy", RUN), make_message("execute_input", {"execution_count": 1}, RUN))
    failed = make_message("error", {"ename": "ValueError", "evalue": "", "traceback": []}, RUN)
    stopped = make_message(
        "error", {"ename": "KeyboardInterrupt", "evalue": "", "traceback": []}, RUN
    )
    assert status_of(*started) == "running"
    assert status_of(*started, failed, status("idle", RUN)) == "error"
    assert status_of(*started, stopped, status("idle", RUN)) == "interrupted"
    assert status_of(status("busy", RUN), status("idle", RUN)) == "aborted"
    assert status_of(stream("stdout", "x", "someone-else")) is None


def _lifecycle(state: str, reason: str) -> object:
    return lifecycle_status(state, reason, msg_id=f"{state}-{reason}", date="", session="")


def test_a_lifecycle_mark_ends_an_unfinished_execution_with_its_reason() -> None:
    """An execution the kernel will never finish (a restart, a death, a shutdown while it
    ran) ends: died with the mark's reason once the kernel had taken it, its busy alone
    too (a kernel killed at once may never send the execute_input it had queued: seen in
    a fresh clone, a sandbox kernel killed for its memory 0.7 s into the cell); a mark
    after its idle changes nothing. (Not taken, queued: see the next test.)"""
    started = (status("busy", RUN), make_message("execute_input", {"execution_count": 1}, RUN))
    for reason in ("restart_requested", "kernel_died", "shutdown"):
        records = _run(*started, stream("stdout", "x", RUN), _lifecycle("restarting", reason))
        summary = summarize(RUN, records)  # type: ignore[arg-type]
        assert summary is not None
        assert (summary.status, summary.reason, summary.last_seq) == ("died", reason, 4)
        assert summary.ended == 4.0
    taken = summarize(RUN, _run(status("busy", RUN), _lifecycle("dead", "memory_limit")))  # type: ignore[arg-type]
    assert taken is not None
    assert (taken.status, taken.reason) == ("died", "memory_limit")
    finished = summarize(
        RUN,
        _run(*started, status("idle", RUN), _lifecycle("dead", "shutdown")),  # type: ignore[arg-type]
    )
    assert finished is not None
    assert (finished.status, finished.reason) == ("ok", None)


def test_queued_until_seen_and_aborted_by_a_restart_before_it_ran() -> None:
    """An execution the gateway sent (at transcript head 5) is queued until its first
    record; a restart recorded after the send aborts it, one recorded before does not."""
    before = record(5, _lifecycle("restarting", "restart_requested"))  # type: ignore[arg-type]
    after = record(9, _lifecycle("restarting", "kernel_died"))  # type: ignore[arg-type]
    builder = SummaryBuilder(RUN)
    builder.feed_marks([before])
    summary = builder.result(sent_after=5)
    assert summary is not None
    assert summary.status == "queued"
    builder = SummaryBuilder(RUN)
    builder.feed_marks([before, after])
    summary = builder.result(sent_after=5)
    assert summary is not None
    assert (summary.status, summary.reason) == ("aborted", "kernel_died")
    assert SummaryBuilder(RUN).result() is None


def test_gaps_while_it_ran_are_listed() -> None:
    """A transcript gap inside an execution's range is listed (output may be missing); one
    before it is not."""
    builder = SummaryBuilder(RUN)
    builder.feed(
        [
            record(10, status("busy", RUN)),
            record(11, make_message("execute_input", {"execution_count": 2}, RUN)),
            record(50, stream("stdout", "after the gap\n", RUN)),
            record(51, status("idle", RUN)),
        ]
    )
    early = gap_record("k", 1, 4, "gateway_restarted", now=0.0, date="")
    inside = gap_record("k", 12, 49, "store_backlog_full", now=0.0, date="")
    builder.feed_marks([early, inside])
    summary = builder.result()
    assert summary is not None
    assert (summary.status, summary.gaps) == ("ok", [(12, 49)])
    assert json.loads(json.dumps(summary.to_json()))["gaps"] == [[12, 49]]


def test_display_updates_replace_the_output_with_their_display_id() -> None:
    """update_display_data changes the output it names, as a frontend renders it."""
    shown = make_message(
        "display_data",
        {"data": {"text/plain": "0%"}, "metadata": {}, "transient": {"display_id": "bar"}},
        RUN,
    )
    updated = make_message(
        "update_display_data",
        {"data": {"text/plain": "100%"}, "metadata": {}, "transient": {"display_id": "bar"}},
        RUN,
    )
    stray = make_message(
        "update_display_data",
        {"data": {"text/plain": "?"}, "metadata": {}, "transient": {"display_id": "nope"}},
        RUN,
    )
    summary = summarize(RUN, _run(status("busy", RUN), shown, updated, stray))  # type: ignore[arg-type]
    assert summary is not None
    assert [output["data"] for output in summary.outputs] == [{"text/plain": "100%"}]


def test_a_large_summary_is_linear_and_keeps_the_tail_of_its_text() -> None:
    """Item 15d: 100,000 lines summarize in linear time (string appends to an attribute
    were quadratic: the old code would not finish), and each stream keeps its last
    max_text characters, counting what it left out."""
    lines = [f"{i:09d} {'x' * 90}\n" for i in range(100_000)]
    builder = SummaryBuilder(RUN, max_text=1_000_000)
    builder.feed(record(i, stream("stdout", line, RUN)) for i, line in enumerate(lines, start=1))
    summary = builder.result()
    assert summary is not None
    whole = "".join(lines)
    assert summary.stdout == whole[-1_000_000:]
    assert summary.stdout_omitted == len(whole) - 1_000_000
    small = summarize(RUN, _run(stream("stdout", "a", RUN), stream("stdout", "b", RUN)))  # type: ignore[arg-type]
    assert small is not None
    assert (small.stdout, small.stdout_omitted) == ("ab", 0)
