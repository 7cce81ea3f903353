"""Per-kernel sequence numbers (DESIGN invariant 1).

Every IOPub message the gateway receives gets the next number: strictly increasing and
gap-free. A sequencer starts from the transcript store's head for its kernel, so
numbering continues across a gateway restart.
"""

from __future__ import annotations

from .messages import KernelMessage, Record

__all__ = ["Sequencer"]


class Sequencer:
    """Numbers one kernel's messages. Pure: the receive time is passed in."""

    __slots__ = ("head", "kernel_id")

    def __init__(self, kernel_id: str, head: int = 0) -> None:
        if head < 0:
            raise ValueError("head must be >= 0")
        self.kernel_id = kernel_id
        #: The last number given out (0: none yet).
        self.head = head

    def assign(self, message: KernelMessage, now: float) -> Record:
        """The record for ``message``: the next sequence number, received at ``now``."""
        self.head += 1
        return Record(self.kernel_id, self.head, now, message)
