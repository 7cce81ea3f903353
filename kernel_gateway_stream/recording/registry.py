"""The registry: one recorder per kernel that the server's kernel manager runs, following
jupyter_server's ``kernel_actions`` events and reconciling periodically. It makes each
recorder in the role its lease gives it (:mod:`..core.ownership`), with how to reach its
kernel (:mod:`..kernels.links`), and hands it a :class:`.recorder.RecordingContext`
instead of itself."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, Protocol

from tornado.ioloop import PeriodicCallback
from traitlets import Float, Int
from traitlets.config import LoggingConfigurable

from ..broker.base import Broker
from ..core.errors import UnknownKernel
from ..core.health import ComponentHealth, State
from ..core.messages import Record
from ..core.ownership import Role
from ..kernels.base import KernelLink, mark_start_failed
from ..kernels.links import LinkSettings, describe_link, link_for
from ..kernels.local import KERNEL_ACTIONS_SCHEMA
from ..kernels.upstream import UpstreamSettings
from ..kernels.zmq_kernel import HeartbeatSettings, IOPubSettings, KernelSockets
from ..stores.base import TranscriptStore
from .activity import ActivityBridge
from .recorder import (
    PUBLISH_TIMEOUT,
    KernelRecorder,
    MessageCounts,
    RecordingContext,
    RecordingPolicy,
    RecordObserver,
)

__all__ = ["KERNEL_ACTIONS_SCHEMA", "Leases", "RecorderRegistry"]


class Leases(Protocol):
    """What the registry asks of the cluster node, with several nodes (the cluster imports
    the registry, never the other way round)."""

    async def claim(self, kernel_id: str) -> bool:
        """Take (or keep) ``kernel_id``'s lease; False if another node records it."""

    def follow(self, recorder: KernelRecorder) -> None:
        """``recorder`` follows its kernel: feed it off the record bus from its head."""


