"""Builders for the pure unit tests: kernel messages, records and signed ZMQ frames.

Everything here builds real core objects (no mocks); ids are deterministic so that a
failing assertion prints the same values on every run.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
from typing import Any

from kernel_gateway_stream.core.frames import Frame
from kernel_gateway_stream.core.messages import DELIMITER, KernelMessage, Record

__all__ = [
    "frame",
    "header_bytes",
    "make_message",
    "make_parts",
    "record",
    "signed_frames",
    "status",
    "stream",
]

_ids = itertools.count(1)

#: A fixed header date, as kernels send it (ISO 8601 with a time zone).
DATE = "2024-01-02T03:04:05.678901Z"


def _next_id() -> str:
    # Of one width, whatever the count: a test that sizes a message once and expects every
    # later one to be as big (tests/unit/test_pending.py's bound) failed when the count went
    # from 99,999 to 100,000 between the two (where it stood depended on which tests ran
    # before it on that worker).
    return f"msg-{next(_ids):010d}"


def header_bytes(msg_type: str, msg_id: str | None = None) -> bytes:
    """A header as a kernel's ``Session`` would send it."""
    header = {
        "msg_id": msg_id or _next_id(),
        "msg_type": msg_type,
        "username": "tester",
        "session": "session-1",
        "date": DATE,
        "version": "5.3",
    }
    return json.dumps(header).encode()


def make_parts(
    msg_type: str,
    content: dict[str, Any],
    parent_msg_id: str | None = None,
    metadata: dict[str, Any] | None = None,
    *,
    msg_id: str | None = None,
    buffers: tuple[bytes, ...] = (),
) -> list[bytes]:
    """``[header, parent_header, metadata, content, *buffers]`` as JSON bytes."""
    parent = (
        {}
        if parent_msg_id is None
        else {
            "msg_id": parent_msg_id,
            "msg_type": "execute_request",
            "username": "tester",
            "session": "session-1",
            "date": DATE,
            "version": "5.3",
        }
    )
    return [
        header_bytes(msg_type, msg_id),
        json.dumps(parent).encode(),
        json.dumps(metadata or {}).encode(),
        json.dumps(content).encode(),
        *buffers,
    ]


def make_message(
    msg_type: str,
    content: dict[str, Any],
    parent_msg_id: str | None = None,
    metadata: dict[str, Any] | None = None,
    *,
    msg_id: str | None = None,
    buffers: tuple[bytes, ...] = (),
) -> KernelMessage:
    """A KernelMessage built through :meth:`KernelMessage.from_parts`."""
    return KernelMessage.from_parts(
        make_parts(msg_type, content, parent_msg_id, metadata, msg_id=msg_id, buffers=buffers)
    )


def stream(
    name: str, text: str, parent: str | None = "parent-1", *, msg_id: str | None = None
) -> KernelMessage:
    """A ``stream`` message (``name`` is ``stdout`` or ``stderr``)."""
    return make_message("stream", {"name": name, "text": text}, parent, msg_id=msg_id)


def status(
    state: str = "idle", parent: str | None = "parent-1", *, msg_id: str | None = None
) -> KernelMessage:
    """A ``status`` message: a non-stream IOPub message."""
    return make_message("status", {"execution_state": state}, parent, msg_id=msg_id)


def record(seq: int, message: KernelMessage, kernel_id: str = "k", time: float = 0.0) -> Record:
    """The transcript record of ``message`` at ``seq``."""
    return Record(kernel_id, seq, time, message)


def frame(seq: int, message: KernelMessage) -> Frame:
    """The IOPub frame of ``message`` at ``seq``."""
    return Frame.from_record(record(seq, message))


def signed_frames(
    message_parts: list[bytes], key: bytes, identities: tuple[bytes, ...] = (b"topic",)
) -> list[bytes]:
    """ZMQ frames ``[*identities, b"<IDS|MSG>", signature, *parts]``.

    The signature is the hex HMAC-SHA256 of header, parent header, metadata and content,
    as the messaging spec's wire protocol defines it (buffers are not signed); an empty
    key gives an empty signature, as jupyter_client's ``Session`` does.
    """
    if key:
        mac = hmac.new(key, digestmod=hashlib.sha256)
        for part in message_parts[:4]:
            mac.update(part)
        signature = mac.hexdigest().encode("ascii")
    else:
        signature = b""
    return [*identities, DELIMITER, signature, *message_parts]
