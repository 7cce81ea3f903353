"""What the gateway refuses or rewrites in what a kernel sends, before anyone sees it.

* **Replays** (:class:`DigestHistory`). A correctly signed message whose signature was
  seen before is a replay (of captured bytes, or by code in the kernel) and is refused,
  as jupyter_client's ``Session`` does with its digest history: each message's header
  holds a fresh msg_id and date, so its signature is unique.
* **Tracebacks** (:func:`withhold_traceback`). With jupyter_server's
  ``MappingKernelManager.allow_tracebacks`` off, an ``error`` message's name, value and
  traceback are replaced as jupyter_server's own kernel WebSocket replaces them, and so
  is an error reply's traceback; the gateway does it before recording, so no surface (the
  channels socket, SSE, the transcript, the execute API) shows one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from .messages import KernelMessage, dumps_json

__all__ = ["DigestHistory", "withhold_traceback"]


class DigestHistory:
    """The last ``size`` signatures seen, to refuse a message seen before."""

    __slots__ = ("_order", "_seen", "size")

    def __init__(self, size: int = 16384) -> None:
        self.size = size
        self._seen: set[bytes] = set()
        self._order: deque[bytes] = deque()

    def seen(self, signature: bytes) -> bool:
        """True if ``signature`` was seen already; else remember it and return False.
        An empty signature (signing off) is never a replay."""
        if not signature:
            return False
        if signature in self._seen:
            return True
        self.add(signature)
        return False

    def __contains__(self, key: bytes) -> bool:
        return key in self._seen

    def add(self, key: bytes) -> None:
        """Remember ``key`` (the oldest is forgotten past ``size``)."""
        if key in self._seen:
            return
        self._seen.add(key)
        self._order.append(key)
        if len(self._order) > self.size:
            self._seen.discard(self._order.popleft())

    def forget(self, keys: Iterable[bytes]) -> None:
        """Forget ``keys``, as if never seen."""
        gone = self._seen.intersection(keys)
        if gone:
            self._seen -= gone
            self._order = deque(key for key in self._order if key not in gone)


def withhold_traceback(message: KernelMessage, replacement: str) -> KernelMessage:
    """``message`` without its traceback, if it carries one (an IOPub ``error``, or a
    ``*_reply`` with status ``error``); the message itself otherwise."""
    if message.msg_type == "error":
        content = message.content()
    elif message.msg_type.endswith("_reply") and b'"traceback"' in message.raw_content:
        content = message.content()
        if content.get("status") != "error":
            return message
    else:
        return message
    content.update(ename="ExecutionError", evalue="Execution error", traceback=[replacement])
    return KernelMessage.from_parts(
        [
            message.raw_header,
            message.raw_parent_header,
            message.raw_metadata,
            dumps_json(content),
            *message.buffers,
        ]
    )
