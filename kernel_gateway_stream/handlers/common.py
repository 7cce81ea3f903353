"""What every handler shares: the gateway's services, authorization, errors, parsing.

Authorization follows jupyter_server's own kernel WebSocket: ``execute`` on ``kernels``
for everything that sends to a kernel or reads its output (the channels socket, SSE, the
transcript, the execute API); the health endpoint is ``read`` on ``api``, like
``/api/status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..broker.base import Broker
from ..broker.subscriber import ReplayLimits, SubscriberRegistry
from ..core.errors import (
    BadRequest,
    KernelStartFailed,
    LocalError,
    MethodNotAllowed,
    PayloadTooLarge,
    SequenceAhead,
    UnknownKernel,
    start_failure,
)
from ..core.frames import Frame, SharedMerges
from ..core.health import ComponentHealth
from ..core.messages import KernelMessage, load_json_object
from ..core.subscription import SubscriberQueue
from ..kernels.base import mark_start_failed, start_of
from ..recording.recorder import KernelRecorder
from ..recording.registry import RecorderRegistry
from ..stores.base import TranscriptStore
from .sessions import SessionRegistry

if TYPE_CHECKING:
    from ..executions import ExecutionManager
    from ..kernels.attaching import KernelAttacher

__all__ = [
    "SETTINGS_KEY",
    "KernelLocation",
    "QueuePolicy",
    "Services",
    "ServicesMixin",
    "discarded_notice",
    "json_body",
    "parse_msg_types",
    "parse_seq",
    "parse_timeout",
    "requires",
]

SETTINGS_KEY = "kernel_gateway_stream"
#: The action jupyter_server's kernel WebSocket requires, for all that reaches a kernel.
KERNEL_ACTION = "execute"
#: Seconds a client of a kernel that shut down (or of a gateway that stops) gets to
#: receive what was queued for it.
END_DRAIN_SECONDS = 10.0

log = logging.getLogger(__name__)


@dataclass
class QueuePolicy:
    """The limits of every subscriber's queue (``GatewayStreamApp`` traits)."""

    max_bytes: int = 32 * 1024 * 1024
    max_lag: float = 60.0
    merge_max_bytes: int = 1024 * 1024


@dataclass(frozen=True, slots=True)
class KernelLocation:
    """Where a kernel stands for one request (see :meth:`Services.locate`)."""

    kernel_id: str
    #: The transcript's head: the recorder's while the kernel runs, else the store's.
    head: int
    #: The kernel's recorder (or follower) while it runs; None for a kernel that ended
    #: and left its transcript.
    recorder: KernelRecorder | None

    @property
    def running(self) -> bool:
        return self.recorder is not None


