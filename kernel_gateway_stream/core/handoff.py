"""Replay then live: the hand-off of one subscriber from the transcript to the live feed.

Rules (DESIGN invariant 5: resume is exact; invariant 4: every buffer has a bound):

1. A subscriber with no ``since`` goes live at once (:data:`ATTACH`, then :data:`LIVE`).
2. Otherwise it first **catches up** from the transcript, page by page (:class:`Read`),
   *without* being attached to the live feed: a client far behind holds no live frames
   while it reads, so a storm of reconnecting clients costs a page each, not a backlog
   each. Pages are bounded in records and in bytes.
3. Once it is within ``live_within`` sequence numbers of the head, or a read covered all
   there was when it began (the kernel outpaces a page, so only what came during one
   read is left), it attaches (:data:`ATTACH`); the adapter attaches it to the fan-out,
   which returns the head ``H`` at that instant: every later frame lies wholly above
   ``H``. The rest, ``(cursor, H]``, is read while live frames queue (held, within the
   queue's bounds) behind it: a short stretch.
4. At ``H`` it goes :data:`LIVE`: the held frames are released.
5. :meth:`Handoff.stop` (the kernel shut down, the gateway stops) ends the catch-up:
   a subscriber whose kernel is gone reads to the end of the transcript and then ends
   instead of going live.

Replies to the subscriber's own requests that arrived while it was away (see
``handlers/sessions.py``) are placed among the replayed frames by :func:`interleave`,
each after the IOPub message that preceded it, as the client would have seen them.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from .frames import Frame

__all__ = [
    "ATTACH",
    "LIVE",
    "STOPPED",
    "Handoff",
    "HeldReply",
    "Read",
    "interleave",
]


@dataclass(frozen=True, slots=True)
class Read:
    """Read records with ``after < seq <= until`` (a page: bounded by the adapter's limits)
    and send them; then report with :meth:`Handoff.page_sent`."""

    after: int
    until: int


class Step(enum.Enum):
    ATTACH = "attach"
    LIVE = "live"
    STOPPED = "stopped"


ATTACH = Step.ATTACH
LIVE = Step.LIVE
#: Nothing more to read, and not to go live (stopped): the adapter ends the subscriber.
STOPPED = Step.STOPPED

Action = Read | Step


@dataclass(frozen=True, slots=True)
class HeldReply:
    """A reply on the client's own channel that arrived while it was away, with the head of
    the kernel's IOPub transcript at that moment (its place among the replayed output)."""

    after_seq: int
    frame: Frame


class Handoff:
    """One subscriber's replay-to-live hand-off. Pure: the adapter does what it says.

    Usage::

        action = handoff.begin(head)
        while action is not LIVE/STOPPED:
            Read(...) as read: read a page, send it,
                action = handoff.page_sent(read, reached, head)
            ATTACH: attach to the fan-out (which returns H), action = handoff.attached(H)
    """

    __slots__ = ("_attached", "_caught_up", "_stopped", "cursor", "live_within")

    def __init__(self, since: int | None, *, live_within: int) -> None:
        #: The last sequence number sent (or known not to be wanted).
        self.cursor = since
        self.live_within = live_within
        self._attached: int | None = None
        self._stopped = False
        #: The last read covered everything there was when it was asked for.
        self._caught_up = False

    @property
    def attached_at(self) -> int | None:
        """The head ``H`` the subscriber attached at; None before it attached."""
        return self._attached

    def begin(self, head: int) -> Action:
        """The first step, given the transcript's head now."""
        if self.cursor is None:
            self.cursor = head
            return ATTACH
        return self._next(head)

    def page_sent(self, read: Read, reached: int, head: int) -> Action:
        """A page of ``read`` was read and sent; ``reached`` is the highest sequence number
        it covered (what was read, and what the filters skipped), ``head`` the head now."""
        assert self.cursor is not None
        self.cursor = max(self.cursor, reached)
        self._caught_up = reached >= read.until
        return self._next(head)

    def attached(self, head: int) -> Action:
        """The adapter attached the subscriber at head ``head`` (``H``)."""
        self._attached = head
        assert self.cursor is not None
        if self.cursor >= head:
            self.cursor = head
            return LIVE
        return Read(self.cursor, head)

    def stop(self) -> None:
        """Do not go live: read to the end of what is there, then :data:`STOPPED`."""
        self._stopped = True

    def _next(self, head: int) -> Action:
        assert self.cursor is not None
        if self._attached is not None:
            if self.cursor >= self._attached:
                return STOPPED if self._stopped else LIVE
            return Read(self.cursor, self._attached)
        if self.cursor >= head:
            return STOPPED if self._stopped else ATTACH
        near = head - self.cursor <= self.live_within or self._caught_up
        if near and not self._stopped:
            return ATTACH
        return Read(self.cursor, head)


def interleave(frames: list[Frame], replies: Sequence[HeldReply]) -> tuple[list[Frame], int]:
    """``frames`` (replayed IOPub, in order) with the ``replies`` whose place lies within
    them inserted, each after the last frame at or below its ``after_seq``; returns the
    frames and how many replies (from the front of ``replies``, sorted by ``after_seq``)
    were placed. A reply whose place is before the first frame goes first."""
    if not replies:
        return frames, 0
    if not frames:
        return frames, 0
    last = frames[-1].last_seq or 0
    out: list[Frame] = []
    placed = 0
    for frame in frames:
        while placed < len(replies) and replies[placed].after_seq < (frame.first_seq or 0):
            out.append(replies[placed].frame)
            placed += 1
        out.append(frame)
    while placed < len(replies) and replies[placed].after_seq <= last:
        out.append(replies[placed].frame)
        placed += 1
    return out, placed
