"""The smaller pure parts: endings, guards, the record codec, health."""

from __future__ import annotations

import json

import pytest
from helpers import make_message, record, status, stream

from kernel_gateway_stream.core.endings import gateway_shutdown, kernel_shutdown, slow_consumer
from kernel_gateway_stream.core.errors import MalformedMessage
from kernel_gateway_stream.core.guards import DigestHistory, withhold_traceback
from kernel_gateway_stream.core.health import ComponentHealth, State, overall, to_json
from kernel_gateway_stream.core.marks import gap_record, lifecycle_request, lifecycle_status
from kernel_gateway_stream.core.messages import Record
from kernel_gateway_stream.core.records import ParentHeader, decode_chunk, encode_record


def test_endings_carry_their_reason_and_resume_point_everywhere() -> None:
    """Every end a client is told about says why and where to resume: a WebSocket close
    reason (JSON, within 123 bytes) and an SSE last event with the same data."""
    for ending, code in (
        (slow_consumer(17, "x" * 500), 4008),
        (kernel_shutdown(18), 1001),
        (gateway_shutdown(19), 1001),
    ):
        assert ending.code == code
        reason = json.loads(ending.close_reason())
        assert (reason["reason"], reason["last_seq"]) == (ending.reason, ending.last_seq)
        event = ending.sse_event().decode()
        assert event.startswith(f"event: {ending.reason}\n")
        data = json.loads(event.split("data: ", 1)[1])
        assert (data["reason"], data["last_seq"]) == (ending.reason, ending.last_seq)


def test_digest_history_refuses_what_it_saw_and_forgets_the_oldest() -> None:
    """Item 10: a signature seen before is a replay; the history is bounded."""
    history = DigestHistory(size=3)
    assert [history.seen(s) for s in (b"a", b"b", b"a", b"c", b"d")] == [
        False,
        False,
        True,
        False,
        False,
    ]
    assert history.seen(b"a") is False  # forgotten: only the last 3 are kept
    assert not history.seen(b"")  # signing off: nothing to compare
    assert not history.seen(b"")


def test_a_forgotten_digest_is_new_again_and_the_rest_keep_their_order() -> None:
    history = DigestHistory(size=3)
    for key in (b"a", b"b", b"c"):
        history.add(key)
    history.forget([b"b", b"x"])
    assert b"b" not in history
    history.add(b"d")  # three again: nothing older is pushed out
    assert [key in history for key in (b"a", b"c", b"d")] == [True, True, True]
    history.add(b"b")  # four: the oldest, a, goes
    assert [key in history for key in (b"a", b"b", b"c", b"d")] == [False, True, True, True]


def test_withheld_tracebacks_as_jupyter_server_replaces_them() -> None:
    """Item 3: an error message's name, value and traceback, and an error reply's, are
    replaced; anything else is the same message, untouched."""
    error = make_message(
        "error", {"ename": "ZeroDivisionError", "evalue": "by zero", "traceback": ["t"]}, "p"
    )
    withheld = withhold_traceback(error, "nope")
    assert withheld.content() == {
        "ename": "ExecutionError",
        "evalue": "Execution error",
        "traceback": ["nope"],
    }
    assert (withheld.msg_id, withheld.parent_msg_id) == (error.msg_id, "p")
    reply = make_message(
        "execute_reply",
        {"status": "error", "ename": "E", "evalue": "v", "traceback": ["t"], "execution_count": 1},
    )
    assert withhold_traceback(reply, "nope").content()["traceback"] == ["nope"]
    ok = make_message("execute_reply", {"status": "ok", "traceback": ["kept"]})
    assert withhold_traceback(ok, "nope") is ok
    line = stream("stdout", "Traceback (most recent call last)\n")
    assert withhold_traceback(line, "nope") is line


def test_the_record_codec_gives_back_what_it_took() -> None:
    """Records survive the store's chunk format byte for byte, with the peeked fields
    readers use, parent headers by reference, buffers and gap spans kept."""
    records = [
        record(1, stream("stdout", "é✓\n", "p")),
        record(2, status("busy", "p")),
        record(3, make_message("display_data", {"data": {}}, "p", buffers=(b"\x00", b""))),
        gap_record("k", 4, 10, "gateway_stopped", now=1.5, date=""),
        Record("k", 11, 2.0, lifecycle_status("dead", "shutdown", msg_id="d", date="", session="")),
        Record(
            "k", 12, 3.0, lifecycle_request("shutdown_requested", "shutdown", msg_id="r", date="")
        ),
    ]
    parent = ParentHeader(records[0].message.raw_parent_header, "p", "execute_request")
    chunk = b"".join(encode_record(r, 1 if r.message.parent_msg_id == "p" else 0) for r in records)
    decoded = decode_chunk(chunk, "k", {1: parent}.get)
    for original, back in zip(records, decoded, strict=True):
        assert (back.seq, back.span, back.time) == (original.seq, original.span, original.time)
        assert back.message.parts() == original.message.parts()
        assert back.message.text == original.message.text
        assert back.message.execution_state == original.message.execution_state
        assert back.message.parent_msg_id == original.message.parent_msg_id
    with pytest.raises(MalformedMessage):
        decode_chunk(chunk[:-3], "k", {1: parent}.get)


def test_health_is_the_worst_component_and_failing_is_503() -> None:
    components = [
        ComponentHealth("store", State.DEGRADED, "writes_failing", {"pending_records": 3}),
        ComponentHealth("taps", State.OK),
    ]
    assert overall(components) is State.DEGRADED
    assert State.DEGRADED.http_status == 200
    assert State.FAILING.http_status == 503
    body = to_json([*components, ComponentHealth("broker", State.FAILING, "x")])
    assert body["status"] == "failing"
    assert body["components"]["store"] == {
        "state": "degraded",
        "reason": "writes_failing",
        "pending_records": 3,
    }
    assert overall([]) is State.OK
