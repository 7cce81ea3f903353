"""Jupyter's WebSocket wire formats, both directions, as pure functions.

Two protocols exist (jupyter_server ``docs/source/developers/websocket-protocols.rst``):

* **legacy**: a JSON text frame ``{"header", "parent_header", "metadata", "content",
  "buffers", "channel", ...}``; a message with binary buffers is sent as a binary frame
  ``[nbufs][offsets...][json][buffers...]`` with 32-bit big-endian integers.
* **v1.kernel.websocket.jupyter.org**: a binary frame
  ``[n][offset_0..offset_{n-1}][channel][header][parent_header][metadata][content][buffers...]``
  with 64-bit little-endian integers; the JSON parts are the kernel's own bytes.

Outgoing legacy JSON is assembled from the kernel's raw JSON parts by concatenation, so
neither protocol re-encodes a message's content. The gateway's sequence number is added
to ``metadata`` under :data:`SEQ_METADATA_KEY`.
"""

from __future__ import annotations

import enum
import itertools
import json
import re
import struct
from dataclasses import dataclass
from typing import Any

from .errors import MalformedMessage
from .messages import KernelMessage, Record, dumps_json, load_json_object

__all__ = [
    "CHANNELS",
    "CLOSE_REASON_MAX",
    "SEQ_METADATA_KEY",
    "SURFACES",
    "IncomingMessage",
    "Protocol",
    "close_reason",
    "decode_incoming",
    "decode_legacy_binary",
    "decode_v1",
    "encode_legacy",
    "encode_record_json",
    "encode_sse",
    "encode_v1",
    "metadata_with_seq",
    "sse_event_name",
    "websocket_frame",
]

#: ``metadata[SEQ_METADATA_KEY] == {"seq": last, "first_seq": first}`` on every IOPub
#: message the gateway sends; ``first_seq < seq`` when stream messages were merged.
SEQ_METADATA_KEY = "kernel_gateway_stream"

CHANNELS = frozenset({"shell", "control", "stdin", "iopub"})


class Protocol(enum.Enum):
    """How a client takes messages: a WebSocket subprotocol, or Server-Sent Events."""

    LEGACY = ""
    V1 = "v1.kernel.websocket.jupyter.org"
    SSE = "text/event-stream"
    #: Server-Sent Events of one execution, normalized (see ``core.executions``).
    EXECUTION = "execution-events"

    @property
    def surface(self) -> str:
        """The name of this way of taking messages in metrics (``channels_v1``, ``sse``)."""
        return SURFACES[self]

    @classmethod
    def from_subprotocol(cls, name: str | None) -> Protocol:
        return cls.V1 if name == cls.V1.value else cls.LEGACY


#: What each Protocol is called as a surface in metrics.
SURFACES = {
    Protocol.LEGACY: "channels_legacy",
    Protocol.V1: "channels_v1",
    Protocol.SSE: "sse",
    Protocol.EXECUTION: "execute",
}


@dataclass(frozen=True, slots=True)
class IncomingMessage:
    """A message a client sent, ready to be signed and sent to the kernel.

    ``parts`` is ``[header, parent_header, metadata, content, *buffers]`` as JSON bytes.
    """

    channel: str
    msg_type: str
    parts: list[bytes]


def metadata_with_seq(raw_metadata: bytes, first_seq: int, last_seq: int) -> bytes:
    """``raw_metadata`` (a JSON object) with the sequence numbers spliced in, no re-encode."""
    seq = b'"%s":{"seq":%d,"first_seq":%d}' % (SEQ_METADATA_KEY.encode(), last_seq, first_seq)
    body = raw_metadata.strip()
    if not body.endswith(b"}"):
        raise MalformedMessage("metadata is not a JSON object")
    inner = body[:-1].rstrip()
    if inner == b"{":
        return b"{" + seq + b"}"
    return inner + b"," + seq + b"}"


def encode_record_json(record: Record) -> bytes:
    """One transcript record as JSON (``GET .../transcript``), assembled from the kernel's
    raw parts (no re-encode: they were checked to be JSON objects when they arrived)."""
    message = record.message
    return b"".join(
        [
            b'{"seq":%d,"time":%s,"msg_type":' % (record.seq, repr(record.time).encode()),
            json.dumps(message.msg_type).encode(),
            b',"msg_id":',
            json.dumps(message.msg_id).encode(),
            b',"parent_msg_id":',
            json.dumps(message.parent_msg_id).encode(),
            b',"header":',
            message.raw_header,
            b',"parent_header":',
            message.raw_parent_header,
            b',"metadata":',
            message.raw_metadata,
            b',"content":',
            message.raw_content,
            b',"buffers":%d}' % len(message.buffers),
        ]
    )


