"""Messages too large to keep: recorded cut, with a marker that says so.

Code in a kernel is untrusted, and one IOPub message can be as large as the kernel likes
(a 300 MB ``print`` is one ``stream`` message). Past ``max_message_bytes`` the gateway does
not hold the message: it records, in its place and with its own sequence number, a message
of the same type, msg_id and parent whose content is cut, and says so in the content::

    "truncated": {"original_bytes": 314572933, "max_message_bytes": 8388608}

What is kept of the content:

* ``stream``: ``name`` and the first ``keep_bytes`` (or so) of ``text``, a true prefix of
  what the kernel printed (the rest is not in the transcript: the marker says how much the
  message had);
* ``display_data``, ``execute_result``, ``update_display_data``: a ``text/plain`` note in
  place of ``data`` (a frontend shows it where the output would be), and ``transient``
  when it is small enough to be found (so a display id still works);
* ``error``: ``ename`` and a note as ``evalue``;
* any other type: only the marker.

Metadata and buffers are dropped (counted in ``original_bytes``). A cut ``stream`` message is
never merged with its neighbours (coalescing writes a merged frame anew from the texts
alone, which would lose the marker): every reader gets it as recorded, marker and all.
Pure: no I/O, no clock.
The parts may be ``memoryview``\\ s of the receive buffer: nothing here copies more than
``keep_bytes`` of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

from .errors import MalformedMessage
from .messages import KernelMessage

__all__ = ["TRUNCATED_KEY", "cut_message", "is_cut", "parts_size"]

#: The content key of the marker.
TRUNCATED_KEY = "truncated"
#: Largest header or parent header a cut message keeps (a real one is a few hundred bytes).
HEADER_LIMIT = 64 * 1024
#: The marker as json.dumps writes it, the last key of a cut message's content.
_MARKER = b'"truncated": {"original_bytes": '
_MARKER_WITHIN = 128
#: How far into the content (from each end) the keys of a cut message are looked for.
_PEEK = 4096

Buffer = bytes | memoryview
_DISPLAY_TYPES = frozenset({"display_data", "execute_result", "update_display_data"})
_NAME = re.compile(rb'"name"\s*:\s*"(stdout|stderr)"')
_TEXT = re.compile(rb'"text"\s*:\s*"')
_ENAME = re.compile(rb'"ename"\s*:\s*"([^"\\]{0,200})"')
_TRANSIENT = re.compile(rb'"transient"\s*:\s*(\{[^{}]{0,2000}\})')


def parts_size(parts: Sequence[Buffer]) -> int:
    """The bytes of ``[header, parent_header, metadata, content, *buffers]``."""
    return sum(map(len, parts))


def is_cut(message: KernelMessage) -> bool:
    """True for a message the gateway cut (its raw content is looked at first: cheap)."""
    if _MARKER not in message.raw_content[-_MARKER_WITHIN:]:
        return False
    marker = message.content().get(TRUNCATED_KEY)
    return isinstance(marker, dict) and "original_bytes" in marker


def cut_message(
    parts: Sequence[Buffer], *, max_message_bytes: int, keep_bytes: int
) -> KernelMessage:
    """The message to record in place of ``parts`` (signature checked by the caller),
    which together are over ``max_message_bytes``. See the module docstring.

    Raises:
        MalformedMessage: the header is not a JSON object with msg_type and msg_id, or is
            itself over :data:`HEADER_LIMIT` (the caller records an invalid placeholder).
    """
    if len(parts) < 4:
        raise MalformedMessage(f"a message has at least 4 parts, got {len(parts)}")
    original = parts_size(parts)
    if len(parts[0]) > HEADER_LIMIT:
        raise MalformedMessage(f"a header of {len(parts[0])} bytes")
    header = bytes(parts[0])
    parent = bytes(parts[1]) if len(parts[1]) <= HEADER_LIMIT else b"{}"
    try:
        msg_type = json.loads(header).get("msg_type")
    except (ValueError, AttributeError) as error:
        raise MalformedMessage("the header is not a JSON object") from error
    content = _cut_content(msg_type, parts[3], keep_bytes)
    content[TRUNCATED_KEY] = {"original_bytes": original, "max_message_bytes": max_message_bytes}
    # A cut stream is not a stream of text to merge (see KernelMessage.from_parts): a
    # merged frame is written anew from the texts alone, and would lose the marker.
    return KernelMessage.from_parts(
        [header, parent, b"{}", json.dumps(content).encode()], repair=True
    )


def _cut_content(msg_type: Any, raw: Buffer, keep_bytes: int) -> dict[str, Any]:
    ends = bytes(raw[:_PEEK]) + b" " + bytes(raw[-_PEEK:])
    if msg_type == "stream":
        found = _NAME.search(ends)
        name = found.group(1).decode() if found else "stdout"
        return {"name": name, "text": _text_prefix(raw, keep_bytes)}
    note = f"[output of {len(raw)} bytes cut by the gateway: over its max_message_bytes]"
    if msg_type in _DISPLAY_TYPES:
        content: dict[str, Any] = {"data": {"text/plain": note}, "metadata": {}}
        transient = _TRANSIENT.search(ends)
        if transient is not None:
            try:
                value = json.loads(transient.group(1))
            except ValueError:
                value = None
            if isinstance(value, dict):
                content["transient"] = value
        if msg_type == "execute_result":
            content["execution_count"] = None
        return content
    if msg_type == "error":
        found = _ENAME.search(ends)
        ename = found.group(1).decode("utf-8", "replace") if found else "Error"
        return {"ename": ename, "evalue": note, "traceback": [note]}
    return {}


def _text_prefix(raw: Buffer, keep_bytes: int) -> str:
    """The first ``keep_bytes`` or so of a stream content's ``text``, decoded as JSON does
    (a prefix that would end inside an escape or a UTF-8 sequence is shortened)."""
    found = _TEXT.search(bytes(raw[:_PEEK]))
    if found is None:
        return ""
    start = found.end()
    chunk = bytes(raw[start : start + keep_bytes])
    # \uXXXX\uXXXX is the longest escape, 4 bytes the longest UTF-8 sequence.
    for shorten in range(13):
        try:
            text: str = scanstring(chunk[: len(chunk) - shorten].decode() + '"', 0)[0]
        except ValueError:  # UnicodeDecodeError too
            continue
        return text
    return ""
