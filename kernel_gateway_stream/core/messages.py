"""Kernel messages as the gateway holds them: raw JSON parts plus a peeked header.

The Jupyter messaging spec (https://jupyter-client.readthedocs.io/en/stable/messaging.html,
"The Wire Protocol") sends a message over ZMQ as::

    [identities..., b"<IDS|MSG>", signature, header, parent_header, metadata, content, buffers...]

The gateway keeps the four JSON parts as the kernel sent them (``raw_*``) so they can be
stored and forwarded without a re-encode, and parses only what routing needs: the
header, the parent header's ``msg_id`` and, for ``stream`` messages, the content
(name and text), which the coalescer and the transcript's text view use.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
from dataclasses import dataclass, field
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

from .errors import BadSignature, MalformedMessage

__all__ = [
    "DELIMITER",
    "KernelMessage",
    "Record",
    "Signer",
    "decode_zmq_message",
    "split_identities",
]

DELIMITER = b"<IDS|MSG>"


@dataclass(frozen=True, slots=True)
class KernelMessage:
    """One Jupyter message, its JSON parts raw, its routing fields peeked.

    ``stream_name`` and ``text`` are set only for ``stream`` messages. Don't
    subclass this; build instances with :func:`decode_zmq_message` or
    :meth:`from_parts`.
    """

    msg_type: str
    msg_id: str
    parent_msg_id: str | None
    raw_header: bytes
    raw_parent_header: bytes
    raw_metadata: bytes
    raw_content: bytes
    buffers: tuple[bytes, ...] = ()
    stream_name: str | None = None
    text: str | None = None
    #: The parent header's msg_type (activity tracking counts what a request caused).
    parent_msg_type: str | None = None
    #: For ``status`` messages, the content's execution_state.
    execution_state: str | None = None
    #: Bytes on the wire, without framing: what queues and retention count. Computed.
    size: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        size = len(self.raw_header) + len(self.raw_parent_header) + len(self.raw_metadata)
        size += len(self.raw_content)
        if self.buffers:
            size += sum(map(len, self.buffers))
        object.__setattr__(self, "size", size)

    @property
    def is_stream(self) -> bool:
        return self.stream_name is not None

    def parts(self) -> list[bytes]:
        """The message parts after the signature, in wire order."""
        return [
            self.raw_header,
            self.raw_parent_header,
            self.raw_metadata,
            self.raw_content,
            *self.buffers,
        ]

    def header(self) -> dict[str, Any]:
        """The parsed header (parsed on each call; the hot path never needs it)."""
        return _load_object(self.raw_header, "header")

    def content(self) -> dict[str, Any]:
        """The parsed content (parsed on each call)."""
        return _load_object(self.raw_content, "content")

    @classmethod
    def synthesize(
        cls,
        msg_type: str,
        content: dict[str, Any],
        *,
        msg_id: str,
        date: str,
        session: str,
        username: str = "kernel_gateway_stream",
    ) -> KernelMessage:
        """A message the gateway itself publishes (a kernel's ``restarting`` / ``dead``
        status, or a notice that retention discarded what a reader asked for)."""
        header = {
            "msg_id": msg_id,
            "msg_type": msg_type,
            "username": username,
            "session": session,
            "date": date,
            "version": "5.3",
        }
        return cls.from_parts(
            [json.dumps(header).encode(), b"{}", b"{}", json.dumps(content).encode()]
        )

    @classmethod
    def from_parts(cls, parts: list[bytes]) -> KernelMessage:
        """Build a message from ``[header, parent_header, metadata, content, *buffers]``.

        Raises:
            MalformedMessage: fewer than four parts, or a part that is not a JSON
                object, or a header without ``msg_type`` / ``msg_id``.
        """
        if len(parts) < 4:
            raise MalformedMessage(f"a message has at least 4 parts, got {len(parts)}")
        raw_header, raw_parent, raw_metadata, raw_content = map(bytes, parts[:4])
        header = _load_object(raw_header, "header")
        msg_type = header.get("msg_type")
        msg_id = header.get("msg_id")
        if not isinstance(msg_type, str) or not isinstance(msg_id, str):
            raise MalformedMessage("header needs string msg_type and msg_id")
        parent_msg_id, parent_msg_type = _peek_parent(raw_parent)
        if raw_metadata != b"{}":
            _load_object(raw_metadata, "metadata")
        stream_name = text = execution_state = None
        peeked = peek_stream(raw_content) if msg_type == "stream" else None
        # Raw content is pasted into legacy JSON as it is, so it must be a JSON object:
        # a stream content in the usual layout is checked by peek_stream, any other parsed.
        content = _load_object(raw_content, "content") if peeked is None else {}
        if peeked is not None:
            stream_name, text = peeked
        elif msg_type == "stream":
            name, value = content.get("name"), content.get("text")
            if isinstance(name, str) and isinstance(value, str):
                stream_name, text = name, value
        elif msg_type == "status":
            state = content.get("execution_state")
            execution_state = state if isinstance(state, str) else None
        return cls(
            msg_type=msg_type,
            msg_id=msg_id,
            parent_msg_id=parent_msg_id,
            raw_header=raw_header,
            raw_parent_header=raw_parent,
            raw_metadata=raw_metadata,
            raw_content=raw_content,
            buffers=tuple(map(bytes, parts[4:])) if len(parts) > 4 else (),
            stream_name=stream_name,
            text=text,
            parent_msg_type=parent_msg_type,
            execution_state=execution_state,
        )


@dataclass(frozen=True, slots=True)
class Record:
    """A kernel message with its place in the kernel's transcript.

    ``seq`` is per kernel, strictly increasing and gap-free (DESIGN invariant 1);
    ``time`` is when the gateway received it, in seconds since the epoch.
    """

    kernel_id: str
    seq: int
    time: float
    message: KernelMessage


class Signer:
    """HMAC signing as the messaging spec defines it (``signature_scheme`` ``hmac-<digest>``).

    An empty key disables signing, as in jupyter_client's ``Session``.
    """

    __slots__ = ("_digestmod", "_key", "_keyed")

    def __init__(self, key: bytes, signature_scheme: str = "hmac-sha256") -> None:
        scheme, _, digest = signature_scheme.partition("-")
        if scheme != "hmac" or digest not in hashlib.algorithms_available:
            raise ValueError(f"unsupported signature scheme {signature_scheme!r}")
        self._key = key
        self._digestmod = digest
        #: Keyed once; each message signs with a copy.
        self._keyed = hmac.new(key, digestmod=digest) if key else None

    def sign(self, parts: list[bytes]) -> bytes:
        """The hex signature of the header, parent header, metadata and content."""
        if self._keyed is None:
            return b""
        mac = self._keyed.copy()
        for part in parts[:4]:
            mac.update(part)
        return mac.hexdigest().encode("ascii")

    def verify(self, signature: bytes, parts: list[bytes]) -> None:
        """Raises BadSignature unless ``signature`` signs ``parts``."""
        if not self._key:
            return
        if not hmac.compare_digest(signature, self.sign(parts)):
            raise BadSignature("message signature does not match the session key")


def split_identities(frames: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """Split ZMQ frames at the ``<IDS|MSG>`` delimiter into (identities, rest).

    Raises:
        MalformedMessage: no delimiter.
    """
    for index, frame in enumerate(frames):
        if frame == DELIMITER:
            return frames[:index], frames[index + 1 :]
    raise MalformedMessage("no <IDS|MSG> delimiter in message")


def decode_zmq_message(frames: list[bytes], signer: Signer) -> KernelMessage:
    """Decode a multipart ZMQ message from a kernel, verifying its signature.

    Raises:
        MalformedMessage: the frames do not form a message.
        BadSignature: the signature does not match.
    """
    _, rest = split_identities(frames)
    if len(rest) < 5:
        raise MalformedMessage(f"expected a signature and 4 parts, got {len(rest)} frames")
    signer.verify(rest[0], rest[1:5])
    return KernelMessage.from_parts(rest[1:])


def _load_object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        # From str: json.loads would otherwise detect the encoding of every bytes part.
        value = json.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as error:
        raise MalformedMessage(f"{what} is not valid JSON") from error
    if not isinstance(value, dict):
        raise MalformedMessage(f"{what} is not a JSON object")
    return value


_STREAM_PREFIXES = tuple(
    (f'{{"name": "{name}", "text": "'.encode(), name) for name in ("stdout", "stderr")
)


def peek_stream(raw_content: bytes) -> tuple[str, str] | None:
    """``(name, text)`` of a stream message's content in the layout kernels send
    (``{"name": "stdout", "text": "..."}``, as ``json.dumps`` writes it), read with the JSON
    string scanner alone: several times cheaper than a full parse, and as strict. None for
    any other layout; the caller parses it in full."""
    if not raw_content.endswith(b'"}'):
        return None
    for prefix, name in _STREAM_PREFIXES:
        if raw_content.startswith(prefix):
            try:
                content = raw_content.decode()
                text, end = scanstring(content, len(prefix))
            except ValueError:  # UnicodeDecodeError too
                return None
            return (name, text) if end == len(content) - 1 else None
    return None


@functools.lru_cache(maxsize=256)
def _peek_parent(raw_parent: bytes) -> tuple[str | None, str | None]:
    """The parent header's ``(msg_id, msg_type)``; Nones for a message with no parent.

    Cached: every message an execution causes carries the same parent header bytes, so a
    flood parses it once. (A malformed one raises, and exceptions are not cached.)"""
    if raw_parent in (b"{}", b""):
        return None, None
    parent = _load_object(raw_parent, "parent_header")
    msg_id, msg_type = parent.get("msg_id"), parent.get("msg_type")
    return (
        msg_id if isinstance(msg_id, str) else None,
        msg_type if isinstance(msg_type, str) else None,
    )