def encode_v1(channel: str, parts: list[bytes]) -> bytes:
    """Frame ``parts`` for the v1 protocol."""
    channel_bytes = channel.encode()
    count = 1 + 1 + len(parts) + 1  # the count itself, the channel, each part, the end
    offsets = [8 * count]
    offsets.append(offsets[-1] + len(channel_bytes))
    for part in parts:
        offsets.append(offsets[-1] + len(part))
    header = struct.pack("<%dQ" % (len(offsets) + 1), len(offsets), *offsets)
    return b"".join([header, channel_bytes, *parts])


def decode_v1(data: bytes) -> tuple[str, list[bytes]]:
    """Parse a v1 frame into ``(channel, parts)``.

    Raises:
        MalformedMessage: truncated, offsets out of order or out of bounds.
    """
    if len(data) < 8:
        raise MalformedMessage("v1 frame shorter than its offset count")
    (count,) = struct.unpack_from("<Q", data, 0)
    if count < 2 or 8 * (count + 1) > len(data):
        raise MalformedMessage(f"v1 frame has a bad offset count {count}")
    offsets = struct.unpack_from("<%dQ" % count, data, 8)
    if offsets[0] != 8 * (count + 1) or any(b < a for a, b in itertools.pairwise(offsets)):
        raise MalformedMessage("v1 frame offsets are out of order")
    if offsets[-1] > len(data):
        raise MalformedMessage("v1 frame offsets past its end")
    try:
        channel = data[offsets[0] : offsets[1]].decode()
    except UnicodeDecodeError as error:
        raise MalformedMessage("v1 channel name is not UTF-8") from error
    parts = [data[offsets[i] : offsets[i + 1]] for i in range(1, len(offsets) - 1)]
    return channel, parts


def encode_legacy(
    channel: str, message: KernelMessage, raw_metadata: bytes, raw_content: bytes
) -> tuple[bytes, bool]:
    """Encode a message for a legacy client; returns ``(payload, is_binary)``.

    The JSON is assembled from the raw parts; ``msg_id`` / ``msg_type`` are repeated at
    the top level as ``Session.deserialize`` does.
    """
    body = b"".join(
        [
            b'{"header":',
            message.raw_header,
            b',"parent_header":',
            message.raw_parent_header,
            b',"metadata":',
            raw_metadata,
            b',"content":',
            raw_content,
            b',"msg_id":',
            json.dumps(message.msg_id).encode(),
            b',"msg_type":',
            json.dumps(message.msg_type).encode(),
            b',"channel":',
            json.dumps(channel).encode(),
        ]
    )
    if not message.buffers:
        return body + b',"buffers":[]}', False
    # jupyter_server base.serialize_binary_message: the JSON without "buffers", then each buffer.
    chunks = [body + b"}", *message.buffers]
    offsets = [4 * (len(chunks) + 1)]
    for chunk in chunks[:-1]:
        offsets.append(offsets[-1] + len(chunk))
    return struct.pack("!%dI" % (len(chunks) + 1), len(chunks), *offsets) + b"".join(chunks), True


#: Characters a Server-Sent Events ``event:`` field may hold here. A kernel chooses its
#: msg_types; one with a line break in it would otherwise start new fields (a forged
#: ``id:``, a forged event) in every reader's stream.
_SSE_EVENT_SAFE = re.compile(rb"[^A-Za-z0-9_.:\-]")
#: Longest ``event:`` name written; a kernel's msg_type can be any length.
SSE_EVENT_MAX = 64


def sse_event_name(name: str) -> bytes:
    """``name`` as an SSE event name: unsafe characters become ``_``, at most
    :data:`SSE_EVENT_MAX` bytes, never empty."""
    safe = _SSE_EVENT_SAFE.sub(b"_", name.encode("utf-8", "replace"))[:SSE_EVENT_MAX]
    return safe or b"_"


def encode_sse(event: str, event_id: int | None, data: bytes) -> bytes:
    """One Server-Sent Event (HTML Living Standard, "Server-sent events", 9.2.5).

    ``data`` is JSON; line breaks in it can only be whitespace between tokens, so each line
    becomes a ``data:`` field and the reader's rejoining with "\n" gives back equal JSON.
    ``event`` may come from a kernel: see :func:`sse_event_name`.
    """
    lines = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    head = b"event: %s\n" % sse_event_name(event)
    if event_id is not None:
        head = b"id: %d\n" % event_id + head
    return head + b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"


def websocket_frame(payload: bytes, binary: bool) -> bytes:
    """``payload`` as one whole WebSocket data frame as a server sends it (RFC 6455
    section 5.2: final, unmasked, not compressed), header and payload in one bytes object.

    Built once per frame and protocol and written straight to every client's socket, it
    spares each write what tornado's ``write_message`` does per client and per message:
    build the header, copy the payload after it, and wrap the write in a task of its own.
    """
    first = 0x82 if binary else 0x81  # FIN, and the binary or text opcode
    length = len(payload)
    if length < 126:
        header = bytes((first, length))
    elif length <= 0xFFFF:
        header = struct.pack("!BBH", first, 126, length)
    else:
        header = struct.pack("!BBQ", first, 127, length)
    return header + payload