@dataclass
class Services:
    """What the application hands its handlers, under ``settings[SETTINGS_KEY]``."""

    store: TranscriptStore
    broker: Broker
    taps: RecorderRegistry
    sessions: SessionRegistry
    executions: ExecutionManager
    attacher: KernelAttacher
    policy: QueuePolicy = field(default_factory=QueuePolicy)
    replay: ReplayLimits = field(default_factory=ReplayLimits)
    subscribers: SubscriberRegistry = field(default_factory=SubscriberRegistry)
    #: Seconds between SSE keep-alive comments.
    sse_heartbeat: float = 15.0
    #: Largest request body the gateway's own endpoints take.
    max_request_bytes: int = 10 * 1024 * 1024
    #: Merges of queued frames, shared by the subscribers that are behind together.
    merges: SharedMerges = field(default_factory=SharedMerges)
    #: Requests and frames refused as bad input, by reason (for metrics).
    refused: dict[str, int] = field(default_factory=dict)
    #: Set while the kernels an earlier run of the gateway left are being re-attached.
    recovering: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set once they are.
    recovered: asyncio.Event = field(default_factory=asyncio.Event)
    #: Longest a request for a kernel not known yet waits for that re-attachment.
    recovery_wait: float = 30.0
    #: With several nodes, this node's :class:`~kernel_gateway_stream.cluster.ClusterNode`.
    cluster: Any = None

    async def locate(
        self,
        kernel_id: str,
        since: int | None = None,
        *,
        running: bool = False,
        cut: bool = False,
    ) -> KernelLocation:
        """The one answer, for every surface, to "is this kernel known, and where is its
        head". A kernel the kernel manager runs (waited for as :meth:`known` says) has its
        recorder, started if need be, and the recorder's head (``cut``: and what the
        broker's coalescer holds goes out now, so every later frame lies wholly above the
        head); a kernel that ended has its transcript's head, unless ``running`` is asked.

        Raises:
            UnknownKernel: no such kernel (running, with ``running``; or with a transcript).
            SequenceAhead: ``since`` is past the head.
        """
        recorder: KernelRecorder | None = None
        if await self.known(kernel_id):
            await self.started(kernel_id)
            try:
                recorder = await self.taps.ensure(kernel_id)
            except UnknownKernel:
                # Shut down between the two questions: what it recorded is still read.
                if running:
                    raise
        if recorder is not None:
            head = recorder.head
            if cut:
                head = self.broker.cut(kernel_id) or head
        elif running:
            raise UnknownKernel(kernel_id)
        else:
            info = await self.store.info(kernel_id)
            if info is None:
                raise UnknownKernel(kernel_id)
            head = info.head
        if since is not None and since > head:
            raise SequenceAhead(since, head)
        return KernelLocation(kernel_id, head, recorder)

    async def started(self, kernel_id: str) -> None:
        """Wait for a kernel still starting (jupyter_server's pending kernels) as
        jupyter_server's own WebSocket does.

        Raises:
            KernelStartFailed: its start failed; the kernel is ``dead``, with the reason.
        """
        try:
            kernel = self.taps.kernel_manager.get_kernel(kernel_id)
        except KeyError:
            return
        waited = start_of(kernel)
        if waited is None:
            return
        pending = getattr(self.taps.kernel_manager, "_pending_kernels", {})
        if not waited.done() and kernel_id not in pending:
            # Not a start under way: a kernel manager that never settles its future (an
            # upstream gateway's), or one started some other way.
            return
        try:
            await asyncio.shield(waited)
        except asyncio.CancelledError:
            if waited.cancelled():
                return
            raise
        except Exception as error:
            # As jupyter_server's own WebSocket does (its kernel manager, unlike the
            # gateway's StreamMappingKernelManager, leaves the model as it was).
            reason = start_failure(error)
            mark_start_failed(kernel, reason)
            raise KernelStartFailed(reason) from error

    async def known(self, kernel_id: str) -> bool:
        """Whether ``kernel_id`` is a kernel the gateway runs; while the kernels an earlier
        run left are being re-attached (just after a restart), an unknown one is waited
        for, so a client reconnecting at once does not hear that its kernel is gone; with
        several nodes, one started on another node a moment ago is joined now."""
        kernel_manager = self.taps.kernel_manager
        if kernel_id in kernel_manager:
            return True
        if self.recovering.is_set() and not self.recovered.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.recovered.wait(), self.recovery_wait)
        if kernel_id not in kernel_manager and self.cluster is not None:
            # Started on another node a moment ago: join it now, not at the next sync.
            await self.cluster.join_now(kernel_id)
        return kernel_id in kernel_manager

    def count_refused(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    #: Tasks ending subscribers (asyncio keeps only weak references to running tasks).
    _ending: set[asyncio.Future[None]] = field(default_factory=set)

    def new_queue(
        self,
        since: int,
        *,
        parent: str | None = None,
        msg_types: frozenset[str] | None = None,
    ) -> SubscriberQueue:
        """A subscriber queue with the configured limits."""
        policy = self.policy
        return SubscriberQueue(
            since=since,
            max_bytes=policy.max_bytes,
            max_lag=policy.max_lag,
            merge_max_bytes=policy.merge_max_bytes,
            merges=self.merges,
            parent=parent,
            msg_types=msg_types,
        )

    def kernel_closed(self, kernel_id: str, head: int) -> None:
        """RecorderRegistry ``on_close``: the kernel shut down at ``head``. Its sessions close;
        each client gets what was queued for it (a client still catching up, what is left
        up to ``head``), then ``kernel_shutdown``."""
        self.sessions.close_kernel(kernel_id)
        for subscriber in self.subscribers.of(kernel_id):
            self._finish(subscriber.finish("kernel_shutdown", END_DRAIN_SECONDS, head))

    def kernel_lease_lost(self, kernel_id: str, head: int) -> None:
        """RecorderRegistry ``on_lease_lost``: this node stopped recording ``kernel_id``
        (its lease ran out or was taken) and follows it from ``head``. Each client gets what
        was queued for it (all of it written: see :mod:`..core.committed`), then
        ``lease_lost`` with its last seq, to resume from on any node."""
        for subscriber in self.subscribers.of(kernel_id):
            self._finish(subscriber.finish("lease_lost", END_DRAIN_SECONDS, head))

    async def gateway_stopping(self, timeout: float) -> None:
        """Every client gets what is queued for it, then ``gateway_shutdown`` with the last
        seq it was sent; at most ``timeout`` seconds in all."""
        finishing = [s.finish("gateway_shutdown", timeout, None) for s in list(self.subscribers)]
        if finishing:
            await asyncio.wait([asyncio.ensure_future(f) for f in finishing], timeout=timeout)

    def _finish(self, finishing: Any) -> None:
        task = asyncio.ensure_future(finishing)
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    def health(self) -> list[ComponentHealth]:
        broker = self.broker.health()
        details = {
            **broker.details,
            "subscribers": len(self.subscribers),
            **self.sessions.stats(),
        }
        components = [
            self.store.health(),
            self.taps.health(),
            ComponentHealth("broker", broker.state, broker.reason, details),
        ]
        if self.cluster is not None:
            components.append(self.cluster.health())
        pool = getattr(self.taps.kernel_manager, "pool", None)
        if pool is not None:
            components.append(pool.health())
        return components


class ServicesMixin:
    """For handlers: the gateway's services, JSON errors, and 405 for what they do not
    serve (with a JSON reason, as every error of ours)."""

    #: jupyter_server's authorizer guards every handler of ours as the kernels resource.
    auth_resource = "kernels"
    settings: dict[str, Any]

    @property
    def services(self) -> Services:
        services: Services = self.settings[SETTINGS_KEY]
        return services

    def write_error_json(self, error: LocalError) -> None:
        """Finish the request with ``error``'s status and ``{"reason", "message"}``."""
        handler: Any = self
        if 400 <= error.status < 500:
            self.services.count_refused(error.reason)
        handler.clear_header("Content-Type")
        handler.set_status(error.status)
        handler.set_header("Content-Type", "application/json")
        if error.status == 405:
            handler.set_header("Allow", ", ".join(self._served()))
        handler.finish(json.dumps(error.to_json()))

    def _served(self) -> list[str]:
        """The methods this handler serves (those it does not fall back to 405 for)."""
        cls = type(self)
        fallback = ServicesMixin._not_allowed
        return [
            method
            for method in ("GET", "POST", "PUT", "PATCH", "DELETE")
            if getattr(cls, method.lower()) is not fallback
        ]

    async def _not_allowed(self, *args: Any, **kwargs: Any) -> None:
        handler: Any = self
        served = ", ".join(self._served())
        self.write_error_json(
            MethodNotAllowed(f"{handler.request.method} is not served here; use {served}")
        )

    get = post = put = patch = delete = _not_allowed  # type: ignore[assignment]

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        """As tornado's, without the request's URI, which may carry ``?token=``."""
        handler: Any = self
        if isinstance(value, web.HTTPError):
            return
        log.error("Uncaught exception in %s %s", handler.request.method,
                  type(handler).__name__, exc_info=(typ, value, tb))  # fmt: skip


F = TypeVar("F", bound=Callable[..., Any])


def requires(action: str) -> Callable[[F], F]:
    """jupyter_server's ``@authorized(action)``, typed: the handler's ``auth_resource``."""
    return cast(Callable[[F], F], authorized(action))


def json_body(handler: Any) -> dict[str, Any]:
    """The request body as a strict JSON object (no NaN or Infinity).

    Raises:
        PayloadTooLarge: it was over the limit (see :class:`LimitedBodyMixin`).
        BadRequest: not a JSON object.
    """
    if getattr(handler, "body_too_large", False):
        services: Services = handler.settings[SETTINGS_KEY]
        raise PayloadTooLarge(f"the request body is over {services.max_request_bytes} bytes")
    raw = b"".join(getattr(handler, "body_chunks", [])) or handler.request.body or b"{}"
    try:
        return load_json_object(raw, "the request body")
    except Exception as error:
        raise BadRequest(str(error)) from None


class LimitedBodyMixin:
    """Takes a request body only up to ``Services.max_request_bytes``: a larger one is
    refused before the gateway holds it (413), however it is sent (Content-Length or
    chunked). The handler class must be decorated with ``tornado.web.stream_request_body``
    (its body then arrives through :meth:`data_received`)."""

    settings: dict[str, Any]
    request: Any
    body_chunks: list[bytes]
    body_too_large = False
    _body_size = 0

    async def prepare(self) -> None:
        self.body_chunks = []
        limit = self.settings[SETTINGS_KEY].max_request_bytes
        length = self.request.headers.get("Content-Length")
        if length is not None and length.isascii() and length.isdigit() and int(length) > limit:
            self.body_too_large = True
        await super().prepare()  # type: ignore[misc]  # APIHandler.prepare

    def data_received(self, chunk: bytes) -> None:
        if self.body_too_large:
            return
        self._body_size += len(chunk)
        if self._body_size > self.settings[SETTINGS_KEY].max_request_bytes:
            self.body_too_large = True
            self.body_chunks = []
            return
        self.body_chunks.append(chunk)


def parse_seq(name: str, value: str | None) -> int | None:
    """A sequence-number parameter: a non-negative integer, or None when absent.

    Raises:
        BadRequest: anything else.
    """
    if value is None or value == "":
        return None
    # ASCII digits only: str.isdigit() is also true of "²" or "¹²³", which int() refuses
    # (and of other scripts' digits, which it takes).
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise BadRequest(f"{name} must be a non-negative integer, got {value[:40]!r}")
    return int(value)


def parse_timeout(value: Any) -> float | None:
    """An execution's ``timeout``: a positive, finite number of seconds, or None.

    Raises:
        BadRequest: anything else (a string, a boolean, zero, negative, NaN, Infinity).
    """
    if value is None:
        return None
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if not is_number or not math.isfinite(value) or value <= 0:
        raise BadRequest("'timeout' must be a positive number of seconds, or null")
    return float(value)


def discarded_notice(first_seq: int, last_seq: int, session: str) -> Frame:
    """The IOPub message that tells a reader retention already discarded what it asked for."""
    message = KernelMessage.synthesize(
        "kernel_gateway_stream_discarded",
        {"first_seq": first_seq, "last_seq": last_seq, "reason": "retention"},
        msg_id=f"discarded-{first_seq}-{last_seq}",
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        session=session,
    )
    return Frame.reply("iopub", message)


def parse_msg_types(values: list[str]) -> frozenset[str] | None:
    """``msg_type`` parameters, repeated or comma-separated; None when absent."""
    names = {name.strip() for value in values for name in value.split(",") if name.strip()}
    return frozenset(names) or None


def no_delay(handler: web.RequestHandler) -> None:
    """Turn Nagle's algorithm off for a streaming response: the broker already merges what
    should be merged, and a small event held for the peer's delayed ACK waits ~40 ms."""
    stream = getattr(handler.request.connection, "stream", None)
    if stream is not None:
        stream.set_nodelay(True)