class RecorderRegistry(LoggingConfigurable):
    """Keeps exactly one recorder (or follower) per kernel that the server's kernel manager runs."""

    #: Former names of this class whose configuration sections are still read, below its
    #: own (``c.TapManager.max_message_bytes`` in an operator's file configures it).
    former_names = ("TapManager",)

    @classmethod
    def section_names(cls) -> list[str]:
        """traitlets' section names, with :attr:`former_names` first: a value under the
        class's own name wins over one under a former name."""
        names = super().section_names()
        return [*cls.former_names, *names]

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
        help="Messages each Tap holds read from its kernel and not yet recorded before it "
        "stops reading (0: no bound; their bytes are bounded by iopub_backlog_bytes, and "
        "the IOPub socket itself queues only a few messages). A kernel started through "
        "kernel_gateway_stream's launcher then holds the rest itself (its IOPub never "
        "drops); other kernels' IOPub sockets drop past their own high-water mark (1000 by "
        "default), as they would with jupyter_server.",
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
        "iopub_receive_hwm messages, the Tap stops reading instead. Statuses of 4 KiB or "
        "less (an execution's idle) have a reserve of an eighth more, output none; a message "
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
        self.activity = ActivityBridge(kernel_manager)
        self.counts = MessageCounts()
        self.taps: dict[str, KernelRecorder] = {}
        self._starting: dict[str, asyncio.Future[KernelRecorder]] = {}
        #: A gap to record first when a kernel's Tap starts, by kernel id (a kernel
        #: re-attached after a restart of the gateway printed unseen meanwhile).
        self.pending_gaps: dict[str, str] = {}
        self._on_close: list[Any] = []
        self._on_lease_lost: list[Callable[[str, int], Any]] = []
        #: Recorders closed whose last records are not published yet (a committed-only
        #: store writes them first): kernel id -> recorder.
        self._closing: dict[str, KernelRecorder] = {}
        if store.committed_only:
            store.written = self._written
        self._reconciler: PeriodicCallback | None = None
        #: With several nodes (:mod:`..cluster`): who records which kernel. None: this node
        #: records every kernel it runs.
        self.cluster: Leases | None = None
        self.context = RecordingContext(
            log=self.log,
            policy=RecordingPolicy(
                max_message_bytes=self.max_message_bytes,
                cut_keep_bytes=self.cut_keep_bytes,
                # jupyter_server's policy for tracebacks, applied before anything is recorded.
                tracebacks_allowed=getattr(kernel_manager, "allow_tracebacks", True),
                traceback_replacement=getattr(
                    kernel_manager, "traceback_replacement_message", "An exception occurred."
                ),
            ),
            counts=self.counts,
            observers=self.observers,
            activity=self.activity,
            take_restart_gap=lambda kernel_id: self.pending_gaps.pop(kernel_id, None),
            restarted=self.remember,
        )

    @property
    def deaths(self) -> dict[str, int]:
        """Kernels that died by themselves (and were restarted), by reason."""
        return self.context.deaths

    @property
    def by_type(self) -> dict[str, list[int]]:
        """``[messages, bytes]`` recorded, by msg_type (see :class:`.recorder.MessageCounts`)."""
        return self.counts.by_type

    def start(self) -> None:
        """Begin reconciling. Called by the application once the loop runs."""
        self._reconciler = PeriodicCallback(self.reconcile, self.reconcile_interval * 1000)
        self._reconciler.start()

    def on_close(self, callback: Callable[[str, int], Any]) -> None:
        """Register ``callback(kernel_id, head)``, called when a Tap closes (its kernel shut
        down), with the last sequence number it gave."""
        self._on_close.append(callback)

    def on_lease_lost(self, callback: Callable[[str, int], Any]) -> None:
        """Register ``callback(kernel_id, head)``, called when this node stops recording a
        kernel that runs on (its lease ran out or was taken), with the last sequence number
        published here: its clients resume from there, on any node."""
        self._on_lease_lost.append(callback)

    def lease_lost(self, kernel_id: str) -> None:
        """This node no longer holds ``kernel_id``'s lease: its recorder follows the kernel
        from the last record published here, and its clients are told (see
        :meth:`on_lease_lost`). Called by the cluster node."""
        tap = self.taps.get(kernel_id)
        if tap is None or tap.closed or tap.following:
            return
        tap.demote()
        for callback in self._on_lease_lost:
            callback(kernel_id, tap.head)

    def _written(self, kernel_id: str, records: list[Record]) -> None:
        """The store wrote ``records`` of ``kernel_id`` (a committed-only store)."""
        tap = self.taps.get(kernel_id) or self._closing.get(kernel_id)
        if tap is not None:
            tap.written(records)

    async def ensure(self, kernel_id: str) -> KernelRecorder:
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
        future: asyncio.Future[KernelRecorder] = asyncio.get_running_loop().create_future()
        self._starting[kernel_id] = future
        try:
            kernel = self.kernel_manager.get_kernel(kernel_id)
            # With several nodes, only the node holding the kernel's lease records it.
            owner = self.cluster is None or await self.cluster.claim(kernel_id)
            role = Role.OWNER if owner else Role.FOLLOWER
            link = self.link_for(kernel_id, kernel)
            tap = KernelRecorder(
                kernel_id, kernel, link, self.store, self.broker, self.context, role=role
            )
            await tap.start()
            if self.cluster is not None and not owner:
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
        """How to reach ``kernel`` (a kernel manager), with this registry's options (see
        :func:`..kernels.links.link_for`)."""
        settings = LinkSettings(
            upstream=UpstreamSettings(
                self.upstream_retry_initial,
                self.upstream_retry_max,
                gone_after=self.upstream_kernel_gone_after,
            ),
            iopub=IOPubSettings(
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
            ),
            heartbeat=HeartbeatSettings(self.heartbeat_interval, self.heartbeat_timeout),
        )
        return link_for(
            kernel_id,
            kernel,
            self.sockets,
            settings,
            self.log,
            on_gone=lambda reason: self.kernel_gone(kernel_id, reason),
        )

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
        self._closing[kernel_id] = tap
        tap.close(reason)
        self.log.info("Stopped tapping kernel %s at seq %s", kernel_id, tap.head)
        # Its clients end after its last records (its end), once they are published.
        tap.when_published(lambda: self._closed(tap), PUBLISH_TIMEOUT)

    def _closed(self, tap: KernelRecorder) -> None:
        if self._closing.get(tap.kernel_id) is tap:
            del self._closing[tap.kernel_id]
        for callback in self._on_close:
            callback(tap.kernel_id, tap.head)

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
        action = data.get("action")
        if data.get("status") == "error" and action == "start" and kernel_id:
            self._start_failed(kernel_id, str(data.get("msg") or ""))
            return
        if data.get("status") != "success" or not kernel_id:
            return
        if action == "start":
            # jupyter_client emits the start event from inside the kernel's start, before
            # its multi-kernel manager lists the kernel: wait for the listing (a kernel the
            # warm pool holds is listed only once handed out, with an event of its own).
            if await self._until_listed(kernel_id, self.ready_timeout):
                await self._ensure_logged(kernel_id)
        elif action == "shutdown":
            self.close_tap(kernel_id)
        elif action == "restart":
            tap = self.taps.get(kernel_id)
            if tap is not None:
                tap.restarted()
                self.remember(kernel_id)

    async def _until_listed(self, kernel_id: str, timeout: float) -> bool:
        """Whether the kernel manager lists ``kernel_id`` within ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while kernel_id not in self.kernel_manager:
            if loop.time() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    def _start_failed(self, kernel_id: str, message: str) -> None:
        """A pending kernel whose start failed is ``dead`` with the reason at once, whichever
        kernel manager runs it (jupyter_server's own marks it only when its WebSocket finds
        the failure)."""
        if kernel_id not in self.kernel_manager:
            return
        kernel = self.kernel_manager.get_kernel(kernel_id)
        if getattr(kernel, "execution_state", None) != "dead":
            mark_start_failed(kernel, (message.strip() or "the kernel's start failed")[:500])

    async def reconcile(self) -> None:
        running = set(self.kernel_manager.list_kernel_ids())
        for kernel_id, tap in list(self.taps.items()):
            if kernel_id not in running:
                self.close_tap(kernel_id)
            elif tap.ready.done():
                # jupyter_server restarts its watcher after a restart that moved ports.
                self.activity.retire_watcher(kernel_id)
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
