"""Executions for programs: normalized events, and the summary rebuilt from records."""

from __future__ import annotations

import json

from helpers import make_message, record, status, stream

from kernel_gateway_stream.core.executions import normalize, summarize
from kernel_gateway_stream.core.frames import Frame
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
