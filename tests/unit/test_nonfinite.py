"""The rule for numbers JSON cannot write back (item 5 of the hardening issue).

``NaN`` and ``Infinity`` are not JSON; ``1e999`` is (RFC 8259 section 6 sets no range), but
Python reads it as ``inf``, which a strict encoder refuses and a lax one writes as the
token ``Infinity``. Decided once, where JSON is parsed: from a kernel, each such number
is read as null (the message is kept, its raw parts re-encoded); from a client, refused.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from helpers import header_bytes, make_message, make_parts, record

from kernel_gateway_stream.core.errors import MalformedMessage
from kernel_gateway_stream.core.executions import SummaryBuilder
from kernel_gateway_stream.core.frames import Frame
from kernel_gateway_stream.core.messages import KernelMessage, dumps_json, load_json_object
from kernel_gateway_stream.core.outputs import CellRestorer
from kernel_gateway_stream.core.records import NO_PARENT, decode_chunk, encode_record
from kernel_gateway_stream.core.wire import Protocol, decode_incoming

NON_FINITE = ["1e999", "-1e999", "1E+400", "1" + "0" * 400 + ".0", "NaN", "Infinity", "-Infinity"]


def strict(raw: bytes | str) -> Any:
    """RFC 8259 as a browser reads it, and no number that reads as infinite."""

    def finite(text: str) -> float:
        value = float(text)
        assert abs(value) != float("inf"), text
        return value

    def constant(name: str) -> Any:
        raise AssertionError(name)

    return json.loads(raw, parse_float=finite, parse_constant=constant)


@pytest.mark.parametrize("number", NON_FINITE)
def test_a_kernels_non_finite_number_reads_as_null_and_a_clients_is_refused(number: str) -> None:
    raw = '{"a": [1, {"b": %s}], "c": %s, "d": 1.5, "e": 12345678901234567890123}' % (
        number,
        number,
    )
    kept = load_json_object(raw, "content", from_kernel=True)
    assert kept == {"a": [1, {"b": None}], "c": None, "d": 1.5, "e": 12345678901234567890123}
    assert strict(dumps_json(kept)) == kept
    with pytest.raises(MalformedMessage, match="content is not valid JSON"):
        load_json_object(raw, "content")


def test_finite_numbers_are_untouched() -> None:
    raw = '{"a": 1.7976931348623157e308, "b": -5e-324, "c": 1e308, "d": 0.0, "e": -0}'
    assert load_json_object(raw, "x") == load_json_object(raw, "x", from_kernel=True)
    assert load_json_object(raw, "x")["a"] == sys.float_info.max


def test_repair_re_encodes_every_part_that_holds_one_and_keeps_the_message() -> None:
    """From a kernel, at any depth, in each JSON part: the message is kept, each such
    number is null in its raw parts (forwarded to clients as they are) and in every value
    parsed from them; the other parts stay byte for byte as the kernel sent them."""
    header = header_bytes("execute_result", "m-1")[:-1] + b', "x": 1e999}'
    parent = b'{"msg_id": "p-1", "msg_type": "execute_request", "n": -1e999}'
    metadata = b'{"m": [NaN, {"deep": 1E+400}]}'
    content = b'{"data": {"text/plain": "x"}, "metadata": {}, "execution_count": 1e999}'
    message = KernelMessage.from_parts([header, parent, metadata, content, b"\xff"], repair=True)
    assert (message.msg_id, message.parent_msg_id) == ("m-1", "p-1")
    for part in message.parts()[:4]:
        strict(part)
    assert strict(message.raw_header)["x"] is None
    assert strict(message.raw_parent_header)["n"] is None
    assert strict(message.raw_metadata) == {"m": [None, {"deep": None}]}
    assert message.content()["execution_count"] is None
    assert message.buffers == (b"\xff",)

    plain = make_parts("execute_result", {"execution_count": 3, "v": 0.5}, "p-1")
    untouched = KernelMessage.from_parts(plain, repair=True)
    assert untouched.parts() == plain
    with pytest.raises(MalformedMessage):
        KernelMessage.from_parts([header, parent, metadata, content])  # not repaired: refused


def test_every_value_built_from_a_repaired_message_writes_as_strict_json() -> None:
    """The execute API's events and summary, /cells, the transcript and SSE, from one
    execution whose messages held 1e999 everywhere."""
    content = (
        b'{"data": {"text/plain": "r", "application/json": {"v": [1e999, 2.5]}},'
        b' "metadata": {"w": -1e999}, "execution_count": 1e999,'
        b' "transient": {"display_id": "d", "x": NaN}}'
    )
    parent = b'{"msg_id": "p-1", "msg_type": "execute_request"}'
    messages = [
        make_message("kernel_gateway_stream_request", {"msg_id": "p-1", "cell_id": "c"}),
        KernelMessage.from_parts(
            [header_bytes("execute_input"), parent, b"{}", b'{"execution_count": 1e999}'],
            repair=True,
        ),
        KernelMessage.from_parts(
            [header_bytes("execute_result"), parent, b'{"m": 1e999}', content], repair=True
        ),
        KernelMessage.from_parts(
            [header_bytes("display_data"), parent, b"{}", content], repair=True
        ),
        make_message("status", {"execution_state": "idle"}, "p-1"),
    ]
    records = [record(seq, message) for seq, message in enumerate(messages, 1)]
    for item in records:
        frame = Frame.from_record(item)
        for protocol in (Protocol.SSE, Protocol.EXECUTION, Protocol.LEGACY):
            payload = frame.encode(protocol)[0].decode()
            data = "\n".join(
                line.removeprefix("data: ")
                for line in payload.split("\n")
                if line.startswith("data: ") or protocol is Protocol.LEGACY
            )
            if data:
                strict(data)
    builder = SummaryBuilder("p-1")
    builder.feed(records)
    summary = builder.result()
    assert summary is not None
    encoded = summary.encode(kernel_id="k")
    assert encoded.failure is None
    answer = strict(encoded.data)
    assert answer["kernel_id"] == "k"
    assert answer["status"] == "ok"
    assert answer["execution_count"] is None
    assert [output["execution_count"] for output in answer["outputs"][:1]] == [None]
    assert answer["outputs"][0]["data"]["application/json"] == {"v": [None, 2.5]}
    restorer = CellRestorer()
    restorer.feed(records)
    (cell,) = strict(dumps_json(restorer.result()))
    assert [output["execution_count"] for output in cell["outputs"][:1]] == [None]


def test_a_record_stored_before_the_rule_is_read_with_null() -> None:
    """A transcript written before repair handled 1e999 holds it raw: reading the chunk,
    and every value parsed from it, still works and gives None."""
    old = KernelMessage(
        msg_type="status",
        msg_id="old-1",
        parent_msg_id=None,
        raw_header=header_bytes("status", "old-1"),
        raw_parent_header=b"{}",
        raw_metadata=b"{}",
        raw_content=b'{"execution_state": "idle", "n": 1e999}',
    )
    (read,) = decode_chunk(encode_record(record(1, old), NO_PARENT), "k", lambda _: None)
    assert read.message.execution_state == "idle"
    assert read.message.content() == {"execution_state": "idle", "n": None}


def test_a_client_message_holding_one_is_refused() -> None:
    message = {
        "header": json.loads(header_bytes("execute_request")),
        "content": {"code": "1", "x": 1},
        "channel": "shell",
    }
    text = json.dumps(message).replace('"x": 1', '"x": 1e999')
    with pytest.raises(MalformedMessage):
        decode_incoming(text, Protocol.LEGACY)
    assert decode_incoming(json.dumps(message), Protocol.LEGACY).msg_type == "execute_request"


def test_a_summary_that_cannot_be_written_whole_still_gives_its_outcome() -> None:
    """An output nested past what the encoder takes: the summary says how the execution
    ended, with no outputs and why (the execute API then ends with ``done``)."""
    builder = SummaryBuilder("p-1")
    parent = "p-1"
    builder.feed(
        [
            record(1, make_message("execute_input", {"execution_count": 4}, parent)),
            record(2, make_message("status", {"execution_state": "idle"}, parent), time=2.0),
        ]
    )
    summary = builder.result()
    assert summary is not None
    nested: Any = "bottom"
    for _ in range(sys.getrecursionlimit() * 2):
        nested = [nested]
    summary.outputs.append({"type": "result", "data": {"x": nested}})
    encoded = summary.encode(kernel_id="k")
    assert encoded.failure is not None
    assert "RecursionError" in encoded.failure
    answer = strict(encoded.data)
    assert (answer["kernel_id"], answer["msg_id"], answer["status"]) == ("k", "p-1", "ok")
    assert (answer["execution_count"], answer["outputs"], answer["last_seq"]) == (4, [], 2)
    assert answer["summary_error"] == encoded.failure
