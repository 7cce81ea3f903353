"""The recorder (once called the Tap): the gateway's one reader of each kernel's IOPub.

One :class:`KernelRecorder` per kernel lives from kernel start to shutdown, owned by the
gateway and independent of clients, so output is recorded with nobody watching. For each
message it receives it assigns the next sequence number, appends the record to the
transcript store and publishes it to the broker (DESIGN invariants 1, 2 and 4). With a
store that is :attr:`~..stores.base.TranscriptStore.committed_only` (several nodes) it
publishes a record only once the store has written it (:meth:`KernelRecorder.written`, see
:mod:`..core.committed`), in the same order.

ZMQ details that matter here:

* **Slow joiner.** A SUB socket misses whatever its PUB publishes before the subscription
  reaches it. The Tap therefore sends ``kernel_info_request`` on a shell socket of its own
  until an IOPub message arrives, and only then reports ready; client connections and the
  execute API wait for that before they send the kernel anything.
* **No drops, within bytes.** The IOPub source reads its socket eagerly into a backlog
  bounded in bytes (``iopub_backlog_bytes``), so the kernel's PUB socket never drops a
  message because the gateway fell behind for a moment; past that budget the gateway
  drops, in one explicit gap record. A message over ``max_message_bytes`` is recorded cut
  (see :mod:`.core.oversize`).

The registry (:mod:`.registry`) keeps one Tap per kernel of the server's kernel manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from ..broker.base import Broker
from ..core.committed import CommittedFeed
from ..core.errors import MalformedMessage, start_failure
from ..core.guards import DigestHistory, withhold_traceback
from ..core.marks import (
    SPOOL_MSG_TYPE,
    gap_message,
    is_mark,
    lifecycle_request,
    lifecycle_status,
    request_mark,
)
from ..core.messages import KernelMessage, Record, Signer, unstored_placeholder
from ..core.oversize import cut_message
from ..core.ownership import Action, Event, Ownership, Role
from ..core.sequencer import Sequencer
from ..core.upstream_counters import REORDER_WINDOW, missed_while_away
from ..kernels.base import IOPubSource, KernelLink, death_reason, mark_start_failed, start_of
from ..stores.base import TranscriptStore
from .activity import ActivityBridge
from .follower import _FOLLOWED

__all__ = [
    "COUNTED_MSG_TYPES",
    "PUBLISH_TIMEOUT",
    "STARTING_GRACE",
    "KernelRecorder",
    "MessageCounts",
    "RecordObserver",
    "RecordingContext",
    "RecordingPolicy",
    "now_iso",
]

#: ``observer(record)``: called for every record a Tap records, after it is published.
RecordObserver = Callable[[Record], None]


#: IOPub message types counted by name in metrics (the Jupyter messaging spec's, and what
#: the gateway records itself); any other counts as ``other``.
COUNTED_MSG_TYPES = frozenset(
    [
        "stream",
        "display_data",
        "update_display_data",
        "execute_input",
        "execute_result",
        "error",
        "status",
        "clear_output",
        "debug_event",
        "comm_open",
        "comm_msg",
        "comm_close",
        "input_request",
        "shutdown_reply",
        "kernel_gateway_stream_gap",
        "kernel_gateway_stream_lifecycle",
        "kernel_gateway_stream_invalid",
    ]
)


#: The msg_ids of a kernel's last this many messages recorded (or delivered, on a follower)
#: are kept, and read back from the transcript when recording starts again: a kernel of
#: the gateway's launcher publishes again what it was not told is durable, and what of it
#: the transcript has is not recorded twice.
RECENT_IDS = 16384
#: Seconds between two acknowledgements of what is durable, to a kernel of the launcher.
ACK_INTERVAL = 0.1
#: Seconds a Tap leaves a kernel of the gateway's launcher to hold its output while the
#: store has no room (see KernelRecorder.accepting); then it reads on, and the store's gap
#: record counts what it cannot keep.
HOLD_BACK_SECONDS = 30.0

#: Seconds a kernel's end waits for its last records to be written (a committed-only
#: store) before its clients are ended with what they got.
PUBLISH_TIMEOUT = 10.0

#: Seconds a Tap may wait for its kernel's first IOPub message (a kernel starting) before
#: the gateway's health calls the kernel not ready.
STARTING_GRACE = 10.0


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


@dataclass(frozen=True, slots=True)
class RecordingPolicy:
    """What a recorder does to a message before it records it: cut one over
    ``max_message_bytes`` (0: no limit) to its first ``cut_keep_bytes`` of text, and
    withhold tracebacks when jupyter_server's policy says so."""

    max_message_bytes: int
    cut_keep_bytes: int
    tracebacks_allowed: bool = True
    traceback_replacement: str = "An exception occurred."

    def screen(self, message: KernelMessage) -> KernelMessage:
        """``message`` as a client may see it (jupyter_server's traceback policy)."""
        if self.tracebacks_allowed:
            return message
        return withhold_traceback(message, self.traceback_replacement)


