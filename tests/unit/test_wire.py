"""Jupyter's WebSocket wire formats (legacy JSON / binary, v1), checked against
jupyter_server's own codec.

Invariant 4: the kernel's JSON parts go out as they came (no re-encode); invariant 8: bad
client input raises MalformedMessage, never another exception.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from helpers import make_message, make_parts
from jupyter_client.jsonutil import extract_dates
from jupyter_server.services.kernels.connection.base import (
    deserialize_binary_message,
    deserialize_msg_from_ws_v1,
    serialize_binary_message,
    serialize_msg_to_ws_v1,
)
from tornado.websocket import WebSocketProtocol13

from kernel_gateway_stream.core.errors import MalformedMessage
from kernel_gateway_stream.core.wire import (
    CLOSE_REASON_MAX,
    SEQ_METADATA_KEY,
    IncomingMessage,
    Protocol,
    close_reason,
    decode_incoming,
    decode_legacy_binary,
    decode_v1,
    encode_legacy,
    encode_sse,
    encode_v1,
    metadata_with_seq,
    sse_event_name,
    websocket_frame,
)

PARTS = make_parts(
    "stream", {"name": "stdout", "text": "ünïcode ✓\n"}, "exec-1", {"a": 1}, msg_id="m-1"
)
BUFFERS = [b"\x00\x01\x02", b"", b"tail"]


def _request(**overrides: Any) -> dict[str, Any]:
    """A client's execute_request as a legacy JSON message."""
    message: dict[str, Any] = {
        "header": {
            "msg_id": "req-1",
            "msg_type": "execute_request",
            "username": "u",
            "session": "s",
            "date": "2024-01-02T03:04:05Z",
            "version": "5.3",
        },
        "parent_header": {},
        "metadata": {"cell": "c-1"},
        "content": {"code": "print('ü')", "silent": False},
        "channel": "shell",
    }
    message.update(overrides)
    return message


# --- v1 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("parts", [PARTS, [*PARTS, *BUFFERS], []], ids=["json", "buffers", "none"])
def test_v1_round_trip(parts: list[bytes]) -> None:
    """Invariant 4: decode_v1(encode_v1(channel, parts)) gives back the same bytes."""
    assert decode_v1(encode_v1("iopub", parts)) == ("iopub", parts)


@pytest.mark.parametrize("parts", [PARTS, [*PARTS, *BUFFERS]], ids=["json", "buffers"])
def test_v1_matches_jupyter_server_codec(parts: list[bytes]) -> None:
    """Invariant 4: our v1 frames are jupyter_server's, byte for byte, both ways."""
    ours = encode_v1("shell", parts)
    theirs = serialize_msg_to_ws_v1(parts, "shell")
    assert ours == theirs
    assert deserialize_msg_from_ws_v1(ours) == ("shell", parts)
    assert decode_v1(theirs) == ("shell", parts)


def test_v1_layout_is_little_endian_offsets() -> None:
    """Invariant 4: the v1 layout is [n][offsets][channel][parts] with 64-bit LE ints."""
    data = encode_v1("stdin", [b"ab", b"c"])
    assert data == struct.pack("<5Q", 4, 40, 45, 47, 48) + b"stdinabc"


