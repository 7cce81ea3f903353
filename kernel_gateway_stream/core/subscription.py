"""A subscriber's outgoing queue and the policy for a subscriber that falls behind.

Rules (DESIGN invariants 3 and 5):

* Frames are queued by reference; the broker never waits for a subscriber. The queue
  counts the bytes it holds.
* An IOPub frame whose last sequence number the subscriber already has is dropped, so a
  replay-to-live handoff never delivers a message twice.
* :meth:`take` hands the writer everything queued, with consecutive mergeable stream
  frames merged: the further behind a subscriber is, the harder it is coalesced.
* A subscriber that holds more than ``max_bytes``, or whose oldest queued frame is older
  than ``max_lag`` seconds, is over its limit: :meth:`offer` returns an
  :class:`Overflow` naming the reason and the last sequence number it was sent, and the
  adapter disconnects it. It can resume from the transcript with ``since``.
* While ``holding`` (a replay from the transcript is being sent), live frames queue up
  but :meth:`take` returns nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from .frames import Frame, SharedMerges, merge_runs
from .marks import is_mark

__all__ = ["Overflow", "SubscriberQueue"]


@dataclass(frozen=True, slots=True)
class Overflow:
    """Why a subscriber must be disconnected, and where it can resume from."""

    reason: str
    last_seq: int
    queued_bytes: int


class SubscriberQueue:
    """One subscriber's bounded queue. Pure: time comes in as ``now``."""

    __slots__ = (
        "_frames",
        "_oldest",
        "_queued_head",
        "holding",
        "last_seq",
        "max_bytes",
        "max_lag",
        "merge_max_bytes",
        "merges",
        "msg_types",
        "overflow",
        "parent",
        "queued_bytes",
    )

    def __init__(
        self,
        *,
        since: int,
        max_bytes: int = 32 * 1024 * 1024,
        max_lag: float = 60.0,
        merge_max_bytes: int = 1024 * 1024,
        merges: SharedMerges | None = None,
        holding: bool = False,
        parent: str | None = None,
        msg_types: frozenset[str] | None = None,
    ) -> None:
        # A list and one time, not two deques: an idle subscriber's queue costs ~100 bytes.
        self._frames: list[Frame] = []
        #: When the oldest queued frame was queued (take() always takes everything).
        self._oldest = 0.0
        #: The last IOPub sequence number handed to the writer (or replayed).
        self.last_seq = since
        self._queued_head = since
        self.max_bytes = max_bytes
        self.max_lag = max_lag
        self.merge_max_bytes = merge_max_bytes
        #: Merges shared with the kernel's other subscribers (see SharedMerges).
        self.merges = merges
        self.holding = holding
        #: Only IOPub frames of this parent msg_id, and of these types, are queued.
        self.parent = parent
        self.msg_types = msg_types
        self.queued_bytes = 0
        self.overflow: Overflow | None = None

    def __len__(self) -> int:
        return len(self._frames)

    @property
    def queued_since(self) -> float | None:
        """When the oldest frame still queued was queued (the ``now`` it was offered
        with), or None when nothing is queued: how far behind the client is, in time."""
        return self._oldest if self._frames else None

    def offer(self, frame: Frame, now: float) -> Overflow | None:
        """Queue ``frame``; return an Overflow if the subscriber is now over its limit.

        Once an Overflow has been returned, every later offer returns it again and
        queues nothing.
        """
        if self.overflow is not None:
            return self.overflow
        filtered = self.parent is not None or self.msg_types is not None
        if filtered and frame.channel == "iopub" and not self.wants(frame):
            return None
        if frame.last_seq is not None:
            if frame.last_seq <= self._queued_head:
                return None
            self._queued_head = frame.last_seq
        if not self._frames:
            self._oldest = now
        self._frames.append(frame)
        self.queued_bytes += frame.size
        if self.queued_bytes > self.max_bytes:
            return self._overflow(f"slow consumer: more than {self.max_bytes} bytes queued")
        if now - self._oldest > self.max_lag:
            return self._overflow(f"slow consumer: more than {self.max_lag:g} s behind")
        return None

    def wants(self, frame: Frame) -> bool:
        """True if ``frame`` passes this subscriber's parent and msg_type filters.

        Marks (lifecycle statuses, gap records: see :mod:`.marks`) pass every filter: a
        reader of one execution must learn that it will never finish, or misses output.
        """
        if is_mark(frame.message):
            return True
        if self.parent is not None and frame.message.parent_msg_id != self.parent:
            return False
        return self.msg_types is None or frame.message.msg_type in self.msg_types

    def start_after(self, seq: int) -> None:
        """Position the queue after ``seq``: frames at or below it will not be queued."""
        self.last_seq = seq
        self._queued_head = max(self._queued_head, seq)

    def take(self) -> list[Frame]:
        """Everything the writer should send now, merged; empty while holding."""
        if self.holding or not self._frames:
            return []
        frames = self._frames
        self._frames = []
        self.queued_bytes = 0
        if len(frames) > 1:
            merge = self.merges.merge_runs if self.merges is not None else merge_runs
            frames = merge(frames, self.merge_max_bytes)
        return frames

    def sent(self, frames: list[Frame]) -> None:
        """Record that ``frames`` (from :meth:`take` or a replay) were handed to the transport."""
        for frame in reversed(frames):
            if frame.last_seq is not None:
                self.last_seq = max(self.last_seq, frame.last_seq)
                self._queued_head = max(self._queued_head, self.last_seq)
                return

    def _overflow(self, reason: str) -> Overflow:
        self.overflow = Overflow(reason, self.last_seq, self.queued_bytes)
        self._frames = []
        self.queued_bytes = 0
        return self.overflow
