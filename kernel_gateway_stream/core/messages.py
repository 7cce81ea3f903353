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

import dataclasses
import functools
import hashlib
import hmac
import json
import math
from dataclasses import dataclass, field
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import TYPE_CHECKING, Any

import orjson

from .errors import BadSignature, InvalidMessage, MalformedMessage

__all__ = [
    "DELIMITER",
    "INVALID_MSG_TYPE",
    "REPLAYED_METADATA_KEY",
    "UNSTORED_MSG_TYPE",
    "KernelMessage",
    "Record",
    "Signer",
    "decode_zmq_message",
    "dumps_json",
    "dumps_stream_content",
    "invalid_placeholder",
    "load_json_object",
    "split_identities",
    "unstored_placeholder",
    "value_class",
]

DELIMITER = b"<IDS|MSG>"

#: msg_type of the placeholder recorded for a signed message that is not a message.
INVALID_MSG_TYPE = "kernel_gateway_stream_invalid"
#: msg_type of the placeholder a store keeps for a record it could not write.
UNSTORED_MSG_TYPE = "kernel_gateway_stream_unstored"
#: Key set to true in the metadata of a message recorded from a kernel's replay (a kernel
#: of the gateway's launcher publishes again what a gateway killed had not made durable,
#: and some of it may have reached that gateway's clients already). Such a record is never
#: merged with another, so that a gateway chained behind this one, which may have it
#: already, can tell it by its msg_id.
REPLAYED_METADATA_KEY = "kernel_gateway_stream_replayed"
_REPLAYED_TAG = f'"{REPLAYED_METADATA_KEY}"'.encode()

if TYPE_CHECKING:
    from dataclasses import dataclass as value_class
else:

    def value_class(*, frozen: bool, **options: Any) -> Any:
        """A frozen dataclass to the type checker, which refuses every assignment to its
        fields; at run time a plain one (hashed the same): a frozen dataclass's ``__init__``
        costs ten times as much (4.8 against 0.4 µs for 12 fields, CPython 3.11), and the
        classes built with this are built once or twice for every message a kernel sends."""
        return dataclass(unsafe_hash=frozen, **options)


@value_class(frozen=True, slots=True)
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

    @property
    def replayed(self) -> bool:
        """True if it was recorded from a kernel's replay (see :data:`REPLAYED_METADATA_KEY`)."""
        return _REPLAYED_TAG in self.raw_metadata

    def marked_replayed(self) -> KernelMessage:
        """This message with :data:`REPLAYED_METADATA_KEY` set in its metadata."""
        if self.replayed:
            return self
        metadata = load_json_object(self.raw_metadata, "metadata")
        metadata[REPLAYED_METADATA_KEY] = True
        return dataclasses.replace(self, raw_metadata=dumps_json(metadata))

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
        return load_json_object(self.raw_header, "header", from_kernel=True)

    def parent_header(self) -> dict[str, Any]:
        """The parsed parent header (parsed on each call)."""
        return load_json_object(self.raw_parent_header, "parent_header", from_kernel=True)

    def content(self) -> dict[str, Any]:
        """The parsed content (parsed on each call). A message built with ``repair`` holds
        no non-finite number; one recorded before that rule reads each as None."""
        return load_json_object(self.raw_content, "content", from_kernel=True)

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
    def from_parts(cls, parts: list[bytes], *, repair: bool = False) -> KernelMessage:
        """Build a message from ``[header, parent_header, metadata, content, *buffers]``.

        Every JSON part must be an object as RFC 8259 defines JSON, since parts are pasted
        into what the gateway writes as they are. With ``repair`` (for what a kernel sent:
        its output is kept whatever it got wrong), a part holding a number JSON cannot write
        back (``NaN``, ``Infinity``, or one past a double's range such as ``1e999``) is
        re-encoded with ``null`` in its place, at any depth, so that the raw parts forwarded
        to clients and every value parsed from them later are strict JSON; and a
        ``parent_header`` or ``metadata`` that is not an object at all becomes ``{}``.

        Raises:
            MalformedMessage: fewer than four parts, a header or content (or, without
                ``repair``, any part) that is not a JSON object, or a header without
                string ``msg_type`` and ``msg_id``.
        """
        if len(parts) < 4:
            raise MalformedMessage(f"a message has at least 4 parts, got {len(parts)}")
        raw_header, raw_parent, raw_metadata, raw_content = map(bytes, parts[:4])
        header = _plain_object(raw_header)
        if header is None:
            raw_header, header = _object(raw_header, "header", repair)
        msg_type = header.get("msg_type")
        msg_id = header.get("msg_id")
        if not isinstance(msg_type, str) or not isinstance(msg_id, str):
            raise MalformedMessage("header needs string msg_type and msg_id")
        try:
            parent_msg_id, parent_msg_type = _peek_parent(raw_parent)
        except MalformedMessage:
            if not repair:
                raise
            raw_parent = _repaired(raw_parent, "parent_header")
            parent_msg_id, parent_msg_type = _peek_parent(raw_parent)
        if raw_metadata != b"{}":
            if repair:
                raw_metadata = _repaired(raw_metadata, "metadata")
            else:
                load_json_object(raw_metadata, "metadata")
        stream_name = text = execution_state = None
        peeked = peek_stream(raw_content) if msg_type == "stream" else None
        # A stream content in the usual layout is checked by peek_stream, any other parsed.
        content: dict[str, Any] = {}
        if peeked is None:
            raw_content, content = _object(raw_content, "content", repair)
        if peeked is not None:
            stream_name, text = peeked
        elif msg_type == "stream":
            name, value = content.get("name"), content.get("text")
            # One the gateway cut (see .oversize) is not merged: that would lose its marker.
            cut = isinstance(content.get("truncated"), dict)
            if isinstance(name, str) and isinstance(value, str) and not cut:
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


