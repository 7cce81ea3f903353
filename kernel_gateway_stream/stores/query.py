"""What one transcript read asks for: its range, its filters and its page's bounds.
Shared by the stores (SQLite reads it on a reader thread, Redis on the loop)."""

from __future__ import annotations

from collections.abc import Collection

from ..core.marks import is_mark
from ..core.messages import Record

__all__ = ["Query"]


class Query:
    """What one read asks for (built on the loop, run on a reader thread)."""

    __slots__ = ("limit", "marks", "max_bytes", "msg_types", "parent", "since", "upper")

    def __init__(
        self,
        since: int,
        upper: int,
        limit: int,
        parent: str | None,
        msg_types: Collection[str] | None,
        marks: bool,
        max_bytes: int | None,
    ) -> None:
        self.since = since
        self.upper = upper
        self.limit = limit
        self.parent = parent
        self.msg_types = frozenset(msg_types) if msg_types else None
        self.marks = marks
        self.max_bytes = max_bytes

    def full(self, count: int, taken: int) -> bool:
        """True once a page of ``count`` records and ``taken`` bytes is as big as asked."""
        return count >= self.limit or (self.max_bytes is not None and taken >= self.max_bytes)

    def wants(self, record: Record) -> bool:
        message = record.message
        if self.marks and is_mark(message):
            return True
        if self.parent is not None and message.parent_msg_id != self.parent:
            return False
        return self.msg_types is None or message.msg_type in self.msg_types
