"""The coalescer: turns a kernel's IOPub records into frames, merging bursts of output.

Rules (DESIGN invariant 6), in the order they are checked:

1. A non-``stream`` record flushes whatever is pending, then goes out at once.
2. A ``stream`` record that arrives after ``quiet`` seconds without stream activity (no
   stream record arrived, no stream frame sent) goes out at once, after whatever was still
   pending (which it joins if it can).
3. Otherwise it joins the pending run if it can (same parent ``msg_id``, same stream
   name, next sequence number); a run that reaches ``max_bytes`` goes out at once. A
   record that cannot join flushes the run and starts a new one, which keeps the deadline.
   A run's bytes are those of the message it becomes: its first record's parts, then
   each next record's content (its text, JSON-escaped, and a few bytes more), not each
   record's whole header again, which would cap a flood of short lines at a seventh of
   ``max_bytes`` of text (a 64-byte line's message is about 475 bytes).
4. With nothing pending, it starts a run.
5. A run goes out (:meth:`due`) when its stream has been quiet for ``quiet`` seconds (the
   burst is over) or ``window`` seconds after the last stream frame, whichever is first.

So a lone message after a quiet period adds no latency, a short burst waits until it ends,
and a flood costs at most one window, with frames at most every ``quiet`` seconds. ``quiet``
is its own threshold so that spaced output (a progress line every 10 ms) is not held for a
window while a flood (messages closer together than ``quiet``) is merged. The coalescer
never reads the clock: ``now`` is passed in, and the adapter arms a timer for
:meth:`next_deadline`.
"""

from __future__ import annotations

from .frames import Frame, continues
from .messages import Record

__all__ = ["Coalescer"]


class Coalescer:
    """One kernel's coalescing state. Not thread-safe; one owner calls it."""

    __slots__ = (
        "_last_arrival",
        "_last_sent",
        "_pending",
        "_pending_bytes",
        "_unwritten",
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
        self._last_arrival: float | None = None
        self._pending: list[Record] = []
        self._pending_bytes = 0
        self._window_end: float | None = None
        #: A stream frame went out that :meth:`written` has not been told of yet.
        self._unwritten = False

    def feed(self, record: Record, now: float) -> list[Frame]:
        """Take one record; return the frames that must go out now, in order."""
        message = record.message
        if message.stream_name is None:
            out = self.flush()
            out.append(Frame.from_record(record))
            return out
        idle = self._idle(now)
        self._last_arrival = now
        # Pending records become a Frame only when they go out: one per run, not one per
        # record, which is most of the coalescer's cost in a flood.
        if self._pending:
            if self._fits(record):
                self._pending.append(record)
                self._pending_bytes += len(message.raw_content)
                if idle or self._pending_bytes >= self.max_bytes:
                    return self._send_pending(now)
                return []
            if idle:
                out = self._send_pending(now)
                out.append(Frame.from_record(record))
                return out
            out = self.flush()
            out.extend(self._start_run(record))
            return out
        if idle or self._window_end is None or now >= self._window_end:
            self._sent(now)
            return [Frame.from_record(record)]
        return self._start_run(record)

    def due(self, now: float) -> list[Frame]:
        """The frames whose deadline has passed at ``now``."""
        deadline = self.next_deadline()
        if deadline is None or now < deadline:
            return []
        return self._send_pending(now)

    def next_deadline(self) -> float | None:
        """When :meth:`due` will next have something to send, or None."""
        if not self._pending or self._window_end is None or self._last_arrival is None:
            return None
        return min(self._window_end, self._last_arrival + self.quiet)

    def flush(self) -> list[Frame]:
        """Everything pending, now (a subscriber attaching, shutdown, a non-stream record)."""
        pending = self._pending
        if not pending:
            return []
        self._pending = []
        self._pending_bytes = 0
        first = pending[0]
        if len(pending) == 1:
            return [Frame.from_record(first)]
        text = "".join(r.message.text or "" for r in pending)
        return [Frame("iopub", first.message, first.seq, pending[-1].seq, text)]

    def written(self, now: float) -> None:
        """The stream frames that went out last were written to every subscriber by
        ``now``: ``quiet`` and ``window`` count from then, not from when they were handed
        over. With a thousand subscribers the writing takes longer than ``quiet``; the
        next record, received after it, would look like the first after a quiet period,
        go out alone, and its own writing would make the next one look so too: a frame,
        and a write to every subscriber, per record the reader got between two writes."""
        if self._unwritten:
            self._unwritten = False
            if self._last_sent is not None and now > self._last_sent:
                self._last_sent = now
                self._window_end = now + self.window

    def _idle(self, now: float) -> bool:
        """True if no stream record arrived and no stream frame went out for ``quiet``."""
        last = self._last_sent
        if self._last_arrival is not None and (last is None or self._last_arrival > last):
            last = self._last_arrival
        return last is None or now - last >= self.quiet

    def _fits(self, record: Record) -> bool:
        """True if ``record`` can extend the pending run (``Frame.can_merge``, on records)."""
        last = self._pending[-1]
        message, other = last.message, record.message
        return (
            record.seq == last.seq + 1
            and continues(message, other)
            and self._pending_bytes + len(other.raw_content) <= self.max_bytes
        )

    def _sent(self, now: float) -> None:
        self._last_sent = now
        self._window_end = now + self.window
        self._unwritten = True

    def _send_pending(self, now: float) -> list[Frame]:
        self._sent(now)
        return self.flush()

    def _start_run(self, record: Record) -> list[Frame]:
        """Hold ``record`` as the start of a run; one that fills a run alone goes now."""
        size = record.message.size
        if size >= self.max_bytes:
            return [Frame.from_record(record)]
        self._pending = [record]
        self._pending_bytes = size
        return []
