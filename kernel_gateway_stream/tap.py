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
* **No drops.** The SUB socket's receive high-water mark is 0 (unbounded), so the kernel's
  PUB socket never drops a message because the gateway fell behind for a moment.

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
from typing import Any, cast

import zmq
from jupyter_client.session import Session
from jupyter_server._tz import utcnow
from tornado.ioloop import PeriodicCallback
from traitlets import Float, Int
from traitlets.config import LoggingConfigurable

from .broker.base import Broker
from .core.errors import BadSignature, InvalidMessage, RemoteError, UnknownKernel
from .core.guards import DigestHistory, withhold_traceback
from .core.health import ComponentHealth, State
from .core.marks import lifecycle_request, lifecycle_status
from .core.messages import (
    KernelMessage,
    Record,
    Signer,
    invalid_placeholder,
    split_identities,
)
from .core.sequencer import Sequencer
from .kernel_sockets import KernelSockets, channel_url
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
    """Reads one kernel's IOPub for the gateway. Created and driven by :class:`TapManager`."""

    def __init__(
        self,
        kernel_id: str,
        kernel_manager: Any,
        store: TranscriptStore,
        broker: Broker,
        manager: TapManager,
    ) -> None:
        self.kernel_id = kernel_id
        self.kernel_manager = kernel_manager
        self.store = store
        self.broker = broker
        self.manager = manager
        self.log = manager.log
        self.session = Session(
            key=kernel_manager.session.key,
            signature_scheme=kernel_manager.session.signature_scheme,
            username="kernel_gateway_stream",
        )
        self.signer = Signer(kernel_manager.session.key, kernel_manager.session.signature_scheme)
        self.sequencer = Sequencer(kernel_id)
        self.history = DigestHistory(manager.replay_history)
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.received = 0
        #: Messages refused: a signature that does not match, or framing that is not a message.
        self.rejected = 0
        #: Correctly signed messages seen before (replays), refused.
        self.replays = 0
        #: Correctly signed messages that are not messages, recorded as placeholders.
        self.invalid = 0
        self._refusals_logged = 0.0
        self._active = False
        self._iopub: zmq.Socket[bytes] | None = None
        self._iopub_fd = -1
        self._nudger: asyncio.Task[None] | None = None
        self._closed = False
        self._connected_at = time.monotonic()

    @property
    def head(self) -> int:
        return self.sequencer.head

    @property
    def closed(self) -> bool:
        """True once the Tap stopped (its kernel shut down, or the gateway is stopping)."""
        return self._closed

    async def start(self) -> None:
        """Number from the store's head, subscribe, and start nudging until ready."""
        self.sequencer.head = await self.store.head(self.kernel_id)
        self.broker.open_kernel(self.kernel_id, self.sequencer.head)
        self.store.kernel_started(self.kernel_id, time.time())
        self._connect()
        self.kernel_manager.add_restart_callback(self._on_auto_restart, "restart")
        self.kernel_manager.add_restart_callback(self._on_dead, "dead")
        hooks = getattr(self.kernel_manager, "lifecycle_hooks", None)
        if hooks is not None:  # our kernel manager says when a restart or shutdown begins
            hooks.append(self._on_lifecycle_request)

    def late(self) -> bool:
        """True if the Tap has waited for its kernel's first IOPub message for longer than a
        kernel takes to start."""
        return time.monotonic() - self._connected_at > STARTING_GRACE

    def _connect(self) -> None:
        self._connected_at = time.monotonic()
        info = self.kernel_manager.get_connection_info()
        socket = self.manager.sockets.context.socket(zmq.SUB)
        socket.setsockopt(zmq.RCVHWM, self.manager.iopub_receive_hwm)
        # The kernel's PUB socket drops what it cannot queue for us (1000 messages by
        # default) once the TCP buffers between us are full. A fresh connection starts with
        # a small receive buffer that autotuning grows only later, so a short stall of our
        # I/O thread early in a burst could cost messages: ask for a large buffer at once.
        if self.manager.iopub_receive_buffer:
            socket.setsockopt(zmq.RCVBUF, self.manager.iopub_receive_buffer)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.connect(channel_url(info, "iopub"))
        self._iopub = socket
        self._iopub_fd = cast(int, socket.getsockopt(zmq.FD))
        # Read straight off the socket's notification fd (edge-triggered: every wake-up
        # reads until the socket says it has nothing more), not through a ZMQStream, whose
        # per-message callbacks and end-of-batch exception cost more than the decoding.
        loop = asyncio.get_running_loop()
        loop.add_reader(self._iopub_fd, self._on_readable)
        loop.call_soon(self._on_readable)
        if self.ready.done():
            self.ready = asyncio.get_running_loop().create_future()
        self._nudger = asyncio.ensure_future(self._nudge(info))

    async def _nudge(self, info: dict[str, Any]) -> None:
        """Send kernel_info_request until IOPub proves the subscription is live."""
        shell = self.manager.sockets.context.socket(zmq.DEALER)
        shell.setsockopt(zmq.LINGER, 0)
        shell.connect(channel_url(info, "shell"))
        ready = self.ready
        deadline = time.monotonic() + self.manager.ready_timeout
        try:
            while not ready.done():
                self.session.send(shell, "kernel_info_request")
                try:
                    await asyncio.wait_for(asyncio.shield(ready), self.manager.nudge_interval)
                except asyncio.TimeoutError:
                    if time.monotonic() > deadline:
                        self.log.warning(
                            "No IOPub message from kernel %s in %.0f s; going on unconfirmed",
                            self.kernel_id,
                            self.manager.ready_timeout,
                        )
                        ready.set_result(None)
        finally:
            shell.close(linger=0)

    def _on_readable(self) -> None:
        """Read what IOPub has queued, in a bounded batch so other work on the loop gets
        its turn; a batch that hits the bound continues on the next loop iteration."""
        if self._read(self.manager.iopub_batch, self.manager.iopub_batch_bytes):
            asyncio.get_running_loop().call_soon(self._on_readable)

    def _read(self, most: int | None, most_bytes: int | None) -> bool:
        """Read up to ``most`` messages / ``most_bytes``; True if more are waiting."""
        socket = self._iopub
        if socket is None or socket.closed:
            return False
        count = taken = 0
        self._active = False
        try:
            while cast(int, socket.get(zmq.EVENTS)) & zmq.POLLIN:
                if (most is not None and count >= most) or (
                    most_bytes is not None and taken >= most_bytes
                ):
                    return True
                frames = socket.recv_multipart(zmq.NOBLOCK)
                count += 1
                taken += sum(map(len, frames))
                try:
                    self._decode_and_record(frames)
                except Exception:
                    # Never stop reading: the fd signals only on an edge, so a batch that
                    # ends in an exception would leave the socket unread for good.
                    self.log.exception("Recording an IOPub message of %s failed", self.kernel_id)
        finally:
            if count:
                self._received_batch()
        return False

    def _received_batch(self) -> None:
        if not self.ready.done():
            self.ready.set_result(None)
            self.manager.retire_activity_watcher(self.kernel_id)
        if self._active:
            # Once per batch: last_activity is a trait, and setting one is not free.
            multi = self.manager.kernel_manager
            multi.last_kernel_activity = self.kernel_manager.last_activity = utcnow()

    def _decode_and_record(self, frames: list[bytes]) -> None:
        try:
            _, rest = split_identities(frames)
            if len(rest) < 5:
                raise RemoteError(f"expected a signature and 4 parts, got {len(rest)} frames")
            self.signer.verify(rest[0], rest[1:5])
            if self.history.seen(rest[0]):
                self.replays += 1
                self._refused(f"a replay of a message already recorded ({self.replays})")
                return
            try:
                message = KernelMessage.from_parts(rest[1:], repair=True)
            except RemoteError as error:
                self.invalid += 1
                invalid = InvalidMessage(str(error), rest[0], rest[1:])
                message = invalid_placeholder(invalid, date=now_iso(), session=self.session.session)
        except (BadSignature, RemoteError) as error:
            self.rejected += 1
            self._refused(f"an invalid message ({error})")
            return
        self._record(message)

    def _refused(self, what: str) -> None:
        """Log a refusal, at most once per ``refusal_log_interval`` (a kernel can send a
        great many: the log must not be its megaphone)."""
        now = time.monotonic()
        if now - self._refusals_logged >= self.manager.refusal_log_interval:
            self._refusals_logged = now
            self.log.warning(
                "Kernel %s sent %s; refused %d invalid and %d replayed messages so far",
                self.kernel_id,
                what,
                self.rejected,
                self.replays,
            )

    def record_message(self, message: KernelMessage) -> None:
        """Record a message that did not come on IOPub (an ``input_request`` for one of the
        gateway's own executions): it gets the next seq, like any other."""
        self._record(message)

    def _record(self, message: KernelMessage) -> None:
        self.received += 1
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
        self._drain()
        message = lifecycle_status(
            execution_state,
            reason,
            msg_id=str(uuid.uuid4()),
            date=now_iso(),
            session=self.session.session,
        )
        self._record(message)

    def _drain(self) -> None:
        """Read whatever IOPub messages are already queued on the socket."""
        self._read(None, None)

    def _disconnect(self) -> None:
        if self._nudger is not None:
            self._nudger.cancel()
            self._nudger = None
        socket = self._iopub
        if socket is not None:
            self._drain()
            if not socket.closed:
                asyncio.get_running_loop().remove_reader(self._iopub_fd)
                socket.close(linger=0)
            self._iopub = None

    def reconnect(self) -> None:
        """After a restart: resubscribe (the ports may have changed) and nudge again."""
        if self._closed:
            return
        self._disconnect()
        self._connect()

    def _on_auto_restart(self) -> None:
        self.record_mark("restarting", "kernel_died")
        self.reconnect()

    def _on_dead(self) -> None:
        self.record_mark("dead", "restart_failed")

    def _on_lifecycle_request(self, what: str) -> None:
        """Our kernel manager says a restart or a shutdown was asked for (the kernel is
        still there: what it does now comes after this note)."""
        if self._closed:
            return
        self._drain()
        event = f"{what}_requested" if what == "shutdown" else what
        self._record(lifecycle_request(event, what, msg_id=str(uuid.uuid4()), date=now_iso()))

    def restarted(self) -> None:
        """A restart asked for through the API has completed: the old kernel is gone."""
        if self._closed:
            return
        self.record_mark("restarting", "restart_requested")
        self.reconnect()

    def stop(self) -> None:
        """Stop reading, keeping the kernel's state (the gateway itself is shutting down)."""
        self._closed = True
        self._disconnect()

    def close(self) -> None:
        """Stop tapping: the kernel shut down. Records that it did (a ``dead`` status,
        reason ``shutdown``: executions still running end ``died``)."""
        if self._closed:
            return
        self.record_mark("dead", "shutdown")
        self._closed = True
        self._disconnect()
        for callback, event in ((self._on_auto_restart, "restart"), (self._on_dead, "dead")):
            with contextlib.suppress(ValueError):
                self.kernel_manager.remove_restart_callback(callback, event)
        hooks = getattr(self.kernel_manager, "lifecycle_hooks", [])
        with contextlib.suppress(ValueError):
            hooks.remove(self._on_lifecycle_request)
        if not self.ready.done():
            self.ready.set_result(None)
        self.store.kernel_ended(self.kernel_id, time.time())
        self.broker.close_kernel(self.kernel_id)


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
        self._on_close: list[Any] = []
        self._reconciler: PeriodicCallback | None = None

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
            tap = KernelTap(
                kernel_id, self.kernel_manager.get_kernel(kernel_id), self.store, self.broker, self
            )
            await tap.start()
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # retrieved: waiters re-raise it themselves
            raise
        finally:
            del self._starting[kernel_id]
        self.taps[kernel_id] = tap
        future.set_result(tap)
        self.log.info("Tapping kernel %s from seq %s", kernel_id, tap.head + 1)
        return tap

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

    def close_tap(self, kernel_id: str) -> None:
        tap = self.taps.pop(kernel_id, None)
        if tap is None:
            return
        tap.close()
        self.log.info("Stopped tapping kernel %s at seq %s", kernel_id, tap.head)
        for callback in self._on_close:
            callback(kernel_id, tap.head)

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
        }
        # A kernel takes a second or so to answer at start (or after a restart): that is
        # starting, not a fault. One that does not answer for STARTING_GRACE seconds is.
        late = [tap.kernel_id for tap in taps if tap.kernel_id in waiting and tap.late()]
        if late:
            details["not_answering"] = late
            return ComponentHealth("taps", State.DEGRADED, "kernel_not_ready", details)
        return ComponentHealth("taps", State.OK, None, details)