@pytest.mark.parametrize(
    ("data", "match"),
    [
        pytest.param(b"", "shorter than its offset count", id="empty"),
        pytest.param(b"\x02\x00\x00\x00\x00\x00\x00", "shorter than its offset count", id="7B"),
        pytest.param(struct.pack("<Q", 0), "bad offset count 0", id="count-0"),
        pytest.param(struct.pack("<QQ", 1, 16), "bad offset count 1", id="count-1"),
        pytest.param(struct.pack("<QQQ", 3, 32, 32), "bad offset count 3", id="count-past-end"),
        pytest.param(struct.pack("<Q", 2**62), "bad offset count", id="count-huge"),
        pytest.param(struct.pack("<QQQ", 2, 16, 24) + b"x" * 8, "out of order", id="first"),
        pytest.param(
            struct.pack("<QQQQ", 3, 32, 36, 34) + b"iopub", "out of order", id="decreasing"
        ),
        pytest.param(struct.pack("<QQQ", 2, 24, 30) + b"iop", "past its end", id="past-end"),
        pytest.param(struct.pack("<QQQ", 2, 24, 26) + b"\xff\xfe", "not UTF-8", id="channel"),
    ],
)
def test_decode_v1_rejects_bad_frames(data: bytes, match: str) -> None:
    """Invariant 8: truncated frames, bad counts and bad offsets raise MalformedMessage."""
    with pytest.raises(MalformedMessage, match=match):
        decode_v1(data)


def test_decode_v1_rejects_a_truncated_message() -> None:
    """Invariant 8: a well-formed frame cut short is refused, not read past its end."""
    data = encode_v1("shell", PARTS)
    for cut in (1, len(PARTS[-1]), len(data) - 8 * 7 + 1):
        with pytest.raises(MalformedMessage):
            decode_v1(data[:-cut])


# --- metadata_with_seq ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"{}", {}),
        (b'{"a": 1}', {"a": 1}),
        (b'  {\n  "a": {"b": [1, 2]},\n  "c": "}"\n}\n  ', {"a": {"b": [1, 2]}, "c": "}"}),
        (b" { \t\n } ", {}),
        (b'{"nested": {}}', {"nested": {}}),
    ],
)
def test_metadata_with_seq_splices_the_sequence_numbers(
    raw: bytes, expected: dict[str, Any]
) -> None:
    """Invariant 5: every IOPub message carries its seq range in metadata, other keys kept."""
    result = json.loads(metadata_with_seq(raw, 5, 7))
    assert result == {**expected, SEQ_METADATA_KEY: {"seq": 7, "first_seq": 5}}


def test_metadata_with_seq_on_empty_object_is_exact() -> None:
    """Invariant 4: the splice is a byte concatenation, no re-encode."""
    assert metadata_with_seq(b"{}", 3, 3) == (b'{"kernel_gateway_stream":{"seq":3,"first_seq":3}}')
    assert metadata_with_seq(b'{"a":1}', 1, 2) == (
        b'{"a":1,"kernel_gateway_stream":{"seq":2,"first_seq":1}}'
    )


@pytest.mark.parametrize("raw", [b"[]", b"[{}]", b"null", b"1", b'"x"', b"", b"   "])
def test_metadata_with_seq_rejects_non_objects(raw: bytes) -> None:
    """Invariant 8: metadata that is not a JSON object raises MalformedMessage."""
    with pytest.raises(MalformedMessage, match="not a JSON object"):
        metadata_with_seq(raw, 1, 1)


# --- encode_legacy ----------------------------------------------------------------------


def test_encode_legacy_json() -> None:
    """Invariant 4: legacy JSON is assembled from the raw parts and parses as Session's dict."""
    message = make_message(
        "stream", {"name": "stdout", "text": "x\n"}, "exec-2", {"m": True}, msg_id="m-2"
    )
    metadata = metadata_with_seq(message.raw_metadata, 4, 4)
    payload, binary = encode_legacy("iopub", message, metadata, message.raw_content)

    assert binary is False
    assert json.loads(payload) == {
        "header": json.loads(message.raw_header),
        "parent_header": json.loads(message.raw_parent_header),
        "metadata": {"m": True, SEQ_METADATA_KEY: {"seq": 4, "first_seq": 4}},
        "content": {"name": "stdout", "text": "x\n"},
        "channel": "iopub",
        "msg_id": "m-2",
        "msg_type": "stream",
        "buffers": [],
    }
    assert message.raw_header in payload
    assert message.raw_content in payload