@value_class(frozen=True, slots=True)
class Record:
    """A kernel message with its place in the kernel's transcript.

    ``seq`` is per kernel and strictly increasing (DESIGN invariant 1); ``time`` is when
    the gateway received it, in seconds since the epoch. A record normally holds one
    number; a gap record (see :mod:`.marks`) holds the ``span`` numbers up to its ``seq``.
    """

    kernel_id: str
    seq: int
    time: float
    message: KernelMessage
    span: int = 1

    @property
    def first_seq(self) -> int:
        """The first sequence number this record stands for (``seq`` but for gaps)."""
        return self.seq - self.span + 1


class Signer:
    """HMAC signing as the messaging spec defines it (``signature_scheme`` ``hmac-<digest>``).

    An empty key disables signing, as in jupyter_client's ``Session``.
    """

    __slots__ = ("_digestmod", "_inner", "_key", "_outer")

    def __init__(self, key: bytes, signature_scheme: str = "hmac-sha256") -> None:
        scheme, _, digest = signature_scheme.partition("-")
        if scheme != "hmac" or digest not in hashlib.algorithms_available:
            raise ValueError(f"unsupported signature scheme {signature_scheme!r}")
        self._key = key
        self._digestmod = digest
        # HMAC (RFC 2104) as two hashes, keyed once: each message copies their states. The
        # same digest as hmac.new's, for a third less than copying an hmac object (its
        # methods are Python's; a hash's are C's).
        self._inner = self._outer = None
        if key:
            block = hashlib.new(digest).block_size
            if len(key) > block:
                key = hashlib.new(digest, key).digest()
            key = key.ljust(block, b"\0")
            self._inner = hashlib.new(digest, bytes(byte ^ 0x36 for byte in key))
            self._outer = hashlib.new(digest, bytes(byte ^ 0x5C for byte in key))

    def sign(self, parts: list[bytes]) -> bytes:
        """The hex signature of the header, parent header, metadata and content."""
        if self._inner is None or self._outer is None:
            return b""
        inner = self._inner.copy()
        for part in parts[:4]:
            inner.update(part)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.hexdigest().encode("ascii")

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
    try:
        index = frames.index(DELIMITER)
    except ValueError:
        raise MalformedMessage("no <IDS|MSG> delimiter in message") from None
    return frames[:index], frames[index + 1 :]