class MessageCounts:
    """``[messages, bytes]`` recorded, by msg_type (for metrics): the types of the messaging
    spec and the gateway's own, every other under ``other`` (a kernel chooses its
    msg_types, and must not grow this without bound)."""

    def __init__(self) -> None:
        self.by_type: dict[str, list[int]] = {"other": [0, 0]}

    def add(self, message: KernelMessage) -> None:
        counts = self.by_type.get(message.msg_type)
        if counts is None:
            if message.msg_type in COUNTED_MSG_TYPES:
                counts = self.by_type.setdefault(message.msg_type, [0, 0])
            else:
                counts = self.by_type["other"]
        counts[0] += 1
        counts[1] += message.size


@dataclass(frozen=True, slots=True)
class RecordingContext:
    """What the registry gives every recorder it makes: shared settings and counters, and
    the callbacks a recorder reports through (it holds no reference to the registry)."""

    log: Any
    policy: RecordingPolicy
    counts: MessageCounts
    #: Called for every record, after it is published (shared, appended to by others).
    observers: list[RecordObserver]
    activity: ActivityBridge
    #: ``take_restart_gap(kernel_id)``: the reason of a gap to record before the kernel's
    #: next message (it printed unseen meanwhile), once; None if there is none.
    take_restart_gap: Callable[[str], str | None]
    #: ``restarted(kernel_id)``: the kernel restarted by itself (its ports may have moved).
    restarted: Callable[[str], None]
    #: Kernels that died by themselves, by reason (``kernel_died``, ``cpu_limit``).
    deaths: dict[str, int] = field(default_factory=dict)


