"""Messages over max_message_bytes, cut (kernel_gateway_stream.core.oversize): pure."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kernel_gateway_stream.core.errors import MalformedMessage
from kernel_gateway_stream.core.executions import SummaryBuilder
from kernel_gateway_stream.core.messages import KernelMessage, Record
from kernel_gateway_stream.core.oversize import cut_message, is_cut
from kernel_gateway_stream.core.records import ParentHeader, decode_chunk, encode_record

PARENT = json.dumps({"msg_id": "run-1", "msg_type": "execute_request"}).encode()


def parts(msg_type: str, content: dict[str, Any], buffers: int = 0) -> list[bytes]:
    header = json.dumps({"msg_id": "m-1", "msg_type": msg_type}).encode()
    return [header, PARENT, b"{}", json.dumps(content).encode(), *([b"b" * 1000] * buffers)]


def test_a_cut_stream_keeps_a_true_prefix_of_its_text_and_says_how_large_it_was() -> None:
    text = "é\\\n\U0001f600" * 50_000
    original = parts("stream", {"name": "stderr", "text": text})
    message = cut_message(original, max_message_bytes=10_000, keep_bytes=1000)
    content = message.content()
    assert content["name"] == "stderr"
    assert text.startswith(content["text"])
    assert 0 < len(content["text"]) < 1000
    assert content["truncated"] == {
        "original_bytes": sum(map(len, original)),
        "max_message_bytes": 10_000,
    }
    assert (message.msg_id, message.parent_msg_id) == ("m-1", "run-1")
    assert is_cut(message)
    # Never merged with its neighbours: the marker would be lost.
    assert not message.is_stream


def test_a_cut_display_keeps_a_note_and_its_display_id_and_drops_buffers() -> None:
    content = {
        "data": {"image/png": "A" * 100_000},
        "metadata": {},
        "transient": {"display_id": "d"},
    }
    message = cut_message(
        parts("display_data", content, buffers=3), max_message_bytes=1000, keep_bytes=100
    )
    cut = message.content()
    assert "cut by the gateway" in cut["data"]["text/plain"]
    assert cut["transient"] == {"display_id": "d"}
    assert message.buffers == ()
    assert message.size < 1000


def test_a_huge_header_is_not_a_message_to_cut() -> None:
    header = json.dumps({"msg_id": "m", "msg_type": "stream", "x": "h" * 100_000}).encode()
    with pytest.raises(MalformedMessage):
        cut_message([header, b"{}", b"{}", b"{}"], max_message_bytes=10, keep_bytes=10)


def test_a_cut_stream_stays_cut_through_the_store_and_counts_in_the_summary() -> None:
    message = cut_message(
        parts("stream", {"name": "stdout", "text": "x" * 100_000}),
        max_message_bytes=1000,
        keep_bytes=100,
    )
    record = Record("k", 1, 0.0, message)
    parent = ParentHeader(PARENT, "run-1", "execute_request")
    (stored,) = decode_chunk(encode_record(record, 1), "k", lambda _: parent)
    assert not stored.message.is_stream
    assert is_cut(stored.message)
    plain = KernelMessage.from_parts(parts("stream", {"name": "stdout", "text": "ok"}))
    assert plain.is_stream
    assert not is_cut(plain)
    builder = SummaryBuilder("run-1")
    builder.feed([stored, Record("k", 2, 0.0, plain)])
    summary = builder.result()
    assert summary is not None
    assert summary.messages_cut == 1
    assert summary.stdout == "x" * 100 + "ok"


def test_summary_outputs_stop_at_their_byte_bound_and_count_the_rest() -> None:
    builder = SummaryBuilder("run-1", max_output_bytes=10_000)
    display = parts("display_data", {"data": {"text/plain": "y" * 1000}, "metadata": {}})
    builder.feed(Record("k", seq, 0.0, KernelMessage.from_parts(display)) for seq in range(1, 101))
    summary = builder.result()
    assert summary is not None
    assert 0 < len(summary.outputs) < 10
    assert len(summary.outputs) + summary.outputs_omitted == 100
