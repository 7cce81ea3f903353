"""The Tap: the gateway's one reader of each kernel's IOPub channel.

One :class:`KernelTap` per kernel lives from kernel start to shutdown, owned by the
gateway and independent of clients, so output is recorded with nobody watching. For each
message it receives it assigns the next sequence number, appends the record to the
transcript store and publishes it to the broker (DESIGN invariants 1, 2 and 4).

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

:class:`TapManager` keeps one Tap per kernel of the server's kernel manager, following
jupyter_server's ``kernel_actions`` events and reconciling periodically.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
import uuid
from collections.abc import Callable
from typing import Any

from jupyter_server._tz import utcnow
from jupyter_server.gateway.gateway_client import GatewayClient
from jupyter_server.gateway.managers import GatewayKernelManager
from tornado.ioloop import PeriodicCallback
from traitlets import Float, Int
from traitlets.config import LoggingConfigurable

from .broker.base import Broker
from .core.errors import MalformedMessage, UnknownKernel
from .core.guards import withhold_traceback
from .core.health import ComponentHealth, State
from .core.marks import (
    SPOOL_MSG_TYPE,
    gap_message,
    lifecycle_request,
    lifecycle_status,
    request_mark,
)
from .core.messages import KernelMessage, Record, Signer, unstored_placeholder
from .core.oversize import cut_message
from .core.sequencer import Sequencer
from .kernels.base import IOPubSource, KernelLink
from .kernels.upstream import UpstreamKernelLink, UpstreamSettings
from .kernels.zmq_kernel import HeartbeatSettings, IOPubSettings, KernelSockets
from .stores.base import TranscriptStore

__all__ = ["KERNEL_ACTIONS_SCHEMA", "KernelTap", "TapManager"]

KERNEL_ACTIONS_SCHEMA = "https://events.jupyter.org/jupyter_server/kernel_actions/v1"

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


#: Seconds a Tap may wait for its kernel's first IOPub message (a kernel starting) before
#: the gateway's health calls the kernel not ready.
STARTING_GRACE = 10.0


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


class KernelTap:
    """Records one kernel's IOPub for the gateway: the kernel's :class:`IOPubSink`.
    Created and driven by :class:`TapManager`; reads nothing itself (its source does)."""

    def __init__(
        self,
        kernel_id: str,
        kernel_manager: Any,
        link: KernelLink,
        store: TranscriptStore,
        broker: Broker,
        manager: TapManager,
        *,
        following: bool = False,
    ) -> None:
        self.kernel_id = kernel_id
        self.kernel_manager = kernel_manager
        self.link = link
        self.store = store
        self.broker = broker
        self.manager = manager
        self.log = manager.log
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
        #: The reason of the gap to record before the kernel's next message, if it does
        #: not say that it held its output (re-attached after a restart of the gateway).
        self._restart_gap: str | None = None
        self._known_session = ""
        self._session_read_from: KernelMessage | None = None
        self._last: KernelMessage | None = None
        self._active = False
        #: Another node records this kernel (see :mod:`.cluster`): its records come from
        #: the record bus (:meth:`deliver`), and this Tap records nothing itself.
        self.following = following
        #: The kernel said it holds its output while nobody listens (the gateway's
        #: launcher): a graceful hand-over to another node loses nothing.
        self.holds_output = False
        self.source: IOPubSource = _FOLLOWED if following else link.iopub(self)
        self._closed = False
        self._connected_at = time.monotonic()

    @property
    def head(self) -> int:
        return self.sequencer.head

    @property
    def closed(self) -> bool:
        """True once the Tap stopped (its kernel shut down, or the gateway is stopping)."""
        return self._closed

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
        marks = await self.store.marks(self.kernel_id, 0)
        self.epoch = sum(1 for mark in marks if mark.message.execution_state == "restarting")
        self.broker.open_kernel(self.kernel_id, self.sequencer.head)
        if self.following:
            self.ready.set_result(None)
            return
        self._start_recording()

    def _start_recording(self) -> None:
        self.store.kernel_started(self.kernel_id, time.time())
        # Re-attached after the gateway's restart: the kernel printed unseen meanwhile. A
        # kernel of the gateway's launcher held that output and says so first (its spool
        # notice); for any other, the first message it sends comes after a gap.
        self._restart_gap = self.manager.pending_gaps.pop(self.kernel_id, None)
        self._connected_at = time.monotonic()
        self.source.start()
        self.kernel_manager.add_restart_callback(self._on_auto_restart, "restart")
        self.kernel_manager.add_restart_callback(self._on_dead, "dead")
        hooks = getattr(self.kernel_manager, "lifecycle_hooks", None)
        if hooks is not None:  # our kernel manager says when a restart or shutdown begins
            hooks.append(self._on_lifecycle_request)

    def late(self) -> bool:
        """True if the Tap has waited for its kernel's first IOPub message for longer than a
        kernel takes to start."""
        return time.monotonic() - self._connected_at > STARTING_GRACE

    def batch_received(self) -> None:
        if not self.ready.done():
            self.ready.set_result(None)
            self.manager.retire_activity_watcher(self.kernel_id)
        if self._active:
            # Once per batch: last_activity is a trait, and setting one is not free.
            multi = self.manager.kernel_manager
            multi.last_kernel_activity = self.kernel_manager.last_activity = utcnow()
        self._active = False

    def link_changed(self, reachable: bool, reason: str, lost: int | None) -> None:
        """The kernel stopped answering, or answers again: recorded as a mark every reader
        sees; output the source may have missed meanwhile is a gap record."""
        if self._closed or self.following:
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
        if self._closed or self.following:
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
        if self.following:
            return
        if message.msg_type == SPOOL_MSG_TYPE:
            self._spool_notice(message)
            return
        if self._restart_gap is not None and message.msg_type != "iopub_welcome":
            reason, self._restart_gap = self._restart_gap, None
            self.record_gap(reason, None)
        limit = self.manager.max_message_bytes
        if limit and message.size > limit:
            # A source that decodes before it hands over (an upstream gateway's WebSocket)
            # held it once already; what the Tap records and fans out is cut all the same.
            self.cut += 1
            try:
                message = cut_message(
                    message.parts(),
                    max_message_bytes=limit,
                    keep_bytes=self.manager.cut_keep_bytes,
                )
            except MalformedMessage:  # a header over 64 KiB: only its slot is kept
                message = unstored_placeholder(message, "max_message_bytes", date=now_iso())
        self._record(message)

    def _spool_notice(self, message: KernelMessage) -> None:
        """The kernel held its IOPub while nobody listened and publishes it now: what it
        had to drop is a gap of that size; nothing dropped, no gap."""
        content = message.content()
        held, dropped = content.get("held"), content.get("dropped")
        held = held if isinstance(held, int) and held >= 0 else 0
        dropped = dropped if isinstance(dropped, int) and dropped >= 0 else None
        self.holds_output = True
        reason, self._restart_gap = self._restart_gap, None
        if reason is not None or held:
            self.log.info(
                "Kernel %s held %d IOPub messages while unwatched (%s dropped)",
                self.kernel_id,
                held,
                "none" if dropped == 0 else dropped,
            )
        if dropped != 0:
            self.record_gap(reason or "kernel_hold_full", dropped)

    def _record(self, message: KernelMessage) -> None:
        self.received += 1
        self._last = message
        manager = self.manager
        counts = manager.by_type.get(message.msg_type) or manager.counts_of(message.msg_type)
        counts[0] += 1
        counts[1] += message.size
        if not manager.tracebacks_allowed:
            message = withhold_traceback(message, manager.traceback_replacement)
        record = self.sequencer.assign(message, time.time())
        self.store.append(record)
        self.broker.publish(record)
        self._track_activity(message)
        for observer in manager.observers:
            try:
                observer(record)
            except Exception:  # an adapter's edge: one observer's bug is only logged
                self.log.exception("A record observer failed on %s", self.kernel_id)

    def _track_activity(self, message: KernelMessage) -> None:
        """What jupyter_server's activity watcher does (``last_activity`` for culling and
        the kernels API, ``execution_state`` from status), without a second IOPub socket
        and a full deserialize of every message. ``last_activity`` is set once per batch."""
        multi = self.manager.kernel_manager
        kernel = self.kernel_manager
        tracked = multi.track_message_type(message.parent_msg_type)
        if not self._active:
            busy = kernel.execution_state == "busy"
            self._active = tracked or busy or multi.track_message_type(message.msg_type)
        state = message.execution_state
        if state is not None:
            if tracked:
                kernel.execution_state = state
            elif kernel.execution_state == "starting" and state != "starting":
                kernel.execution_state = "idle"

    def record_mark(self, execution_state: str, reason: str) -> None:
        """Record a lifecycle status the kernel cannot send itself (``restarting``,
        ``dead``), after whatever IOPub already holds: see :mod:`.core.marks`."""
        if self.following:
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
        if self._closed or self.following:
            return
        self._connected_at = time.monotonic()
        self.source.drain()
        if self.ready.done():
            self.ready = asyncio.get_running_loop().create_future()
        self.source.reconnect()

    def _on_auto_restart(self) -> None:
        self.record_mark("restarting", "kernel_died")
        self.reconnect()
        self.manager.remember(self.kernel_id)

    def _on_dead(self) -> None:
        self.record_mark("dead", "restart_failed")

    def _on_lifecycle_request(self, what: str) -> None:
        """Our kernel manager says a restart or a shutdown was asked for (the kernel is
        still there: what it does now comes after this note)."""
        if self._closed or self.following:
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
        """A restart asked for through the API has completed: the old kernel is gone."""
        if self._closed or self.following:
            return
        self.record_mark("restarting", "restart_requested")
        self.reconnect()

    def stop(self) -> None:
        """Stop reading, keeping the kernel's state (the gateway itself is shutting down)."""
        self._closed = True
        self.source.stop()

    def deliver(self, record: Record) -> None:
        """A follower: ``record``, numbered by the kernel's owner, came off the record bus.
        Fanned out here as the owner fans out its own; one already had is ignored."""
        if not self.following or self._closed or record.seq <= self.sequencer.head:
            return
        self.sequencer.head = record.seq
        self.received += 1
        self._last = record.message
        self.broker.publish(record)
        self._track_activity(record.message)
        for observer in self.manager.observers:
            try:
                observer(record)
            except Exception:  # an adapter's edge: one observer's bug is only logged
                self.log.exception("A record observer failed on %s", self.kernel_id)

    def promote(self) -> None:
        """A follower becomes the kernel's recorder (its owner died and this node took the
        lease): it numbers on from the last record it delivered (the takeover's gap record)
        and reads the kernel's IOPub itself."""
        if not self.following or self._closed:
            return
        self.following = False
        self.source = self.link.iopub(self)
        self._connected_at = time.monotonic()
        self._start_recording()

    async def release(self, quiet: float, timeout: float) -> bool:
        """Stop recording for a graceful hand-over to another node: the kernel is told to
        hold its output, and what it sent before that is recorded. True if nothing it
        publishes from here on can have been lost (it holds, and went quiet in time)."""
        if self.following or self._closed:
            return False
        release = getattr(self.source, "release", None)
        clean = False
        if release is not None and self.holds_output:
            clean = bool(await release(quiet, timeout))
        self.stop()
        self._unhook()
        return clean

    def demote(self) -> None:
        """This node lost the kernel's lease (another node took it over): stop reading the
        kernel's IOPub; the records come from the bus again."""
        if self.following or self._closed:
            return
        self.source.stop()
        self._unhook()
        self.following = True
        self.source = _FOLLOWED

    def close(self, reason: str | None = None) -> None:
        """Stop tapping: the kernel shut down (or was detached: it runs on, without the
        gateway; or is gone, ``reason`` says why). Records that it did (a ``dead`` status,
        reason ``shutdown``, ``detached`` or ``reason``: executions still running end
        ``died``). A follower records nothing: the owner did."""
        if self._closed:
            return
        if self.following:
            self._closed = True
            if not self.ready.done():
                self.ready.set_result(None)
            self.broker.close_kernel(self.kernel_id)
            return
        self._drain()
        if self._restart_gap is not None:  # it never spoke again: what it printed is lost
            reason, self._restart_gap = self._restart_gap, None
            self.record_gap(reason, None)
        leaving = getattr(self.kernel_manager, "leaving", "shutdown")
        self.record_mark("dead", reason or ("detached" if leaving == "detach" else "shutdown"))
        self._closed = True
        self.source.stop()
        self._unhook()
        if not self.ready.done():
            self.ready.set_result(None)
        self.store.kernel_ended(self.kernel_id, time.time())
        self.broker.close_kernel(self.kernel_id)

    def _unhook(self) -> None:
        for callback, event in ((self._on_auto_restart, "restart"), (self._on_dead, "dead")):
            with contextlib.suppress(ValueError):
                self.kernel_manager.remove_restart_callback(callback, event)
        hooks = getattr(self.kernel_manager, "lifecycle_hooks", [])
        with contextlib.suppress(ValueError):
            hooks.remove(self._on_lifecycle_request)