class KernelRecorder:
    """Records one kernel's IOPub for the gateway: the kernel's :class:`IOPubSink`.
    Created and driven by :class:`RecorderRegistry`; reads nothing itself (its source does)."""

    def __init__(
        self,
        kernel_id: str,
        kernel_manager: Any,
        link: KernelLink,
        store: TranscriptStore,
        broker: Broker,
        context: RecordingContext,
        *,
        role: Role = Role.OWNER,
    ) -> None:
        self.kernel_id = kernel_id
        self.kernel_manager = kernel_manager
        self.link = link
        self.store = store
        self.broker = broker
        self.context = context
        self.policy = context.policy
        self.log = context.log
        self.activity = context.activity.of(kernel_id, kernel_manager)
        self.signer: Signer = link.signer  # type: ignore[attr-defined]
        self.session_id = uuid.uuid4().hex
        self.sequencer = Sequencer(kernel_id)
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.received = 0
        #: Messages over max_message_bytes the Tap itself cut (a ZMQ source cuts its own).
        self.cut = 0
        #: The kernel's lives: 0 until its first restart, one more at each (restart marks
        #: carry the number of the life they begin).
        self.epoch = 0
        #: jupyter_client's restarter is restarting the kernel (it died by itself): the
        #: restart it asks of the kernel manager is its, not a client's (see
        #: :meth:`_on_auto_restart`).
        self._auto_restart = False
        #: The reason of the gap to record before the kernel's next message, if it does
        #: not say that it held its output (re-attached after a restart of the gateway).
        self._restart_gap: str | None = None
        #: The msg_ids last recorded before a restart gap (see :meth:`_read_recent`).
        self._known_ids: list[str] = []
        self._known_session = ""
        self._session_read_from: KernelMessage | None = None
        self._last: KernelMessage | None = None
        #: Who records the kernel (see :mod:`..core.ownership`): a follower's records come
        #: from the record bus (:meth:`deliver`), and it records nothing itself.
        self.ownership = Ownership(role)
        #: The kernel said it holds its output while nobody listens (the gateway's
        #: launcher): a graceful hand-over to another node loses nothing.
        self.holds_output = False
        #: The kernel keeps what it published until told it is durable (the launcher's
        #: notice says so): ``(seq, msg_id)`` of its messages recorded and not yet told.
        self.acknowledges = False
        self._unacknowledged: deque[tuple[int, str]] = deque()
        #: Since when the store has had no room for this kernel's records (see accepting).
        self._held_back_since: float | None = None
        self._reading_on = False
        self._ack_timer: asyncio.TimerHandle | None = None
        #: The msg_ids of the kernel's messages recorded last (see RECENT_IDS).
        self._recent = DigestHistory(RECENT_IDS)
        #: Messages published again that the transcript had: not recorded.
        self.replayed_known = 0
        self.source: IOPubSource = _FOLLOWED if self.ownership.follows else link.iopub(self)
        self._connected_at = time.monotonic()
        #: Records are published once the store has written them (several nodes): which.
        self.committed_only = store.committed_only
        self._feed = CommittedFeed()
        #: Called once every record numbered so far is published (see :meth:`when_published`).
        self._when_published: list[Callable[[], None]] = []
        self._publish_deadline: asyncio.TimerHandle | None = None

    @property
    def head(self) -> int:
        return self.sequencer.head

    @property
    def closed(self) -> bool:
        """True once the Tap stopped (its kernel shut down, or the gateway is stopping)."""
        return self.ownership.closed

    @property
    def following(self) -> bool:
        """Another node records this kernel: this one fans out what the bus brings."""
        return self.ownership.follows

    @property
    def last_message(self) -> KernelMessage | None:
        """The last message recorded, or delivered off the record bus (None: none yet)."""
        return self._last

    @property
    def rejected(self) -> int:
        return self.source.rejected

    @property
    def replays(self) -> int:
        return self.source.replays

    @property
    def invalid(self) -> int:
        return self.source.invalid

    @property
    def reachable(self) -> bool:
        return self.source.reachable

    async def start(self) -> None:
        """Number from the store's head, subscribe, and start nudging until ready (a
        follower: follow the record bus from the store's head, ready at once)."""
        self.sequencer.head = await self.store.head(self.kernel_id)
        if self.sequencer.head:
            await self._read_recent()
        marks = await self.store.marks(self.kernel_id, 0)
        self.epoch = sum(1 for mark in marks if mark.message.execution_state == "restarting")
        self.broker.open_kernel(self.kernel_id, self.sequencer.head)
        self._feed.head = self.sequencer.head
        if self.ownership.follows:
            self.ready.set_result(None)
            return
        self._start_recording()

    async def _read_recent(self) -> None:
        """The msg_ids of the kernel's last messages in the transcript (see RECENT_IDS)."""
        until, wanted = self.sequencer.head, RECENT_IDS
        found: list[str] = []
        # Backwards, a page at a time: the head is often a gap record spanning the numbers
        # reserved ahead and never used (after a crash), below which the messages are.
        for _ in range(8):
            if until <= 0 or wanted <= 0:
                break
            since = max(0, until - wanted)
            page = await self.store.read(
                self.kernel_id, since, wanted, until=until, max_bytes=64 * 1024 * 1024
            )
            if not page.records:
                break
            ids = [r.message.msg_id for r in page.records if not is_mark(r.message)]
            found[:0] = ids
            wanted -= len(ids)
            until = min(since, page.records[0].first_seq - 1)
        for msg_id in found:
            self._recent.add(msg_id.encode())
        # For a restart gap's count (:func:`missed_while_away`): the last ids, in order,
        # hold every number of the kernel's session near the highest.
        self._known_ids = found[-2 * REORDER_WINDOW :]

    def _start_recording(self) -> None:
        self.store.kernel_started(self.kernel_id, time.time())
        # Re-attached after the gateway's restart: the kernel printed unseen meanwhile. A
        # kernel of the gateway's launcher held that output and says so first (its spool
        # notice); for any other, the first message it sends comes after a gap.
        self._restart_gap = self.context.take_restart_gap(self.kernel_id)
        self._connected_at = time.monotonic()
        self.source.start()
        self.kernel_manager.add_restart_callback(self._on_auto_restart, "restart")
        self.kernel_manager.add_restart_callback(self._on_dead, "dead")
        hooks = getattr(self.kernel_manager, "lifecycle_hooks", None)
        if hooks is not None:  # our kernel manager says when a restart or shutdown begins
            hooks.append(self._on_lifecycle_request)
        # A pending kernel (jupyter_server's use_pending_kernels) may still be starting:
        # if its start fails, it is dead, with the reason, at once.
        started = start_of(self.kernel_manager)
        if started is not None:
            started.add_done_callback(self._on_started)

    def _on_started(self, started: asyncio.Future[Any]) -> None:
        if started.cancelled() or started.exception() is None or self.closed:
            return
        reason = start_failure(cast(BaseException, started.exception()))
        mark_start_failed(self.kernel_manager, reason)
        self.log.warning("Kernel %s failed to start: %s", self.kernel_id, reason)
        self.close("start_failed")

    def late(self) -> bool:
        """True if the Tap has waited for its kernel's first IOPub message for longer than a
        kernel takes to start."""
        return time.monotonic() - self._connected_at > STARTING_GRACE

    def accepting(self) -> bool:
        """Not while the store is too far behind to keep what is recorded now, for a kernel
        that keeps its output until told it is durable (the gateway's launcher): its
        records would become gap records, acknowledged as durable, and the kernel would let
        go of them. Left with it instead, they are lost only past its own bound (counted).
        For at most :data:`HOLD_BACK_SECONDS` at a time: what the kernel sends meanwhile
        also queues in its socket, which nothing bounds. Other kernels are read on: the
        store's gap record counts exactly what they lose."""
        if not self.acknowledges or self.store.has_room():
            if self._held_back_since is not None:
                self._held_back_since = None
                self._reading_on = False
                self.log.info("Kernel %s: the store has room again, reading on", self.kernel_id)
            return True
        now = time.monotonic()
        if self._held_back_since is None:
            self._held_back_since = now
            self.log.warning(
                "Kernel %s: the transcript store is behind; the kernel holds its output "
                "(for %.0f s at most)",
                self.kernel_id,
                HOLD_BACK_SECONDS,
            )
        if now - self._held_back_since < HOLD_BACK_SECONDS:
            return False
        if not self._reading_on:
            self._reading_on = True
            self.log.warning(
                "Kernel %s: the store still has no room after %.0f s; reading on (what it "
                "cannot keep becomes a gap record)",
                self.kernel_id,
                HOLD_BACK_SECONDS,
            )
        return True

    def batch_received(self) -> None:
        if not self.ready.done():
            self.ready.set_result(None)
            self.activity.retire_watcher()
        self.activity.batch_ended()

    def link_changed(self, reachable: bool, reason: str, lost: int | None) -> None:
        """The kernel stopped answering, or answers again: recorded as a mark every reader
        sees; output the source may have missed meanwhile is a gap record."""
        if not self.ownership.records:
            return
        if reachable:
            if lost != 0:
                self.record_gap(reason, lost)
            self._record(
                lifecycle_request(
                    "reachable",
                    reason,
                    msg_id=str(uuid.uuid4()),
                    date=now_iso(),
                    session=self._kernel_session(),
                )
            )
            self.kernel_manager.execution_state = "idle"
        else:
            self._record(
                lifecycle_request(
                    "unreachable",
                    reason,
                    msg_id=str(uuid.uuid4()),
                    date=now_iso(),
                    session=self._kernel_session(),
                )
            )
            self.kernel_manager.execution_state = "unreachable"

    def record_gap(self, reason: str, lost: int | None) -> None:
        """One gap record: the source missed ``lost`` messages here (``None``: an unknown
        number) that no transcript can have."""
        seq = self.sequencer.head + 1
        self._record(
            gap_message(seq, seq, reason, date=now_iso(), lost=lost, session=self._kernel_session())
        )

    def record_request(self, msg_id: str, cell_id: str) -> None:
        """Execute request ``msg_id``, about to be sent, runs notebook cell ``cell_id``
        (see :func:`.core.marks.request_mark`). Not on a follower: only the owner
        numbers records, and the mark is not worth a round trip to it."""
        if not self.ownership.records:
            return
        self._record(
            request_mark(
                msg_id,
                cell_id,
                mark_id=f"request-{uuid.uuid4()}",
                date=now_iso(),
                session=self._kernel_session(),
            )
        )

    def record_message(self, message: KernelMessage) -> None:
        """Record a message from the kernel's IOPub (or one that did not come on IOPub, an
        ``input_request`` for one of the gateway's own executions): the next seq."""
        if self.ownership.follows:
            return
        if message.msg_type == SPOOL_MSG_TYPE:
            self._spool_notice(message)
            return
        if self._restart_gap is not None and message.msg_type != "iopub_welcome":
            # What the kernel numbered while nobody recorded it: at most that many
            # messages, by jupyter_client's numbering (unknown for a kernel restarted
            # meanwhile, or one that numbers otherwise).
            reason, self._restart_gap = self._restart_gap, None
            self.record_gap(reason, missed_while_away(self._known_ids, message.msg_id))
            self._known_ids = []
        self._recent.add(message.msg_id.encode())
        limit = self.policy.max_message_bytes
        if limit and message.size > limit:
            # A source that decodes before it hands over (an upstream gateway's WebSocket)
            # held it once already; what the Tap records and fans out is cut all the same.
            self.cut += 1
            try:
                message = cut_message(
                    message.parts(),
                    max_message_bytes=limit,
                    keep_bytes=self.policy.cut_keep_bytes,
                )
            except MalformedMessage:  # a header over 64 KiB: only its slot is kept
                message = unstored_placeholder(message, "max_message_bytes", date=now_iso())
        record = self._record(message)
        if self.acknowledges:
            self._unacknowledged.append((record.seq, message.msg_id))
            if self._ack_timer is None:
                loop = asyncio.get_running_loop()
                self._ack_timer = loop.call_later(ACK_INTERVAL, self._acknowledge)

    def record_replayed(self, message: KernelMessage) -> None:
        """A message the kernel published again (it was not told it is durable): recorded
        unless the transcript has it already (by its msg_id), so nothing twice."""
        if self.ownership.follows:
            return
        if message.msg_id.encode() in self._recent:
            self.replayed_known += 1
            return
        # Marked: some of what a killed gateway had not made durable had reached its
        # clients, and a gateway chained behind it tells those by msg_id (see
        # REPLAYED_METADATA_KEY), so the record is never merged with another.
        self.record_message(message.marked_replayed())

    def _acknowledge(self) -> None:
        """Tell the kernel which of its messages are durable now; again in ACK_INTERVAL
        while some are not (an idle kernel costs no timer)."""
        self._ack_timer = None
        if not self.ownership.records:
            return
        durable = self.store.durable_head(self.kernel_id)
        last = None
        pending = self._unacknowledged
        while pending and pending[0][0] <= durable:
            last = pending.popleft()[1]
        if last is not None:
            self.source.acknowledge(last)
        if pending:
            loop = asyncio.get_running_loop()
            self._ack_timer = loop.call_later(ACK_INTERVAL, self._acknowledge)

    def _spool_notice(self, message: KernelMessage) -> None:
        """The kernel held its IOPub while nobody listened and publishes it now: what it
        had to drop is a gap of that size; nothing dropped, no gap."""
        content = message.content()
        held, dropped = content.get("held"), content.get("dropped")
        held = held if isinstance(held, int) and held >= 0 else 0
        dropped = dropped if isinstance(dropped, int) and dropped >= 0 else None
        # Let go after it was sent and before it was acknowledged: lost if it was not
        # durable here, which cannot be told apart (an upper bound, never an understatement).
        evicted = content.get("evicted")
        if isinstance(evicted, int) and evicted > 0 and dropped is not None:
            dropped += evicted
        self.holds_output = True
        if content.get("acks") is True:
            self.acknowledges = True
        reason, self._restart_gap = self._restart_gap, None
        self._known_ids = []
        if reason is not None or held:
            self.log.info(
                "Kernel %s publishes again %d IOPub messages (%s of them sent before and "
                "not acknowledged, the rest held while unwatched; %s dropped; the last "
                "acknowledged: %s)",
                self.kernel_id,
                held,
                content.get("sent"),
                "none" if dropped == 0 else dropped,
                content.get("acked"),
            )
        if dropped != 0:
            self.record_gap(reason or "kernel_hold_full", dropped)

    def _record(self, message: KernelMessage) -> Record:
        self.received += 1
        self._last = message
        self.context.counts.add(message)
        message = self.policy.screen(message)
        record = self.sequencer.assign(message, time.time())
        self.store.append(record)
        if not self.committed_only:
            self._feed.head = record.seq
            self.broker.publish(record)
            self._published(record)
        return record

    def written(self, records: list[Record]) -> None:
        """The store wrote ``records`` of this kernel, in order (a committed-only store):
        they are the history now, and are published, each once. A follower ignores them
        (what this node wrote before it lost the lease comes off the record bus)."""
        if self.ownership.follows:
            return
        for record in self._feed.written(records):
            self.broker.publish(record)
            self._published(record)
        if self._when_published and self._feed.head >= self.sequencer.head:
            self._run_when_published()

    @property
    def published_head(self) -> int:
        """The last seq published to this node's clients (0: none)."""
        return self._feed.head

    def when_published(self, callback: Callable[[], None], timeout: float) -> None:
        """Call ``callback`` once every record numbered so far is published: at once with
        a store that is not committed-only, else once the store wrote them, or after
        ``timeout`` seconds (Redis away: the clients end with what they got)."""
        if self._feed.head >= self.sequencer.head:
            callback()
            return
        self._when_published.append(callback)
        if self._publish_deadline is None:
            loop = asyncio.get_running_loop()
            self._publish_deadline = loop.call_later(timeout, self._run_when_published)

    def _run_when_published(self) -> None:
        if self._publish_deadline is not None:
            self._publish_deadline.cancel()
            self._publish_deadline = None
        callbacks, self._when_published = self._when_published, []
        for callback in callbacks:
            callback()

    def _published(self, record: Record) -> None:
        """What follows every record fanned out here: jupyter_server's activity (see
        :mod:`.activity`), and the record observers."""
        self.activity.saw(record.message)
        for observer in self.context.observers:
            try:
                observer(record)
            except Exception:  # an adapter's edge: one observer's bug is only logged
                self.log.exception("A record observer failed on %s", self.kernel_id)

    def record_mark(self, execution_state: str, reason: str) -> None:
        """Record a lifecycle status the kernel cannot send itself (``restarting``,
        ``dead``), after whatever IOPub already holds: see :mod:`.core.marks`."""
        if self.ownership.follows:
            return
        self._drain()
        epoch = None
        if execution_state == "restarting":
            self.epoch += 1
            epoch = self.epoch
        message = lifecycle_status(
            execution_state,
            reason,
            msg_id=str(uuid.uuid4()),
            date=now_iso(),
            session=self._kernel_session(),
            epoch=epoch,
        )
        self._record(message)

    def _kernel_session(self) -> str:
        """The session of the kernel's last message (the life a mark closes), else the
        Tap's own. Marks carry it too (a mark from the store may carry none)."""
        last = self._last
        if last is not None and last is not self._session_read_from:
            self._session_read_from = last
            with contextlib.suppress(Exception):
                session = last.header().get("session")
                if isinstance(session, str) and session:
                    self._known_session = session
        return self._known_session or self.session_id

    def _drain(self) -> None:
        """Record whatever IOPub messages have already arrived."""
        self.source.drain()

    def reconnect(self) -> None:
        """After a restart: resubscribe (the ports may have changed) and nudge again."""
        if not self.ownership.records:
            return
        self._connected_at = time.monotonic()
        self.source.drain()
        if self.ready.done():
            self.ready = asyncio.get_running_loop().create_future()
        self.source.reconnect()

    def _on_auto_restart(self) -> None:
        """jupyter_client's restarter found the kernel dead and restarts it now: one mark,
        with why it died. The restart it then asks of the kernel manager announces itself
        as any restart does (our kernel manager's hook, jupyter_server's ``restart``
        event): that is not a second restart, nor one a client asked for."""
        self._auto_restart = True
        reason = death_reason(self.kernel_manager)
        deaths = self.context.deaths
        deaths[reason] = deaths.get(reason, 0) + 1
        self.record_mark("restarting", reason)
        self.reconnect()
        self.context.restarted(self.kernel_id)

    def _on_dead(self) -> None:
        self._auto_restart = False
        self.record_mark("dead", "restart_failed")

    def _on_lifecycle_request(self, what: str) -> None:
        """Our kernel manager says a restart or a shutdown was asked for (the kernel is
        still there: what it does now comes after this note)."""
        if not self.ownership.records or (self._auto_restart and what == "restart_requested"):
            return
        self._drain()
        event = f"{what}_requested" if what in ("shutdown", "detach") else what
        self._record(
            lifecycle_request(
                event,
                what,
                msg_id=str(uuid.uuid4()),
                date=now_iso(),
                session=self._kernel_session(),
            )
        )

    def restarted(self) -> None:
        """A restart has completed: the old kernel is gone. One asked for through the API
        is marked here; the restarter's was marked when it began (its ports may have
        moved since: subscribe again all the same)."""
        if not self.ownership.records:
            return
        if self._auto_restart:
            self._auto_restart = False
        else:
            self.record_mark("restarting", "restart_requested")
        self.reconnect()

    def stop(self) -> None:
        """Stop reading, keeping the kernel's state (the gateway itself is shutting down)."""
        self._carry_out(self.ownership.handle(Event.STOPPED))

    def deliver(self, record: Record) -> None:
        """A follower: ``record``, numbered by the kernel's owner, came off the record bus.
        Fanned out here as the owner fans out its own; one already had is ignored."""
        if not self.ownership.follows or record.seq <= self.sequencer.head:
            return
        self.sequencer.head = self._feed.head = record.seq
        self.received += 1
        self._last = record.message
        if not is_mark(record.message):
            self._recent.add(record.message.msg_id.encode())
        self.broker.publish(record)
        self._published(record)

    def promote(self) -> None:
        """A follower becomes the kernel's recorder (its owner died and this node took the
        lease): it numbers on from the last record it delivered (the takeover's gap record)
        and reads the kernel's IOPub itself."""
        self._carry_out(self.ownership.handle(Event.LEASE_TAKEN))

    async def release(self, quiet: float, timeout: float) -> bool:
        """Stop recording for a graceful hand-over to another node: the kernel is told to
        hold its output, and what it sent before that is recorded. True if nothing it
        publishes from here on can have been lost (it holds, and went quiet in time)."""
        if not self.ownership.records:
            return False
        release = getattr(self.source, "release", None)
        clean = False
        if release is not None and self.holds_output:
            clean = bool(await release(quiet, timeout))
        self._carry_out(self.ownership.handle(Event.RELEASED))
        return clean

    def demote(self) -> None:
        """This node lost the kernel's lease (another node took it over, or it could not
        renew it in time): stop reading the kernel's IOPub; the records come from the bus
        again, from the last one published here (what this node numbered and did not
        write is not the history: another node may give those numbers to other output).

        Nor are their messages known any more: a kernel of the gateway's launcher holds
        what was not acknowledged and publishes it again to whoever reads it next, this
        node too when it takes the kernel back, which then records it (once, as numbers of
        its own) instead of passing it over as a message it had."""
        durable = self.store.durable_head(self.kernel_id)
        self._recent.forget(
            msg_id.encode() for seq, msg_id in self._unacknowledged if seq > durable
        )
        self._carry_out(self.ownership.handle(Event.LEASE_LOST))
        if self.committed_only:
            self.sequencer.head = self._feed.head

    def close(self, reason: str | None = None) -> None:
        """Stop tapping: the kernel shut down (or was detached: it runs on, without the
        gateway; or is gone, ``reason`` says why). Records that it did (a ``dead`` status,
        reason ``shutdown``, ``detached`` or ``reason``: executions still running end
        ``died``). A follower records nothing: the owner did."""
        self._carry_out(self.ownership.handle(Event.CLOSED), reason)

    def _carry_out(self, actions: tuple[Action, ...], reason: str | None = None) -> None:
        """Do what a change of role asks for (see :data:`..core.ownership.TRANSITIONS`), in
        order; ``reason`` is the kernel's end's, for :attr:`Action.RECORD_END`."""
        for action in actions:
            if action is Action.START_READING:
                self.source = self.link.iopub(self)
                self._connected_at = time.monotonic()
                self._start_recording()
            elif action is Action.RECORD_END:
                self._record_end(reason)
            elif action is Action.STOP_READING:
                self.source.stop()
                if self._ack_timer is not None:
                    self._ack_timer.cancel()
                    self._ack_timer = None
                self.acknowledges = False
                self._unacknowledged.clear()
            elif action is Action.UNHOOK:
                self._unhook()
            elif action is Action.FOLLOW:
                self.source = _FOLLOWED
            elif action is Action.END_TRANSCRIPT:
                self.store.kernel_ended(self.kernel_id, time.time())
            elif action is Action.SETTLE:
                if not self.ready.done():
                    self.ready.set_result(None)
            elif action is Action.CLOSE_FANOUT:
                # After the kernel's last records (its end), once they are written.
                self.when_published(
                    lambda: self.broker.close_kernel(self.kernel_id), PUBLISH_TIMEOUT
                )

    def _record_end(self, reason: str | None) -> None:
        """What arrived, a gap if the kernel never spoke again after a restart of the
        gateway, then its ``dead`` status with ``reason`` (or how it left)."""
        self._drain()
        if self._restart_gap is not None:  # it never spoke again: what it printed is lost
            # (its reason is the dead mark's too, as it has always been)
            reason, self._restart_gap = self._restart_gap, None
            self._known_ids = []
            self.record_gap(reason, None)
        leaving = getattr(self.kernel_manager, "leaving", "shutdown")
        self.record_mark("dead", reason or ("detached" if leaving == "detach" else "shutdown"))

    def _unhook(self) -> None:
        for callback, event in ((self._on_auto_restart, "restart"), (self._on_dead, "dead")):
            with contextlib.suppress(ValueError):
                self.kernel_manager.remove_restart_callback(callback, event)
        hooks = getattr(self.kernel_manager, "lifecycle_hooks", [])
        with contextlib.suppress(ValueError):
            hooks.remove(self._on_lifecycle_request)
