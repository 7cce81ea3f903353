"""The TranscriptStore contract.

A store keeps, per kernel, every :class:`~kernel_gateway_stream.core.messages.Record`
the Tap numbered, and serves ranges of them back by sequence number. The Tap is the
only writer; handlers and subscriptions read. Implementations: SQLite (the embedded
default); Redis Streams for several nodes.

A store never makes the Tap wait (DESIGN invariant 4), holds a bounded amount of what is
not yet durable, and never reuses a sequence number after a crash: what it could not keep
becomes a gap record (:mod:`..core.marks`).
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from traitlets.config import LoggingConfigurable

from ..core.health import ComponentHealth
from ..core.messages import Record

__all__ = ["TranscriptInfo", "TranscriptPage", "TranscriptStore", "WrittenCallback"]

#: ``written(kernel_id, records)``: see :attr:`TranscriptStore.written`.
WrittenCallback = Callable[[str, list[Record]], None]


@dataclass(frozen=True, slots=True)
class TranscriptInfo:
    """What a store knows of one kernel's transcript."""

    kernel_id: str
    #: The lowest sequence number still kept (``head + 1`` when nothing is kept).
    first_seq: int
    #: The last sequence number recorded (0: none).
    head: int
    started: float | None
    #: When the kernel shut down, or None while it runs (or if the gateway died first).
    ended: float | None


@dataclass(frozen=True, slots=True)
class TranscriptPage:
    """A page of records, in sequence order, and where the transcript stands."""

    records: list[Record]
    head: int
    first_seq: int
    #: ``(from_seq, to_seq)``, inclusive, when the reader asked for records that
    #: retention already discarded; None otherwise.
    discarded: tuple[int, int] | None = None
    #: The highest sequence number the read covered: its last record's, or, when it was
    #: not cut short by its limits, the end of the range (records the filters skipped
    #: up to there need not be read again).
    scanned: int = 0


class _StoreMeta(ABCMeta, type(LoggingConfigurable)):  # type: ignore[misc]
    pass


class TranscriptStore(LoggingConfigurable, metaclass=_StoreMeta):  # type: ignore[metaclass]
    """Durable, per-kernel, sequence-numbered IOPub transcripts.

    The application creates one store (its class is ``GatewayStreamApp.transcript_store_class``),
    calls :meth:`open` before any kernel is tapped and :meth:`close` at shutdown. Methods
    without ``async`` are called on the event loop and must not block it.
    """

    #: ``(kernel_id, first_seq, last_seq)`` of the gap records :meth:`open` wrote for
    #: numbers given out but not kept when the gateway last stopped.
    recovered: list[tuple[str, int, int]]

    #: True if a record may reach clients only once the store made it durable (several
    #: nodes: see :mod:`..core.committed`): :meth:`read` then serves durable records only,
    #: and the store calls :attr:`written` with what it made durable. False (SQLite, one
    #: node): records are fanned out as they are appended, so a full disk keeps live
    #: output flowing.
    committed_only = False
    #: ``written(kernel_id, records)``: with :attr:`committed_only`, called on the event
    #: loop with each kernel's records, in order, once durable (set by the recorders'
    #: registry).
    written: WrittenCallback | None = None

    @abstractmethod
    def open(self) -> None:
        """Prepare storage and recover from an unclean stop (see :attr:`recovered`).
        Called once by the application at start-up, before any Tap.

        Raises:
            StoreUnavailable: the storage cannot be opened or written; the start stops.
        """

    @abstractmethod
    def close(self) -> None:
        """Make everything appended durable, within a bounded time, and release resources.
        Called once at shutdown; never waits forever on a failing disk."""

    @abstractmethod
    def append(self, record: Record) -> None:
        """Take one record. Called by the Tap on the event loop for every IOPub message,
        in sequence order; must return at once (write off the loop) and must make the
        record visible to :meth:`read` immediately, even before it is durable. What it
        cannot hold within its bound becomes a gap record."""

    @abstractmethod
    def kernel_started(self, kernel_id: str, now: float) -> None:
        """Called by the Tap when it starts tapping a kernel (also after a gateway restart)."""

    @abstractmethod
    def kernel_ended(self, kernel_id: str, now: float) -> None:
        """Called by the Tap when its kernel shuts down; starts the keep-after-shutdown clock."""

    def has_room(self) -> bool:
        """Whether records appended now are kept, not turned into gap records because the
        store is behind (its bound of records not yet durable nearly reached). The Tap of
        a kernel that holds its output (the gateway's launcher) stops reading while this is
        False, and the kernel keeps what it publishes: nothing becomes a gap. Called on the
        event loop, once per batch."""
        return True

    def durable_head(self, kernel_id: str) -> int:
        """The highest sequence number up to which every record of ``kernel_id`` appended
        is durable (or not kept, and a gap). Called on the event loop, often: it tells a
        kernel of the gateway's launcher what it may let go of. A store that cannot tell
        says 0: nothing is let go of, and the kernel keeps what its bound allows."""
        return 0

    @abstractmethod
    async def head(self, kernel_id: str) -> int:
        """The last sequence number recorded for ``kernel_id`` (0 if none). Called by the
        Tap when it starts, so numbering continues after a restart (DESIGN invariant 1)."""

    @abstractmethod
    async def info(self, kernel_id: str) -> TranscriptInfo | None:
        """What is known of ``kernel_id``'s transcript, or None if nothing. Called by
        handlers to tell a kept transcript from an unknown kernel."""

    @abstractmethod
    async def read(
        self,
        kernel_id: str,
        since: int,
        limit: int,
        *,
        until: int | None = None,
        parent: str | None = None,
        msg_types: Collection[str] | None = None,
        marks: bool = False,
        max_bytes: int | None = None,
    ) -> TranscriptPage:
        """Up to ``limit`` records with ``since < seq <= until`` in order, optionally only
        those whose parent ``msg_id`` is ``parent`` and whose type is in ``msg_types``
        (with ``marks``, lifecycle statuses and gap records pass those filters), and
        stopping once ``max_bytes`` of messages are read. Called by handlers (REST reads)
        and subscriptions (replay)."""

    @abstractmethod
    async def marks(self, kernel_id: str, since: int) -> list[Record]:
        """The kernel's lifecycle statuses and gap records after ``since``, in order.
        Called by the execution summaries."""

    @abstractmethod
    async def flush(self, timeout: float | None = None) -> bool:
        """Return once every record appended so far is durable (True), or after ``timeout``
        seconds (False). Called at shutdown and by tests."""

    @abstractmethod
    def health(self) -> ComponentHealth:
        """The store's state for ``GET /api/gateway/health``; called on the event loop."""

    @abstractmethod
    def save_cursor(self, kernel_id: str, session_id: str, seq: int) -> None:
        """Remember the last sequence number sent to a client session. Called by the
        channels connection when it closes; must not block."""

    @abstractmethod
    def save_link(self, kernel_id: str, link: dict[str, Any] | None) -> None:
        """Remember how to reach a running kernel (its connection info and what the
        gateway knows of it), or forget it (``None``: the kernel shut down or was
        detached), so that a gateway started again re-attaches the kernels that outlived
        it. Called on the event loop; must not block. The store's files are private: the
        kernel's key is among what it keeps."""

    @abstractmethod
    async def load_links(self) -> dict[str, dict[str, Any]]:
        """Every remembered kernel link, by kernel id."""

    @abstractmethod
    async def load_cursor(self, kernel_id: str, session_id: str) -> int | None:
        """The cursor saved for this session, or None. Called when a session reconnects."""
