"""Committed-only delivery: a record reaches a client only once it is the history.

With several nodes the owner of a kernel numbers its records before Redis has them. A
number is the history only once the fenced append that stores it is confirmed: until
then the owner may have lost its lease (paused past its TTL, cut off from Redis), and
another node may give that number to other output. So the owner fans out, to its own
clients as to every other node's, only what Redis confirmed, as a log's consumers see
only committed entries (Kafka: "Only committed messages are ever given out to the
consumer").

:class:`CommittedFeed` decides which written records to fan out: each once, in order,
above the last fanned out. A record is written again when a retried append had landed
(Redis skips it, the feed too); a record the store kept in place of others (a gap record
for what its bounded buffer dropped) is fanned out as written, so clients see exactly
what the transcript holds.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable

from .messages import Record

__all__ = ["CommittedFeed"]


class CommittedFeed:
    """The records of one kernel to fan out as the store confirms them (see the module
    docstring). ``head``: the last seq fanned out (0: none)."""

    __slots__ = ("head",)

    def __init__(self, head: int = 0) -> None:
        self.head = head

    def written(self, records: Iterable[Record]) -> list[Record]:
        """``records``, just confirmed in Redis in this order: those to fan out now (every
        one above :attr:`head`, which moves to the last)."""
        out = []
        for record in records:
            if record.seq > self.head:
                out.append(record)
                self.head = record.seq
        return out