class _Followed:
    """The IOPub source of a follower: none (its records come off the record bus)."""

    rejected = replays = invalid = 0
    reachable = True

    def start(self) -> None:
        pass

    def reconnect(self) -> None:
        pass

    def drain(self) -> None:
        pass

    def stop(self) -> None:
        pass


_FOLLOWED: Any = _Followed()


def describe_link(kernel: Any) -> dict[str, Any] | None:
    """What the store keeps to re-attach ``kernel`` (a kernel manager) after a restart of
    the gateway; None for a kernel that cannot be re-attached by connection info."""
    attachment = getattr(kernel, "attachment", None)
    if attachment is not None:
        return {"kernel_name": kernel.kernel_name, "attachment": attachment.to_json()}
    try:
        info = dict(kernel.get_connection_info())
    except Exception:  # a kernel manager of another kind: nothing to re-attach by
        return None
    if not all(isinstance(info.get(f"{c}_port"), int) and info.get(f"{c}_port") for c in _PORTS):
        return None
    key = info.get("key", b"")
    info["key"] = key.decode() if isinstance(key, bytes) else str(key)
    spec = getattr(kernel, "kernel_spec", None)
    provisioner = getattr(kernel, "provisioner", None)
    pid = getattr(provisioner, "pid", None)
    network = getattr(provisioner, "network", None)  # netns-provisioner's KernelNetwork
    return {
        "kernel_name": kernel.kernel_name,
        "attachment": {
            "connection_info": {k: info[k] for k in _LINK_FIELDS if k in info},
            "display_name": getattr(spec, "display_name", "") or kernel.kernel_name,
            "language": getattr(spec, "language", "") or "",
            "owned": True,
            "pid": pid if isinstance(pid, int) else None,
            "source": "recovered",
            "network": None if network is None else network.as_dict(),
        },
    }