def test_encode_legacy_with_buffers_is_jupyter_server_binary() -> None:
    """Invariant 4: a message with buffers becomes the binary legacy frame that
    jupyter_server's deserialize_binary_message reads."""
    message = make_message(
        "comm_msg", {"comm_id": "c", "data": {}}, "exec-3", msg_id="m-3", buffers=tuple(BUFFERS)
    )
    payload, binary = encode_legacy("iopub", message, message.raw_metadata, message.raw_content)

    assert binary is True
    decoded = deserialize_binary_message(payload)
    assert decoded == {
        "header": extract_dates(json.loads(message.raw_header)),
        "parent_header": extract_dates(json.loads(message.raw_parent_header)),
        "metadata": {},
        "content": {"comm_id": "c", "data": {}},
        "channel": "iopub",
        "msg_id": "m-3",
        "msg_type": "comm_msg",
        "buffers": BUFFERS,
    }
    assert decode_legacy_binary(payload)[1] == BUFFERS


# --- decode_incoming --------------------------------------------------------------------


def test_decode_incoming_legacy_json() -> None:
    """Invariant 8: a legacy JSON text frame becomes the four JSON parts for the kernel."""
    request = _request()
    incoming = decode_incoming(json.dumps(request), Protocol.LEGACY)

    assert isinstance(incoming, IncomingMessage)
    assert (incoming.channel, incoming.msg_type) == ("shell", "execute_request")
    assert [json.loads(part) for part in incoming.parts] == [
        request["header"],
        {},
        {"cell": "c-1"},
        {"code": "print('ü')", "silent": False},
    ]
    assert incoming.parts[3] == '{"code":"print(\'ü\')","silent":false}'.encode()


def test_decode_incoming_legacy_defaults_channel_to_shell() -> None:
    """Invariant 8: a legacy message without a channel goes to shell, as jupyter_server does."""
    request = _request()
    del request["channel"]
    del request["metadata"]
    incoming = decode_incoming(json.dumps(request), Protocol.LEGACY)
    assert incoming.channel == "shell"
    assert incoming.parts[2] == b"{}"


@pytest.mark.parametrize("channel", ["control", "stdin"])
def test_decode_incoming_legacy_other_client_channels(channel: str) -> None:
    """Invariant 8: control and stdin are client channels too."""
    incoming = decode_incoming(json.dumps(_request(channel=channel)), Protocol.LEGACY)
    assert incoming.channel == channel


def test_decode_incoming_legacy_binary() -> None:
    """Invariant 4: a binary legacy frame from jupyter_server's serializer keeps buffers."""
    request = _request(buffers=[b"\x00buf", b"two"])
    incoming = decode_incoming(serialize_binary_message(request), Protocol.LEGACY)

    assert (incoming.channel, incoming.msg_type) == ("shell", "execute_request")
    assert len(incoming.parts) == 6
    assert json.loads(incoming.parts[0]) == request["header"]
    assert incoming.parts[4:] == [b"\x00buf", b"two"]


def test_decode_incoming_v1() -> None:
    """Invariant 4: a v1 frame's parts reach the kernel byte for byte."""
    parts = make_parts("interrupt_request", {}, msg_id="int-1")
    incoming = decode_incoming(serialize_msg_to_ws_v1([*parts, b"buf"], "control"), Protocol.V1)
    assert incoming == IncomingMessage("control", "interrupt_request", [*parts, b"buf"])


def test_protocol_from_subprotocol() -> None:
    """Invariant 8: only the exact v1 subprotocol name selects v1."""
    assert Protocol.from_subprotocol("v1.kernel.websocket.jupyter.org") is Protocol.V1
    assert Protocol.from_subprotocol(None) is Protocol.LEGACY
    assert Protocol.from_subprotocol("") is Protocol.LEGACY
    assert Protocol.from_subprotocol("v2.kernel.websocket.jupyter.org") is Protocol.LEGACY