def decode_zmq_message(frames: list[bytes], signer: Signer) -> KernelMessage:
    """Decode a multipart ZMQ message from a kernel, verifying its signature.

    What a kernel got wrong inside a correctly signed message is repaired where it can be
    (see :meth:`KernelMessage.from_parts`).

    Raises:
        MalformedMessage: the frames do not form a message.
        BadSignature: the signature does not match.
        InvalidMessage: correctly signed, but its header or content is not a JSON object
            (the caller records a placeholder in its place: see :func:`invalid_placeholder`).
    """
    _, rest = split_identities(frames)
    if len(rest) < 5:
        raise MalformedMessage(f"expected a signature and 4 parts, got {len(rest)} frames")
    signer.verify(rest[0], rest[1:5])
    try:
        return KernelMessage.from_parts(rest[1:], repair=True)
    except MalformedMessage as error:
        raise InvalidMessage(str(error), rest[0], rest[1:]) from error


def unstored_placeholder(message: KernelMessage, reason: str, *, date: str) -> KernelMessage:
    """What a store keeps in place of a record it cannot write (one larger than the
    database takes): the same msg_id and slot, and what was lost."""
    return KernelMessage.synthesize(
        UNSTORED_MSG_TYPE,
        {"reason": reason[:200], "msg_type": message.msg_type, "size": message.size},
        msg_id=message.msg_id,
        date=date,
        session="",
    )


def invalid_placeholder(error: InvalidMessage, *, date: str, session: str) -> KernelMessage:
    """The message recorded in place of a correctly signed one that is not a message.

    It keeps the slot (DESIGN invariant 1: every message received gets a sequence number)
    and says what was wrong, in ``kernel_gateway_stream_invalid`` ``{"reason", "size"}``.
    Its msg_id is derived from the original's signature (or content, unsigned), so the
    same bytes always give the same placeholder.
    """
    digest = error.signature.decode("ascii", "replace")[:32]
    if not digest:
        hashed = hashlib.sha256()
        for part in error.parts:
            hashed.update(part)
        digest = hashed.hexdigest()[:32]
    return KernelMessage.synthesize(
        INVALID_MSG_TYPE,
        {"reason": error.reason[:200], "size": sum(map(len, error.parts))},
        msg_id=f"invalid-{digest}",
        date=date,
        session=session,
    )


class _NonStandardConstant(ValueError):
    """A number JSON cannot write back: ``NaN``, ``Infinity`` or ``-Infinity`` (Python's json
    accepts them, JSON does not), or one too large for a double (``1e999``: valid JSON
    syntax, but Python reads it as ``inf``, which no strict encoder writes)."""


def _refuse_constant(name: str) -> Any:
    raise _NonStandardConstant(f"{name} is not JSON")


def _refuse_non_finite(text: str) -> float:
    value = float(text)
    if math.isfinite(value):
        return value
    raise _NonStandardConstant(f"{text[:20]} is out of range of a double")


def _finite_or_none(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


# The rule for numbers, decided here, where JSON is parsed, so that no parsed value holds a
# non-finite float and every later dumps with allow_nan=False succeeds: a number that is not
# finite (NaN, Infinity, or a literal past a double's range, such as 1e999 or a 400-digit
# decimal) is refused from a client, and read as null from a kernel (whose output is kept).
# Integers are not touched: Python holds any of them exactly and writes them back as they
# came (a reader may round a huge one, but it is JSON).

#: json.loads as RFC 8259 has it, for values the gateway writes back: no NaN/Infinity
#: (browsers' JSON.parse refuses them) and no number that reads as infinite.
_STRICT_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_refuse_non_finite)
#: The same, reading each of those numbers as null: for what a kernel sent (a part is
#: repaired with it, then re-encoded; see :meth:`KernelMessage.from_parts`).
_LENIENT_DECODER = json.JSONDecoder(parse_constant=lambda _: None, parse_float=_finite_or_none)


def load_json_object(raw: bytes | str, what: str, *, from_kernel: bool = False) -> dict[str, Any]:
    """``raw`` parsed as a strict JSON object (RFC 8259, valid UTF-8), holding no number
    that JSON cannot write back: ``NaN``, ``Infinity`` and numbers past a double's range
    (``1e999``) are refused, or, ``from_kernel``, read as None. Either way the value can be
    written with ``allow_nan=False`` (:func:`dumps_json`).

    Raises:
        MalformedMessage: not such an object, nested too deeply to parse, or not UTF-8.
    """
    decoder = _LENIENT_DECODER if from_kernel else _STRICT_DECODER
    try:
        # From str: json.loads would otherwise detect the encoding of every bytes part.
        text = raw.decode() if isinstance(raw, bytes) else raw
        value = decoder.decode(text)
    except (ValueError, UnicodeDecodeError) as error:
        raise MalformedMessage(f"{what} is not valid JSON") from error
    except RecursionError as error:
        raise MalformedMessage(f"{what} is nested too deeply") from error
    if not isinstance(value, dict):
        raise MalformedMessage(f"{what} is not a JSON object")
    return value


