"""The coalescer: turns a kernel's IOPub records into frames, merging bursts of output.

Rules (DESIGN invariant 6), in the order they are checked:

1. A non-``stream`` record flushes whatever is pending, then goes out at once.
2. A ``stream`` record that can extend the pending run (same parent ``msg_id``, same
   stream name, next sequence number) joins it; if the run reaches ``max_bytes`` it goes
   out at once.
3. A ``stream`` record that cannot extend the pending run flushes the run and starts a
   new one, which keeps the current deadline.
4. A ``stream`` record with nothing pending goes out at once if the stream has been
   quiet (no stream frame sent for ``quiet`` seconds); otherwise it starts a run that
   goes out at the end of the window (``window`` seconds after the last stream frame).
5. When the deadline passes (:meth:`due`), the pending run goes out and a new window
   starts.

So a lone message after a quiet period adds no latency, and a burst costs at most one
window. ``quiet`` is separate from ``window`` so that steady, spaced output (a progress
line every 10 ms) is not held for a window, while a flood (messages closer together than
``quiet``) is: frames per second stay at most ``1 / quiet`` however fast the kernel
prints, and about ``1 / window`` in a sustained flood. The coalescer never reads the
clock: ``now`` is passed in, and the adapter arms a timer for :meth:`next_deadline`.
"""

from __future__ import annotations

from .frames import Frame
from .messages import Record

__all__ = ["Coalescer"]


class Coalescer:
    """One kernel's coalescing state. Not thread-safe; one owner calls it."""

    __slots__ = (
        "_last_sent",
        "_pending",
        "_pending_bytes",
        "_window_end",
        "max_bytes",
        "quiet",
        "window",
    )

    def __init__(
        self, *, window: float = 0.05, max_bytes: int = 65536, quiet: float | None = None
    ) -> None:
        """``quiet`` defaults to ``window`` (every message within a window of the last
        frame is held); the broker passes a shorter one."""
        quiet = window if quiet is None else quiet
        if window < 0 or max_bytes <= 0 or not 0 <= quiet <= window:
            raise ValueError("need window >= 0, 0 <= quiet <= window and max_bytes > 0")
        self.window = window
        self.quiet = quiet
        self.max_bytes = max_bytes
        self._last_sent: float | None = None
        self._pending: list[Frame] = []
        self._pending_bytes = 0
        self._window_end: float | None = None

    def feed(self, record: Record, now: float) -> list[Frame]:
        """Take one record; return the frames that must go out now, in order."""
        frame = Frame.from_record(record)
        if not record.message.is_stream:
            out = self.flush()
            out.append(frame)
            return out
        if self._pending:
            if (
                self._pending[-1].can_merge(frame)
                and self._pending_bytes + frame.size <= self.max_bytes
            ):
                self._pending.append(frame)
                self._pending_bytes += frame.size
                return self.flush() if self._pending_bytes >= self.max_bytes else []
            out = self.flush()
            out.extend(self._start_run(frame))
            return out
        if self._last_sent is None or now - self._last_sent >= self.quiet or self.window == 0:
            self._last_sent = now
            self._window_end = now + self.window
            return [frame]
        return self._start_run(frame)

    def due(self, now: float) -> list[Frame]:
        """The frames whose deadline has passed at ``now``."""
        if not self._pending or self._window_end is None or now < self._window_end:
            return []
        self._last_sent = now
        self._window_end = now + self.window
        return self.flush()

    def next_deadline(self) -> float | None:
        """When :meth:`due` will next have something to send, or None."""
        return self._window_end if self._pending else None

    def flush(self) -> list[Frame]:
        """Everything pending, now (a subscriber attaching, shutdown, a non-stream record)."""
        if not self._pending:
            return []
        frame = Frame.join(self._pending)
        self._pending = []
        self._pending_bytes = 0
        return [frame]

    def _start_run(self, frame: Frame) -> list[Frame]:
        """Hold ``frame`` as the start of a run; a frame that fills a run alone goes now."""
        if frame.size >= self.max_bytes:
            return [frame]
        self._pending = [frame]
        self._pending_bytes = frame.size
        return []