@pytest.mark.parametrize(
    ("data", "match"),
    [
        pytest.param(json.dumps(_request(channel="iopub")), "channel 'iopub'", id="iopub"),
        pytest.param(json.dumps(_request(channel="nosuch")), "channel 'nosuch'", id="unknown"),
        pytest.param(json.dumps(_request(channel=3)), "channel 3", id="channel-int"),
        pytest.param("{not json", "not valid JSON", id="not-json"),
        pytest.param("[1, 2]", "not a JSON object", id="array"),
        pytest.param('"text"', "not a JSON object", id="string"),
        pytest.param(json.dumps({"channel": "shell"}), "no header", id="no-header"),
        pytest.param(json.dumps(_request(header=["x"])), "no header", id="header-list"),
        pytest.param(json.dumps(_request(header={"msg_id": "a"})), "msg_type", id="no-type"),
        pytest.param(json.dumps(_request(header={"msg_type": "x"})), "msg_id", id="no-msg-id"),
        pytest.param(b"\x00\x00", "shorter than its buffer count", id="binary-short"),
        pytest.param(struct.pack("!II", 2, 12), "bad buffer count 2", id="binary-count"),
        pytest.param(struct.pack("!II", 1, 4) + b"{}", "out of order", id="binary-offset"),
        pytest.param(struct.pack("!II", 1, 8) + b"[1]", "not a JSON object", id="binary-array"),
    ],
)
def test_decode_incoming_legacy_rejects(data: str | bytes, match: str) -> None:
    """Invariant 8: what a legacy client may not send raises MalformedMessage."""
    with pytest.raises(MalformedMessage, match=match):
        decode_incoming(data, Protocol.LEGACY)


@pytest.mark.parametrize(
    "channel", [["shell"], {"name": "shell"}], ids=["channel-list", "channel-object"]
)
def test_decode_incoming_legacy_rejects_unhashable_channel(channel: object) -> None:
    """Invariant 8: a channel that is a JSON array or object is bad input like any other
    channel name: MalformedMessage (the handler turns it into a close code with a reason),
    not a TypeError that escapes the handler."""
    with pytest.raises(MalformedMessage):
        decode_incoming(json.dumps(_request(channel=channel)), Protocol.LEGACY)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        pytest.param(json.dumps(_request()), "v1 clients send binary", id="text"),
        pytest.param(encode_v1("iopub", PARTS), "channel 'iopub'", id="iopub"),
        pytest.param(encode_v1("nosuch", PARTS), "channel 'nosuch'", id="unknown"),
        pytest.param(encode_v1("shell", PARTS[:3]), "at least 4 parts, got 3", id="3-parts"),
        pytest.param(encode_v1("shell", [b"{", *PARTS[1:]]), "header is not", id="bad-header"),
        pytest.param(encode_v1("shell", [b'{"msg_id":"a"}', *PARTS[1:]]), "msg_type", id="no-type"),
        pytest.param(encode_v1("shell", PARTS)[:-1], "past its end", id="truncated"),
    ],
)
def test_decode_incoming_v1_rejects(data: str | bytes, match: str) -> None:
    """Invariant 8: what a v1 client may not send raises MalformedMessage."""
    with pytest.raises(MalformedMessage, match=match):
        decode_incoming(data, Protocol.V1)


# --- what clients and kernels may not smuggle through -----------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [("parent_header", []), ("metadata", "m"), ("content", 3), ("content", [1])],
)
def test_decode_incoming_legacy_refuses_parts_that_are_not_objects(field: str, value: Any) -> None:
    """Invariant 8: a parent header, metadata or content that is not an object is refused
    (1007 at the adapter), never forwarded to the kernel."""
    request = _request()
    request[field] = value
    with pytest.raises(MalformedMessage, match=field):
        decode_incoming(json.dumps(request), Protocol.LEGACY)