#: RFC 6455 section 5.5: a control frame's payload is at most 125 bytes, two of them the
#: close code; the reason is UTF-8 in the other 123.
CLOSE_REASON_MAX = 123


def close_reason(reason: str, **fields: str | int | None) -> str:
    """A WebSocket close reason: a JSON object ``{"reason": ..., **fields}`` that fits in
    :data:`CLOSE_REASON_MAX` bytes of UTF-8 and stays valid JSON.

    Strings are shortened (longest first, a character at a time) until it fits; a close
    reason that would still not fit keeps only ``reason``.
    """
    values: dict[str, str | int | None] = {"reason": reason, **fields}
    text = _compact(values)
    while len(text.encode()) > CLOSE_REASON_MAX:
        longest = max(
            (key for key, value in values.items() if key != "reason" and isinstance(value, str)),
            key=lambda key: len(str(values[key])),
            default=None,
        )
        if longest is None or not values[longest]:
            return _compact({"reason": reason[:100]})
        value = str(values[longest])
        excess = len(text.encode()) - CLOSE_REASON_MAX
        values[longest] = value[: max(0, len(value) - max(1, excess // 6))]
        text = _compact(values)
    return text


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def decode_legacy_binary(
    data: bytes, *, from_kernel: bool = False
) -> tuple[dict[str, Any], list[bytes]]:
    """Parse a legacy binary frame into ``(message_json, buffers)``; ``from_kernel`` (an
    upstream gateway's frame), numbers JSON cannot write back are read as None (see
    :func:`.messages.load_json_object`), else they are refused.

    Raises:
        MalformedMessage: truncated or inconsistent offsets, or JSON that is not an object.
    """
    if len(data) < 4:
        raise MalformedMessage("binary frame shorter than its buffer count")
    (count,) = struct.unpack_from("!I", data, 0)
    if count < 1 or 4 * (count + 1) > len(data):
        raise MalformedMessage(f"binary frame has a bad buffer count {count}")
    offsets = [*struct.unpack_from("!%dI" % count, data, 4), len(data)]
    if any(b < a for a, b in itertools.pairwise(offsets)) or offsets[0] < 4 * (count + 1):
        raise MalformedMessage("binary frame offsets are out of order")
    chunks = [data[a:b] for a, b in itertools.pairwise(offsets)]
    message = load_json_object(chunks[0], "message", from_kernel=from_kernel)
    return message, chunks[1:]


def decode_incoming(data: bytes | str, protocol: Protocol) -> IncomingMessage:
    """Parse what a client sent on the channels WebSocket.

    Header, parent header, metadata and content must each be a JSON object (the legacy
    protocol may leave out the last three); nothing else is forwarded to a kernel.

    Raises:
        MalformedMessage: not a message of ``protocol``, an unknown channel, a part that is
            not a JSON object (or nested too deeply to parse), or a header without
            ``msg_type``.
    """
    header: Any
    if protocol is Protocol.V1:
        if isinstance(data, str):
            raise MalformedMessage("v1 clients send binary frames")
        channel, parts = decode_v1(data)
        if len(parts) < 4:
            raise MalformedMessage(f"a message has at least 4 parts, got {len(parts)}")
        header = load_json_object(parts[0], "header")
        for part, what in zip(parts[1:4], _OPTIONAL_PARTS, strict=True):
            load_json_object(part, what)
    else:
        if isinstance(data, bytes):
            message, buffers = decode_legacy_binary(data)
        else:
            message, buffers = load_json_object(data, "message"), []
        channel = message.get("channel") or "shell"
        header = message.get("header")
        if not isinstance(header, dict):
            raise MalformedMessage("message has no header object")
        optional = []
        for what in _OPTIONAL_PARTS:
            value = message.get(what)
            if value is None:
                value = {}
            elif not isinstance(value, dict):
                raise MalformedMessage(f"{what} is not a JSON object")
            optional.append(_dumps(value))
        parts = [_dumps(header), *optional, *buffers]
    if not isinstance(channel, str) or channel not in CHANNELS - {"iopub"}:
        raise MalformedMessage(f"clients may not send on channel {channel!r}"[:200])
    msg_type = header.get("msg_type")
    if not isinstance(msg_type, str) or not isinstance(header.get("msg_id"), str):
        raise MalformedMessage("header needs string msg_type and msg_id")
    return IncomingMessage(channel=channel, msg_type=msg_type, parts=parts)


_OPTIONAL_PARTS = ("parent_header", "metadata", "content")


def _dumps(value: Any) -> bytes:
    try:
        return dumps_json(value, compact=True)
    except RecursionError as error:  # parsed at the edge of the limit, one level deeper now
        raise MalformedMessage("message is nested too deeply") from error