_PORTS = ("shell", "iopub", "stdin", "control", "hb")
_LINK_FIELDS = ("ip", "transport", "key", "signature_scheme", *(f"{c}_port" for c in _PORTS))


class TapManager(LoggingConfigurable):
    """Keeps exactly one Tap per kernel that the server's kernel manager runs."""

    nudge_interval = Float(
        0.25,
        config=True,
        help="Seconds between kernel_info_requests while a Tap waits for its first IOPub message.",
    )
    ready_timeout = Float(
        60.0,
        config=True,
        help="Seconds a Tap waits for its first IOPub message before it reports ready anyway.",
    )
    iopub_receive_buffer = Int(
        4 * 1024 * 1024,
        config=True,
        help="SO_RCVBUF, in bytes, of each Tap's IOPub socket: the burst the kernel can send "
        "while the gateway is briefly busy before the kernel's PUB socket starts dropping "
        "(the OS caps it at net.core.rmem_max). 0 leaves it to TCP autotuning.",
    )
    iopub_receive_hwm = Int(
        20000,
        config=True,
        help="Messages each Tap's IOPub socket queues in the gateway before it stops reading "
        "from the kernel (0: no bound). A kernel started through kernel_gateway_stream's "
        "launcher then holds the rest itself (its IOPub never drops); other kernels' IOPub "
        "sockets drop past their own high-water mark (1000 by default), as they would with "
        "jupyter_server.",
    )
    max_message_bytes = Int(
        8 * 1024 * 1024,
        config=True,
        help="Largest IOPub message a Tap records whole, in bytes (its parts and buffers "
        "together; 0: no limit). A larger one is recorded cut, in its place: a stream keeps "
        "the first cut_keep_bytes of its text, a display a note in place of its data, and its "
        "content says so in 'truncated': {'original_bytes', 'max_message_bytes'}. Code in a "
        "kernel is untrusted: without a limit one print can make the gateway hold gigabytes.",
    )
    cut_keep_bytes = Int(
        64 * 1024,
        config=True,
        help="Bytes of text a stream message over max_message_bytes keeps (its first ones).",
    )
    iopub_backlog_bytes = Int(
        64 * 1024 * 1024,
        config=True,
        help="Most bytes of IOPub messages each Tap has read from its kernel and not yet "
        "recorded (0: no bound). The Tap reads its socket eagerly into this backlog (ZMQ "
        "bounds its own queue in messages only: 20,000 messages of 8 MiB would be 160 GiB); "
        "what arrives while it is full is not kept, and one gap record (reason "
        "iopub_backlog_full) says how many messages were lost there. Holding "
        "iopub_receive_hwm messages, the Tap stops reading instead. Messages of 4 KiB or "
        "less (statuses: an execution's idle) have a reserve of an eighth more; a message "
        "over max_message_bytes is cut as it is read and takes only what is kept of it.",
    )
    iopub_batch = Int(
        500,
        config=True,
        help="Most IOPub messages a Tap reads in one turn of the event loop.",
    )
    iopub_batch_bytes = Int(
        256 * 1024,
        config=True,
        help="Most IOPub bytes a Tap reads in one turn of the event loop (a client's queue "
        "can grow by this much before its writer runs; keep subscriber limits well above).",
    )
    replay_history = Int(
        16384,
        config=True,
        help="Signatures each Tap remembers to refuse a verbatim replay of a signed IOPub "
        "message (jupyter_client's Session keeps a digest history the same way).",
    )
    refusal_log_interval = Float(
        10.0,
        config=True,
        help="Seconds between two log lines about the invalid or replayed messages a kernel "
        "sends (each is counted; the health endpoint has the counts).",
    )
    heartbeat_interval = Float(
        3.0,
        config=True,
        help="Seconds between heartbeat pings to a kernel whose process the gateway does not "
        "watch (attached by connection info, or in a network of its own).",
    )
    heartbeat_timeout = Float(
        10.0,
        config=True,
        help="Seconds without a heartbeat echo after which such a kernel shows as unreachable "
        "(kernel status, transcript, health) until it answers again.",
    )
    upstream_retry_initial = Float(
        0.5,
        config=True,
        help="Seconds before the first attempt to reconnect to an upstream gateway's kernel "
        "WebSocket that dropped; each further attempt waits twice as long (with jitter), up "
        "to upstream_retry_max.",
    )
    upstream_retry_max = Float(
        30.0, config=True, help="Most seconds between two attempts to reconnect upstream."
    )
    upstream_kernel_gone_after = Float(
        30.0,
        config=True,
        help="Seconds an upstream gateway that answers must keep saying that a kernel does not "
        "exist (HTTP 404: a jupyter_server restarted, which keeps no kernels) before the "
        "kernel is recorded dead (reason upstream_kernel_gone; its executions end died) and "
        "leaves the kernel list. Meanwhile it shows as unreachable. The grace is for an "
        "upstream that re-attaches its kernels just after it starts answering.",
    )
    reconcile_interval = Float(
        5.0,
        config=True,
        help="Seconds between checks that every running kernel has a Tap and every Tap a kernel "
        "(catches kernels started or removed without an event, such as external kernels).",
    )

    def __init__(
        self,
        kernel_manager: Any,
        store: TranscriptStore,
        broker: Broker,
        sockets: KernelSockets,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.kernel_manager = kernel_manager
        self.store = store
        self.broker = broker
        self.sockets = sockets
        #: Called for every record (see :data:`RecordObserver`).
        self.observers: list[RecordObserver] = []
        # jupyter_server's policy for tracebacks, applied before anything is recorded.
        self.tracebacks_allowed: bool = getattr(kernel_manager, "allow_tracebacks", True)
        self.traceback_replacement: str = getattr(
            kernel_manager, "traceback_replacement_message", "An exception occurred."
        )
        self.taps: dict[str, KernelTap] = {}
        #: ``[messages, bytes]`` recorded, by msg_type (for metrics): the types of the
        #: messaging spec and the gateway's own, every other under ``other`` (a kernel
        #: chooses its msg_types, and must not grow this without bound).
        self.by_type: dict[str, list[int]] = {"other": [0, 0]}
        self._starting: dict[str, asyncio.Future[KernelTap]] = {}
        #: A gap to record first when a kernel's Tap starts, by kernel id (a kernel
        #: re-attached after a restart of the gateway printed unseen meanwhile).
        self.pending_gaps: dict[str, str] = {}
        self._on_close: list[Any] = []
        self._reconciler: PeriodicCallback | None = None
        #: With several nodes (:mod:`.cluster`): who records which kernel. None: this node
        #: records every kernel it runs.
        self.cluster: Any = None

    def counts_of(self, msg_type: str) -> list[int]:
        """The ``[messages, bytes]`` counters for ``msg_type`` (see :attr:`by_type`)."""
        if msg_type not in COUNTED_MSG_TYPES:
            return self.by_type["other"]
        return self.by_type.setdefault(msg_type, [0, 0])

    def start(self) -> None:
        """Begin reconciling. Called by the application once the loop runs."""
        self._reconciler = PeriodicCallback(self.reconcile, self.reconcile_interval * 1000)
        self._reconciler.start()

    def on_close(self, callback: Callable[[str, int], Any]) -> None:
        """Register ``callback(kernel_id, head)``, called when a Tap closes (its kernel shut
        down), with the last sequence number it gave."""
        self._on_close.append(callback)

    async def ensure(self, kernel_id: str) -> KernelTap:
        """The Tap of a running kernel, started if need be (not necessarily ready yet).

        Raises:
            UnknownKernel: the kernel manager does not run ``kernel_id``.
        """
        tap = self.taps.get(kernel_id)
        if tap is not None:
            return tap
        starting = self._starting.get(kernel_id)
        if starting is not None:
            return await asyncio.shield(starting)
        if kernel_id not in self.kernel_manager:
            raise UnknownKernel(kernel_id)
        future: asyncio.Future[KernelTap] = asyncio.get_running_loop().create_future()
        self._starting[kernel_id] = future
        try:
            kernel = self.kernel_manager.get_kernel(kernel_id)
            # With several nodes, only the node holding the kernel's lease records it.
            owner = self.cluster is None or await self.cluster.claim(kernel_id)
            link = self.link_for(kernel_id, kernel)
            tap = KernelTap(
                kernel_id, kernel, link, self.store, self.broker, self, following=not owner
            )
            await tap.start()
            if not owner:
                self.cluster.follow(tap)
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # retrieved: waiters re-raise it themselves
            raise
        finally:
            del self._starting[kernel_id]
        self.taps[kernel_id] = tap
        self.remember(kernel_id)
        future.set_result(tap)
        if tap.following:
            self.log.info("Following kernel %s from seq %s", kernel_id, tap.head + 1)
        else:
            self.log.info("Tapping kernel %s from seq %s", kernel_id, tap.head + 1)
        return tap

    def link_for(self, kernel_id: str, kernel: Any) -> KernelLink:
        """How to reach ``kernel`` (a kernel manager): a WebSocket for a kernel behind an
        upstream gateway, else ZMQ sockets from its connection info, with a
        heartbeat when the gateway cannot watch the kernel's process
        (``kernel.watch_heartbeat``)."""
        if isinstance(kernel, GatewayKernelManager):
            settings = UpstreamSettings(
                self.upstream_retry_initial,
                self.upstream_retry_max,
                gone_after=self.upstream_kernel_gone_after,
            )
            return UpstreamKernelLink(
                kernel_id,
                GatewayClient.instance(),
                settings,
                self.log,
                on_gone=lambda reason: self.kernel_gone(kernel_id, reason),
            )
        session = kernel.session
        zmq_link = self.sockets.link(
            kernel_id,
            kernel.get_connection_info,
            key=session.key,
            signature_scheme=session.signature_scheme,
            log=self.log,
        )
        zmq_link.settings = IOPubSettings(
            receive_hwm=self.iopub_receive_hwm,
            receive_buffer=self.iopub_receive_buffer,
            batch=self.iopub_batch,
            batch_bytes=self.iopub_batch_bytes,
            nudge_interval=self.nudge_interval,
            ready_timeout=self.ready_timeout,
            replay_history=self.replay_history,
            refusal_log_interval=self.refusal_log_interval,
            max_message_bytes=self.max_message_bytes,
            cut_keep_bytes=self.cut_keep_bytes,
            backlog_bytes=self.iopub_backlog_bytes,
        )
        if getattr(kernel, "watch_heartbeat", False):
            zmq_link.heartbeat = HeartbeatSettings(self.heartbeat_interval, self.heartbeat_timeout)
        return zmq_link

    def retire_activity_watcher(self, kernel_id: str) -> None:
        """Close jupyter_server's own IOPub activity watcher for a tapped kernel.

        jupyter_server opens a second IOPub socket per kernel and deserializes every message
        on it to keep ``last_activity`` and ``execution_state``; the Tap already does that
        (:meth:`KernelTap._track_activity`). Its ``stop_watching_activity`` would also run a
        pending restart's cleanup, so only the socket is closed here.
        """
        if not hasattr(self.kernel_manager, "track_message_type"):
            return
        try:
            kernel = self.kernel_manager.get_kernel(kernel_id)
        except KeyError:
            return
        stream = getattr(kernel, "_activity_stream", None)
        if stream is not None:
            if not stream.closed():
                stream.close()
            kernel._activity_stream = None

    def remember(self, kernel_id: str) -> None:
        """Keep, in the store, how to reach the kernel again after a restart of the
        gateway (its connection info: a restart of the kernel may move its ports)."""
        tap = self.taps.get(kernel_id)
        if tap is None or tap.following:
            return
        link = describe_link(tap.kernel_manager)
        if link is not None:
            self.store.save_link(kernel_id, link)

    def close_tap(self, kernel_id: str, reason: str | None = None) -> None:
        tap = self.taps.pop(kernel_id, None)
        if tap is None:
            return
        if not tap.following:
            self.store.save_link(kernel_id, None)
        tap.close(reason)
        self.log.info("Stopped tapping kernel %s at seq %s", kernel_id, tap.head)
        for callback in self._on_close:
            callback(kernel_id, tap.head)

    def kernel_gone(self, kernel_id: str, reason: str) -> None:
        """The kernel no longer exists where it ran (its upstream gateway restarted without
        it): what it printed since it was last heard is a gap of unknown size, it is
        recorded ``dead`` with ``reason`` (its executions end ``died``), and it leaves the
        kernel manager, as a kernel that was shut down."""
        tap = self.taps.get(kernel_id)
        if tap is not None and not tap.closed:
            tap.record_gap(reason, None)
        with contextlib.suppress(KeyError):
            self.kernel_manager.remove_kernel(kernel_id)
        self.close_tap(kernel_id, reason)
        self.log.warning("Kernel %s is gone (%s): removed", kernel_id, reason)

    async def on_kernel_action(self, logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        """jupyter_events listener for jupyter_server's kernel_actions events."""
        kernel_id = data.get("kernel_id")
        if data.get("status") != "success" or not kernel_id:
            return
        action = data.get("action")
        if action == "start":
            await self._ensure_logged(kernel_id)
        elif action == "shutdown":
            self.close_tap(kernel_id)
        elif action == "restart":
            tap = self.taps.get(kernel_id)
            if tap is not None:
                tap.restarted()
                self.remember(kernel_id)

    async def reconcile(self) -> None:
        running = set(self.kernel_manager.list_kernel_ids())
        for kernel_id, tap in list(self.taps.items()):
            if kernel_id not in running:
                self.close_tap(kernel_id)
            elif tap.ready.done():
                # jupyter_server restarts its watcher after a restart that moved ports.
                self.retire_activity_watcher(kernel_id)
        for kernel_id in running - set(self.taps):
            await self._ensure_logged(kernel_id)

    async def _ensure_logged(self, kernel_id: str) -> None:
        try:
            await self.ensure(kernel_id)
        except UnknownKernel:
            pass
        except Exception:  # an adapter's outermost loop: log and carry on
            self.log.exception("Could not tap kernel %s", kernel_id)

    def close(self) -> None:
        """Stop every Tap, keeping the kernels' state (the gateway is stopping)."""
        if self._reconciler is not None:
            self._reconciler.stop()
        for kernel_id in list(self.taps):
            self.taps.pop(kernel_id).stop()

    def health(self) -> ComponentHealth:
        taps = list(self.taps.values())
        waiting = [tap.kernel_id for tap in taps if not tap.ready.done()]
        details = {
            "kernels": len(taps),
            "not_ready": waiting,
            "messages": sum(tap.received for tap in taps),
            "refused_invalid": sum(tap.rejected for tap in taps),
            "replays_refused": sum(tap.replays for tap in taps),
            "invalid_placeholders": sum(tap.invalid for tap in taps),
            "messages_cut": sum(tap.cut + getattr(tap.source, "cut", 0) for tap in taps),
            "backlog_dropped": sum(getattr(tap.source, "dropped", 0) for tap in taps),
        }
        # A kernel takes a second or so to answer at start (or after a restart): that is
        # starting, not a fault. One that does not answer for STARTING_GRACE seconds is.
        late = [tap.kernel_id for tap in taps if tap.kernel_id in waiting and tap.late()]
        unreachable = [tap.kernel_id for tap in taps if not tap.reachable]
        if unreachable:
            details["unreachable"] = unreachable
            return ComponentHealth("taps", State.DEGRADED, "kernel_unreachable", details)
        if late:
            details["not_answering"] = late
            return ComponentHealth("taps", State.DEGRADED, "kernel_not_ready", details)
        return ComponentHealth("taps", State.OK, None, details)