@pytest.mark.parametrize("index", [1, 2, 3])
def test_decode_incoming_v1_refuses_parts_that_are_not_objects(index: int) -> None:
    """Invariant 8: v1 parts are the kernel's bytes, so each is checked before it goes."""
    parts = make_parts("execute_request", {"code": ""}, msg_id="x-1")
    parts[index] = b"[1]"
    with pytest.raises(MalformedMessage, match="not a JSON object"):
        decode_incoming(serialize_msg_to_ws_v1(parts, "shell"), Protocol.V1)
    parts[index] = b'{"v": NaN}'
    with pytest.raises(MalformedMessage, match="not valid JSON"):
        decode_incoming(serialize_msg_to_ws_v1(parts, "shell"), Protocol.V1)


def test_decode_incoming_refuses_json_nested_too_deeply_with_a_malformed_message() -> None:
    """Invariant 8: deeply nested JSON is a MalformedMessage (close 1007), not a
    RecursionError escaping the handler."""
    deep = '{"header": ' + '{"a": ' * 100000 + "1" + "}" * 100000 + "}"
    with pytest.raises(MalformedMessage, match="nested too deeply"):
        decode_incoming(deep, Protocol.LEGACY)
    header = json.dumps(_request()["header"])
    deep_content = f'{{"header": {header}, "content": ' + "[" * 100000 + "]" * 100000 + "}"
    with pytest.raises(MalformedMessage, match="nested too deeply"):
        decode_incoming(deep_content, Protocol.LEGACY)


def test_sse_event_names_from_a_kernel_cannot_start_new_fields() -> None:
    """Invariant 8 (SSE injection): a msg_type with line breaks cannot forge an id or an
    event for the readers of /stream; the event stays one event with its own id."""
    forged = "stream\nid: 999999\nevent: stream\ndata: {}\n\nevent: x\r"
    payload = encode_sse(forged, 7, b'{"a": 1}')
    lines = payload.split(b"\n")
    assert lines[0] == b"id: 7"
    assert lines[1].startswith(b"event: stream_id:_999999_event:_stream_data:")
    assert lines[2:] == [b'data: {"a": 1}', b"", b""]
    assert sse_event_name("") == b"_"
    assert sse_event_name("é" * 100) == b"_" * 64
    assert sse_event_name("execute_result") == b"execute_result"


@pytest.mark.parametrize(
    "message", ["x" * 500, "é" * 300, "\\" * 200, '"' * 100, "\U0001f600" * 60]
)
def test_close_reasons_fit_the_websocket_limit_and_stay_json(message: str) -> None:
    """Invariant 8: a close reason cut to RFC 6455's 123 bytes is still a JSON object
    that keeps its reason and its resume point."""
    text = close_reason("malformed_message", message=message, last_seq=123456789)
    assert len(text.encode()) <= CLOSE_REASON_MAX
    decoded = json.loads(text)
    assert decoded["reason"] == "malformed_message"
    assert decoded["last_seq"] == 123456789
    assert message.startswith(decoded["message"])
    short = close_reason("slow_consumer", last_seq=5)
    assert json.loads(short) == {"reason": "slow_consumer", "last_seq": 5}


class _Recorded:
    """Stands for tornado's IOStream: keeps what is written."""

    def __init__(self) -> None:
        self.written = b""

    def write(self, data: bytes) -> None:
        self.written += data


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 200_000])
@pytest.mark.parametrize("binary", [True, False])
def test_websocket_frame_matches_tornados_own_frame(size: int, binary: bool) -> None:
    """The frame the fan-out writes straight to a socket is byte for byte the frame
    tornado's ``write_message`` would write (every length encoding of RFC 6455 5.2)."""
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    protocol = WebSocketProtocol13.__new__(WebSocketProtocol13)
    protocol.mask_outgoing = False
    protocol._wire_bytes_out = 0
    protocol.stream = _Recorded()  # type: ignore[assignment]
    protocol._write_frame(True, 0x2 if binary else 0x1, payload)
    assert websocket_frame(payload, binary) == protocol.stream.written  # type: ignore[attr-defined]