def dumps_json(value: Any, *, compact: bool = False) -> bytes:
    """``value`` as UTF-8 JSON that any strict parser takes; ``compact`` without spaces.

    Text is written as it is (non-ASCII characters are not escaped), except that a
    string holding a lone surrogate (a kernel may send the escape of one, which parses to one)
    is escaped, since it has no UTF-8 form.
    """
    separators = (",", ":") if compact else None
    try:
        return json.dumps(
            value, ensure_ascii=False, allow_nan=False, separators=separators
        ).encode()
    except UnicodeEncodeError:
        return json.dumps(value, allow_nan=False, separators=separators).encode()


def dumps_stream_content(name: str, text: str) -> bytes:
    """A ``stream`` message's content, ``{"name": name, "text": text}``, as compact UTF-8
    JSON. With orjson: a merged frame's text may be a megabyte, and ``json.dumps`` of it
    was 77 % of the daemon's CPU with 100 clients behind a 4 KiB firehose, each with a merge
    of its own (py-spy). A text orjson refuses (a lone surrogate) goes to
    :func:`dumps_json`, which escapes it."""
    try:
        return orjson.dumps({"name": name, "text": text})
    except orjson.JSONEncodeError:
        return dumps_json({"name": name, "text": text}, compact=True)


def _object_part(raw: bytes, what: str) -> tuple[bytes, dict[str, Any]]:
    """``(raw, parsed)`` if ``raw`` is a strict JSON object; else the object re-encoded
    with null for each NaN, Infinity or infinite number, if that is all that is wrong
    with it.

    Raises:
        MalformedMessage: not a JSON object even then.
    """
    try:
        return raw, load_json_object(raw, what)
    except MalformedMessage as error:
        if not isinstance(error.__cause__, _NonStandardConstant):
            raise
    try:
        value = _LENIENT_DECODER.decode(raw.decode())
    except (ValueError, RecursionError) as error:  # pragma: no cover - parsed above
        raise MalformedMessage(f"{what} is not valid JSON") from error
    # A bare NaN or Infinity is valid JSON to the lenient decoder, and no object.
    if not isinstance(value, dict):
        raise MalformedMessage(f"{what} is not a JSON object")
    return dumps_json(value), value


def _plain_object(raw: bytes) -> dict[str, Any] | None:
    """``raw`` parsed, if it is a JSON object as RFC 8259 has it holding no number JSON
    cannot write back; else None, and the caller's full check says what is wrong (or,
    for a lone surrogate's escape, which only orjson refuses, that nothing is).

    orjson refuses what that check refuses (NaN, Infinity, numbers past a double's range,
    text that is not UTF-8) and parses a message's header in a third of the time: the
    hot path's first parse (a header is all it parses of most messages). It reads an
    integer past 64 bits as a float: callers read only strings from what it returns."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if type(value) is dict else None


def _object(raw: bytes, what: str, repair: bool) -> tuple[bytes, dict[str, Any]]:
    """``(raw, parsed)`` for a part that must be a JSON object (parsed once); with
    ``repair``, ``raw`` re-encoded if it held NaN, Infinity or an infinite number."""
    if repair:
        return _object_part(raw, what)
    return raw, load_json_object(raw, what)


def _repaired(raw: bytes, what: str) -> bytes:
    """An optional object part (parent header, metadata), repaired: ``{}`` if hopeless."""
    try:
        return _object_part(raw, what)[0]
    except MalformedMessage:
        return b"{}"


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
    if raw_parent == b"{}":
        return None, None
    parent = load_json_object(raw_parent, "parent_header")
    msg_id, msg_type = parent.get("msg_id"), parent.get("msg_type")
    return (
        msg_id if isinstance(msg_id, str) else None,
        msg_type if isinstance(msg_type, str) else None,
    )
