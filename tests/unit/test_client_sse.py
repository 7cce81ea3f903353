"""The client's Server-Sent Events parser: bytes in, events out, no event loop.

The rules are the HTML Living Standard's, "Server-sent events", 9.2.6 "Interpreting an
event stream"; each test names the rule it checks.
"""

from __future__ import annotations

import json

import pytest

from kernel_gateway_stream.client.sse import (
    EventDecoder,
    EventStreamParser,
    LineSplitter,
    ServerSentEvent,
)


def parse(*chunks: bytes) -> list[ServerSentEvent]:
    parser = EventStreamParser()
    return [event for chunk in chunks for event in parser.feed(chunk)]


def every_split(stream: bytes) -> list[list[ServerSentEvent]]:
    """The events of ``stream`` cut in two at each place, and cut into single bytes."""
    cuts = [parse(stream[:cut], stream[cut:]) for cut in range(len(stream) + 1)]
    return [*cuts, parse(*(stream[i : i + 1] for i in range(len(stream))))]


def test_an_event_with_its_id_type_and_data() -> None:
    events = parse(b'id: 7\nevent: stream\ndata: {"a": 1}\n\n')
    assert events == [ServerSentEvent("stream", '{"a": 1}', "7")]


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_each_line_end_the_standard_allows(end: bytes) -> None:
    """Lines end with CRLF, LF or a bare CR."""
    stream = end.join([b"id: 1", b"event: a", b"data: x", b"", b"data: y", b"", b""])
    expected = [ServerSentEvent("a", "x", "1"), ServerSentEvent("message", "y", "1")]
    assert all(events == expected for events in every_split(stream))


def test_a_crlf_split_across_chunks_is_one_line_end() -> None:
    """A CR that ends a chunk ends its line; the LF that opens the next is its CRLF's."""
    assert parse(b"data: a\r", b"\n\r", b"\ndata: b\r\n\r\n") == [
        ServerSentEvent("message", "a", ""),
        ServerSentEvent("message", "b", ""),
    ]
    splitter = LineSplitter()
    assert splitter.feed(b"one\r") == [b"one"]
    assert splitter.feed(b"\ntwo\r") == [b"two"]
    assert splitter.feed(b"\r") == [b""]  # a CR after a CR is a line of its own
    assert splitter.feed(b"\n") == []  # ...and this LF completes that second CRLF


def test_only_cr_and_lf_end_lines() -> None:
    """U+2028, U+2029, U+0085 and the other characters str.splitlines() splits at stay in
    the line: the kernel's JSON carries them raw."""
    text = "a\u2028b\u2029c\x85d\x0be\x0cf\x1cg\x1dh\x1ei"
    data = json.dumps({"text": text}, ensure_ascii=False)
    stream = f"event: stdout\ndata: {data}\n\n".encode()
    for events in every_split(stream):
        assert [json.loads(event.data)["text"] for event in events] == [text]


def test_a_multibyte_character_split_across_chunks() -> None:
    stream = "data: é€😀\n\n".encode()
    assert all(events == [ServerSentEvent("message", "é€😀", "")] for events in every_split(stream))


def test_the_last_event_id_persists_across_events() -> None:
    """An event without an id field has the one before it; an empty id field clears it."""
    events = parse(b"id: 5\ndata: a\n\ndata: b\n\nid\ndata: c\n\nid: 9\ndata: d\n\n")
    assert [(event.data, event.id) for event in events] == [
        ("a", "5"),
        ("b", "5"),
        ("c", ""),
        ("d", "9"),
    ]


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        pytest.param(b"id: 3\ndata: a\n\nid: 4\x005\ndata: b\n\n", [("a", "3"), ("b", "3")],
                     id="an id holding NUL is ignored"),
        pytest.param(b"id: 8\nevent: ping\n\ndata: after\n\n", [("after", "8")],
                     id="no data: not dispatched, but the id is kept and the type reset"),
        pytest.param(b"data\n\ndata:\n\n", [("", ""), ("", "")], id="an empty data field is data"),
        pytest.param(b"data: a\ndata:  b\ndata:c\n\n", [("a\n b\nc", "")],
                     id="data lines join with LF; one space after the colon is dropped"),
        pytest.param(b"foo: bar\nevent\ndata: x\n\n", [("x", "")],
                     id="unknown fields are ignored; no colon: the whole line names the field"),
        pytest.param(b"\xef\xbb\xbfdata: x\n\n", [("x", "")], id="a BOM opening the stream"),
        pytest.param(b"data: x\n\n\xef\xbb\xbfdata: y\n\n", [("x", "")],
                     id="a BOM later is part of a field name, then unknown"),
        pytest.param(b"data: x\n\ndata: half", [("x", "")], id="an event cut off mid-line"),
        pytest.param(b"data: x\n\ndata: half\n", [("x", "")], id="an event cut off before its end"),
        pytest.param(b"data: \xff\n\n", [("\ufffd", "")], id="invalid UTF-8 is replaced"),
    ],
)  # fmt: skip
def test_what_a_stream_dispatches(stream: bytes, expected: list[tuple[str, str]]) -> None:
    """Each case: the events' (data, last event id); their type is ``message``."""
    assert parse(stream) == [ServerSentEvent("message", data, id) for data, id in expected]


def test_comments_are_ignored_and_counted() -> None:
    parser = EventStreamParser()
    assert parser.feed(b": keepalive\n\n: another\ndata: x\n\n") == [
        ServerSentEvent("message", "x", "")
    ]
    assert parser.decoder.comments == 2


def test_retry_takes_ascii_digits_only() -> None:
    decoder = EventDecoder()
    for line in ["retry: 1500", "retry: 15x", "retry: \u0661\u0662"]:
        decoder.feed_line(line)
    assert decoder.retry == 1500


def test_a_long_line_in_many_chunks_is_joined_once() -> None:
    """Linear work: each chunk is scanned once and the pieces are joined at the line end
    (the old parser re-scanned its whole buffer on every chunk)."""
    splitter = LineSplitter()
    piece = b"x" * 1000
    for _ in range(1000):
        assert splitter.feed(piece) == []
    assert splitter.pending == 1_000_000
    assert splitter.feed(b"\n") == [piece * 1000]
    assert splitter.pending == 0
