"""The record codec: transcript records as bytes, and back.

A store keeps records in *chunks*: runs of consecutive records of one kernel, each record
encoded as below, concatenated. One chunk is one row (SQLite) or entry (Redis), so a
store writes and reads hundreds of records per row instead of one, and keeps about one
byte on disk per byte of output.

One record (little-endian)::

    seq       u64   its sequence number (the last one it stands for)
    time      f64   when the gateway received it, seconds since the epoch
    span      u32   how many sequence numbers it stands for (1; more for a gap record)
    parent    u32   the parent header's reference in the kernel's table of parents (0: none)
    n_type    u16   length of msg_type      n_id    u16  length of msg_id
    n_header  u32   n_metadata u32   n_content u32   n_buffers u16   then u32 per buffer
    msg_type, msg_id, header, metadata, content, buffers...   (the kernel's raw bytes)

Parent headers are not repeated per record: every message an execution causes carries
the same parent header, often as large as the message. The store keeps each once and
records a reference; :class:`ParentHeader` is what a reference resolves to.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .errors import MalformedMessage
from .messages import KernelMessage, Record, load_json_object, peek_stream

__all__ = ["NO_PARENT", "ParentHeader", "decode_chunk", "encode_record"]

_FIXED = struct.Struct("<QdIIHHIIIH")
_PACK = _FIXED.pack
_BUFFER_LENGTH = struct.Struct("<I")

#: The parent reference of a message with no parent (``parent_header`` is ``{}``).
NO_PARENT = 0


@dataclass(frozen=True, slots=True)
class ParentHeader:
    """A parent header as a store keeps it once: its raw bytes and the peeked fields."""

    raw: bytes
    msg_id: str | None
    msg_type: str | None


_EMPTY_PARENT = ParentHeader(b"{}", None, None)


def encode_record(record: Record, parent: int) -> bytes:
    """``record`` as bytes, with ``parent`` the reference of its parent header."""
    message = record.message
    msg_type = _type_bytes(message.msg_type)
    msg_id = message.msg_id.encode()
    buffers = message.buffers
    fixed = _PACK(
        record.seq,
        record.time,
        record.span,
        parent,
        len(msg_type),
        len(msg_id),
        len(message.raw_header),
        len(message.raw_metadata),
        len(message.raw_content),
        len(buffers),
    )
    if not buffers:
        return b"".join(
            (fixed, msg_type, msg_id, message.raw_header, message.raw_metadata, message.raw_content)
        )
    lengths = b"".join(_BUFFER_LENGTH.pack(len(buffer)) for buffer in buffers)
    return b"".join(
        [
            fixed,
            lengths,
            msg_type,
            msg_id,
            message.raw_header,
            message.raw_metadata,
            message.raw_content,
            *buffers,
        ]
    )


@functools.lru_cache(maxsize=256)
def _type_bytes(msg_type: str) -> bytes:
    return msg_type.encode()


def decode_chunk(
    data: bytes, kernel_id: str, parents: Callable[[int], ParentHeader | None]
) -> list[Record]:
    """Every record in a chunk, in order.

    ``parents`` resolves a parent reference (None if the store does not know it: the
    record then has an empty parent header).

    Raises:
        MalformedMessage: the bytes are not a chunk (truncated, lengths past its end).
    """
    records: list[Record] = []
    offset, end = 0, len(data)
    fixed_size = _FIXED.size
    unpack = _FIXED.unpack_from
    append = records.append
    try:
        while offset < end:
            (seq, at, span, parent_ref, n_type, n_id, n_header, n_metadata, n_content, count) = (
                unpack(data, offset)
            )
            offset += fixed_size
            if count:
                lengths = struct.unpack_from("<%dI" % count, data, offset)
                offset += 4 * count
            # Slices of the bytes themselves: one copy each (a memoryview's slice, then
            # bytes of it, made two objects per part).
            start = offset
            offset += n_type
            msg_type = _type_text(data[start:offset])
            start = offset
            offset += n_id
            msg_id = data[start:offset].decode()
            start = offset
            offset += n_header
            header = data[start:offset]
            start = offset
            offset += n_metadata
            metadata = data[start:offset]
            start = offset
            offset += n_content
            content = data[start:offset]
            buffers: list[bytes] = []
            if count:
                for length in lengths:
                    start = offset
                    offset += length
                    buffers.append(data[start:offset])
            if offset > end:
                raise MalformedMessage("chunk truncated")
            parent = (parents(parent_ref) if parent_ref != NO_PARENT else None) or _EMPTY_PARENT
            message = _message(msg_type, msg_id, header, parent, metadata, content, buffers)
            append(Record(kernel_id, seq, at, message, span))
    except (struct.error, UnicodeDecodeError) as error:
        raise MalformedMessage("not a chunk of records") from error
    return records


@functools.lru_cache(maxsize=256)
def _type_text(raw: bytes) -> str:
    """A stored msg_type as text; the few a kernel sends are decoded once."""
    return raw.decode()


def _message(
    msg_type: str,
    msg_id: str,
    header: bytes,
    parent: ParentHeader,
    metadata: bytes,
    content: bytes,
    buffers: Iterable[bytes],
) -> KernelMessage:
    """A stored message, its peeked fields restored without a full decode."""
    text = stream_name = execution_state = None
    if msg_type == "stream":
        peeked = peek_stream(content)
        if peeked is None:
            parsed = load_json_object(content, "content", from_kernel=True)
            name, value = parsed.get("name"), parsed.get("text")
            cut = isinstance(parsed.get("truncated"), dict)  # as KernelMessage.from_parts
            if isinstance(name, str) and isinstance(value, str) and not cut:
                peeked = (name, value)
        if peeked is not None:
            stream_name, text = peeked
    elif msg_type == "status":
        state = load_json_object(content, "content", from_kernel=True).get("execution_state")
        execution_state = state if isinstance(state, str) else None
    return KernelMessage(
        msg_type=msg_type,
        msg_id=msg_id,
        parent_msg_id=parent.msg_id,
        raw_header=header,
        raw_parent_header=parent.raw,
        raw_metadata=metadata,
        raw_content=content,
        buffers=tuple(buffers),
        stream_name=stream_name,
        text=text,
        parent_msg_type=parent.msg_type,
        execution_state=execution_state,
    )
