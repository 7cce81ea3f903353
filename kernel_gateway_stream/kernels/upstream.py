"""Kernels behind another gateway, reached over its kernel WebSocket.

With jupyter_server's ``GatewayClient`` settings (``--gateway-url``,
``--GatewayClient.auth_token`` and the rest), kernels live on an upstream server (a
jupyter_server, Kernel Gateway, Enterprise Gateway, or another kernel_gateway_stream) and
jupyter_server's gateway kernel manager creates, lists, interrupts, restarts and deletes
them there. This module gives such a kernel the two seams of :mod:`.base`:

* :class:`UpstreamIOPubSource`: one WebSocket per kernel, owned by the gateway from the
  kernel's start (or first sighting) to its end, so output is recorded with no client
  attached. It speaks the v1 protocol (``v1.kernel.websocket.jupyter.org``) where the
  upstream offers it and the legacy JSON protocol otherwise, keeps only IOPub, and when the
  connection drops reconnects with capped exponential backoff and jitter. Meanwhile the
  kernel is ``unreachable``; on reconnect what the upstream may have lost is a gap record
  (``lost`` unknown), except from an upstream kernel_gateway_stream, which is resumed with
  ``?since=`` its own last seq and so misses nothing (what that upstream could not record
  itself, its gap records, become gap records here). The upstream's seq is kept in the
  record's metadata under ``kernel_gateway_stream_upstream`` (ours is
  ``kernel_gateway_stream``). An upstream that answers but says the kernel does not exist
  (HTTP 404 on its channels and on its model: a jupyter_server restarted, which keeps no
  kernels, or a kernel culled or shut down there) for ``gone_after`` seconds has lost it
  for good: the link's ``on_gone`` is told (the gateway records the kernel dead and
  forgets it). The grace is for an upstream that re-attaches its kernels just after it
  starts answering (a kernel_gateway_stream, Enterprise Gateway's session persistence).
  What any other upstream relays is what its kernel published, so it passes the same
  intake rule as a ZMQ kernel's output (:mod:`..core.intake`: no gateway records, no
  ``dead`` status), and a seq in its metadata is the kernel's to write, not taken: an
  upstream is a kernel_gateway_stream only if it answers ``GET /api/gateway/health``
  (:meth:`UpstreamKernelLink.identify`). Messages an upstream's kernel numbered and that
  never arrived are ``upstream_lost`` gap records (:mod:`..core.upstream_counters`).
* :class:`~.upstream_channels.UpstreamChannels`: per client connection, its shell,
  control and stdin on that same WebSocket (:mod:`.upstream_channels`: replies and
  ``input_request`` are routed to the client that asked by the request's ``msg_id``). The
  upstream serves one WebSocket per kernel however many clients the gateway has.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import random
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from ..core import intake
from ..core.errors import MalformedMessage, RemoteError
from ..core.marks import GAP_MSG_TYPE
from ..core.messages import KernelMessage, Signer, dumps_json, load_json_object
from ..core.upstream_counters import CounterWatch, Lost, parse_counter
from ..core.wire import SEQ_METADATA_KEY, decode_legacy_binary, decode_v1, encode_v1
from .base import IOPubSink, ReplyCallback
from .upstream_channels import UpstreamChannels, UpstreamHub

__all__ = [
    "UPSTREAM_METADATA_KEY",
    "V1_SUBPROTOCOL",
    "UpstreamChannels",
    "UpstreamIOPubSource",
    "UpstreamKernelLink",
    "UpstreamSettings",
    "decode_upstream",
    "encode_upstream",
]

V1_SUBPROTOCOL = "v1.kernel.websocket.jupyter.org"
#: Where an upstream kernel_gateway_stream's seq is kept in a record's metadata.
UPSTREAM_METADATA_KEY = "kernel_gateway_stream_upstream"
#: Marks a message the gateway recorded for the kernel (an ``idle`` the upstream lost).
SYNTHESIZED_METADATA_KEY = "kernel_gateway_stream_synthesized"
#: Executions whose execute_reply came and whose idle is awaited, at most.
MAX_AWAITING_IDLE = 1000
#: IOPub messages held back behind an ``idle`` at most; past it, the numbers missing below
#: it are judged at once.
MAX_HELD = 10_000


@dataclass(frozen=True)
class UpstreamSettings:
    """Reconnection of upstream WebSockets: the first retry after ``retry_initial``
    seconds, doubling up to ``retry_max``, each with jitter (half to one and a half). A
    kernel the upstream says it does not have for ``gone_after`` seconds is gone."""

    retry_initial: float = 0.5
    retry_max: float = 30.0
    connect_timeout: float = 20.0
    max_message_bytes: int = 256 * 1024 * 1024
    gone_after: float = 30.0
    #: Seconds a number missing from the kernel's counter may still arrive late (see
    #: :mod:`..core.upstream_counters`).
    reorder_window: float = 2.0
    #: Seconds between the ``kernel_info_request`` nudges sent until the kernel's IOPub
    #: answers (after connecting, and after a restart).
    nudge_interval: float = 1.0
    #: Seconds of nudging before the Tap is reported ready anyway.
    ready_timeout: float = 60.0


def decode_upstream(data: bytes | str, v1: bool) -> tuple[str, list[bytes]]:
    """``(channel, [header, parent_header, metadata, content, *buffers])`` of a message an
    upstream server sent.

    Raises:
        MalformedMessage: not a message of the protocol.
    """
    if v1:
        if isinstance(data, str):
            raise MalformedMessage("a v1 server sends binary frames")
        channel, parts = decode_v1(data)
        if len(parts) < 4:
            raise MalformedMessage(f"a message has at least 4 parts, got {len(parts)}")
        return channel, parts
    if isinstance(data, bytes):
        message, buffers = decode_legacy_binary(data, from_kernel=True)
    else:
        # What a kernel sent: a number JSON cannot write back (1e999, NaN) is read as null.
        message, buffers = load_json_object(data, "message", from_kernel=True), []
    named = message.get("channel")
    if not isinstance(named, str):
        raise MalformedMessage("message has no channel")
    channel = named
    parts = []
    for what in ("header", "parent_header", "metadata", "content"):
        value = message.get(what)
        parts.append(dumps_json(value if isinstance(value, dict) else {}))
    return channel, [*parts, *buffers]


def encode_upstream(channel: str, parts: list[bytes], v1: bool) -> bytes | str:
    """A client's message (``[header, parent, metadata, content, *buffers]``) for the
    upstream, in its protocol."""
    if v1:
        return encode_v1(channel, parts)
    if len(parts) > 4:
        raise MalformedMessage("the upstream speaks the legacy protocol: no binary buffers")
    fields = ("header", "parent_header", "metadata", "content")
    message: dict[str, Any] = {
        name: json.loads(part) for name, part in zip(fields, parts, strict=True)
    }
    message["channel"] = channel
    message["buffers"] = []
    return json.dumps(message)


def upstream_seq(raw_metadata: bytes) -> tuple[bytes, int | None]:
    """``raw_metadata`` with an upstream kernel_gateway_stream's seq moved from our key to
    :data:`UPSTREAM_METADATA_KEY`, and that seq (None if it is not there)."""
    if SEQ_METADATA_KEY.encode() not in raw_metadata:
        return raw_metadata, None
    metadata = load_json_object(raw_metadata, "metadata", from_kernel=True)
    theirs = metadata.pop(SEQ_METADATA_KEY, None)
    if not isinstance(theirs, dict):
        return raw_metadata, None
    metadata[UPSTREAM_METADATA_KEY] = theirs
    seq = theirs.get("seq")
    return dumps_json(metadata), seq if isinstance(seq, int) else None


class UpstreamKernelLink:
    """A kernel behind an upstream gateway (see :class:`..base.KernelLink`)."""

    kind = "upstream"

    def __init__(
        self,
        kernel_id: str,
        gateway_client: Any,
        settings: UpstreamSettings,
        log: logging.Logger | logging.LoggerAdapter[Any],
        on_gone: Callable[[str], None] | None = None,
    ) -> None:
        self.kernel_id = kernel_id
        self.gateway_client = gateway_client
        self.settings = settings
        self.log = log
        #: ``on_gone(reason)``: the upstream no longer has the kernel (see the module
        #: docstring); None: keep retrying.
        self.on_gone = on_gone
        #: Nothing is signed over a WebSocket: an empty key turns signing off.
        self.signer = Signer(b"")
        #: The kernel's one WebSocket, shared by its IOPub source and every client.
        self.hub = UpstreamHub(log)
        #: True if the upstream is a kernel_gateway_stream (its records' seq and its
        #: marks are its own, written over whatever its kernel put in a message), False
        #: if not (what comes through it is what the kernel published, checked by
        #: ..core.intake), None until it answered (see :meth:`identify`).
        self.chained: bool | None = None

    def request(self, session_id: str, since: int | None = None) -> HTTPRequest:
        """The upgrade request to the kernel's channels on the upstream."""
        client = self.gateway_client
        base = (client.ws_url or "").rstrip("/")
        endpoint = client.kernels_endpoint.strip("/")
        url = f"{base}/{endpoint}/{quote(self.kernel_id)}/channels?session_id={quote(session_id)}"
        if since is not None:
            url += f"&since={since}"
        arguments = client.load_connection_args()
        arguments["connect_timeout"] = self.settings.connect_timeout
        arguments.pop("request_timeout", None)
        return HTTPRequest(url, **arguments)

    async def connect(self, session_id: str, since: int | None = None) -> Connection:
        """An open WebSocket to the kernel's channels, v1 if the upstream offers it."""
        socket = await websocket_connect(
            self.request(session_id, since),
            subprotocols=[V1_SUBPROTOCOL],
            max_message_size=self.settings.max_message_bytes,
        )
        return Connection(socket, socket.selected_subprotocol == V1_SUBPROTOCOL)

    async def exists(self) -> bool | None:
        """Whether the upstream has the kernel: False if it answers 404 for the kernel's
        model, True if it answers the model, None if it does not answer (or answers
        anything else)."""
        client = self.gateway_client
        base = (client.url or "").rstrip("/")
        endpoint = client.kernels_endpoint.strip("/")
        arguments = client.load_connection_args()
        arguments["connect_timeout"] = self.settings.connect_timeout
        arguments["request_timeout"] = self.settings.connect_timeout
        request = HTTPRequest(f"{base}/{endpoint}/{quote(self.kernel_id)}", **arguments)
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except Exception:  # refused, timed out, TLS...: no answer
            return None
        if response.code == 404:
            return False
        return True if response.code == 200 else None

    async def identify(self) -> None:
        """Whether the upstream is a kernel_gateway_stream (:attr:`chained`): it answers
        ``GET /api/gateway/health`` with its components. Left None if it does not answer."""
        client = self.gateway_client
        base = (client.url or "").rstrip("/")
        arguments = client.load_connection_args()
        arguments["connect_timeout"] = self.settings.connect_timeout
        arguments["request_timeout"] = self.settings.connect_timeout
        request = HTTPRequest(f"{base}/api/gateway/health", **arguments)
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except Exception:  # refused, timed out, TLS...: no answer, ask again later
            return
        if response.code == 599:
            return
        try:
            answer = json.loads(response.body or b"null")
        except ValueError:
            answer = None
        self.chained = isinstance(answer, dict) and isinstance(answer.get("components"), dict)

    def iopub(self, sink: IOPubSink) -> UpstreamIOPubSource:
        return UpstreamIOPubSource(self, sink)

    def channels(
        self, identity: bytes, on_reply: ReplyCallback, *, handshake_timeout: float
    ) -> UpstreamChannels:
        return UpstreamChannels(self.hub, identity, on_reply)


@dataclass
class Connection:
    socket: WebSocketClientConnection
    v1: bool

    def write(self, channel: str, parts: list[bytes]) -> None:
        """Send one message in the connection's protocol (raises MalformedMessage)."""
        self.socket.write_message(encode_upstream(channel, parts, self.v1), binary=self.v1)


def _backoff(settings: UpstreamSettings, attempt: int) -> float:
    delay = min(settings.retry_max, settings.retry_initial * 2.0 ** min(attempt, 30))
    jitter: float = random.uniform(0.5, 1.5)
    return delay * jitter


class UpstreamIOPubSource:
    """A kernel's IOPub over one upstream WebSocket (see the module docstring)."""

    def __init__(self, link: UpstreamKernelLink, sink: IOPubSink) -> None:
        self.link = link
        self.sink = sink
        self.log = link.log
        self.rejected = 0
        self.replays = 0
        self.invalid = 0
        self.reachable = True
        #: The upstream kernel_gateway_stream's last seq we recorded (None: the upstream
        #: is not one, or said nothing yet).
        self.upstream_seq: int | None = None
        self.reconnects = 0
        #: Since when (monotonic) the upstream has said it does not have the kernel.
        self._missing_since: float | None = None
        self._session_id = f"kernel_gateway_stream-tap-{uuid.uuid4().hex}"
        self._connection: Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        #: The kernel's message counter (see :mod:`..core.upstream_counters`); None once
        #: the upstream is a kernel_gateway_stream, whose own gap records and exact resume
        #: say what it lost.
        self.counters: CounterWatch | None = CounterWatch(link.settings.reorder_window)
        #: Messages the counters found lost (each batch one ``upstream_lost`` gap record).
        self.upstream_lost = 0
        self._poll_timer: asyncio.TimerHandle | None = None
        self._refusals_logged = -60.0
        #: Executions of the gateway's clients whose execute_reply came and whose idle
        #: has not: parent msg_id -> (the reply's number, the request's raw header, the
        #: kernel's session).
        self._awaiting_idle: OrderedDict[str, tuple[int, bytes, str]] = OrderedDict()
        #: IOPub messages held back, in order: an ``idle`` with numbers missing below it,
        #: and what came after it, until the counters judged those numbers (so a gap
        #: record comes before the end of the execution it belongs to).
        self._held: list[KernelMessage] = []
        self._nudger: asyncio.Task[None] | None = None
        link.hub.observer = self._saw_reply
        link.hub.on_sent = self._sent

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def _sent(self, msg_id: str) -> None:
        if self.counters is not None:
            self.counters.sent(msg_id)

    def _saw_reply(self, channel: str, message: KernelMessage) -> None:
        self._saw(message, iopub=False)
        parent = message.parent_msg_id
        if message.msg_type == "execute_reply" and parent and self.counters is not None:
            counted = parse_counter(message.msg_id)
            if counted is not None:
                session = message.header().get("session")
                self._awaiting_idle[parent] = (
                    counted[1],
                    message.raw_parent_header,
                    session if isinstance(session, str) else "",
                )
                while len(self._awaiting_idle) > MAX_AWAITING_IDLE:
                    self._awaiting_idle.popitem(last=False)
                # If its idle was lost and the kernel then goes quiet, no later number
                # would show the hole: a nudge makes the kernel number a few more.
                asyncio.get_running_loop().call_later(
                    2 * self.link.settings.reorder_window, self._nudge_if_awaiting, parent
                )

    def _nudge_if_awaiting(self, parent: str) -> None:
        connection = self._connection
        if parent in self._awaiting_idle and connection is not None and not self._stopped:
            self._nudge(connection)

    def _saw(self, message: KernelMessage, *, iopub: bool = True) -> None:
        """Count ``message`` against the kernel's counter; record what is found lost."""
        counters = self.counters
        if counters is None:
            return
        now = time.monotonic()
        counters.saw(
            message.msg_id,
            now,
            parent_msg_id=message.parent_msg_id,
            parent_msg_type=message.parent_msg_type,
            execution_state=message.execution_state,
            iopub=iopub,
        )
        if counters.pending or counters.next_deadline() is not None or self._held:
            self._judge(now)

    def _take(self, message: KernelMessage) -> None:
        """An IOPub message that passed intake: counted, then recorded, or held back
        behind an ``idle`` whose execution may still get a gap record."""
        counters = self.counters
        if counters is not None:
            counters.saw(
                message.msg_id,
                time.monotonic(),
                parent_msg_id=message.parent_msg_id,
                parent_msg_type=message.parent_msg_type,
                execution_state=message.execution_state,
            )
        if self._held or (
            counters is not None
            and message.execution_state == "idle"
            and counters.holds(message.msg_id)
        ):
            self._held.append(message)
            if len(self._held) > MAX_HELD and counters is not None:
                counters.judge_below(self._held[0].msg_id)
        else:
            self._record(message)
        if counters is not None and (
            counters.pending or counters.next_deadline() is not None or self._held
        ):
            self._judge(time.monotonic())

    def _record(self, message: KernelMessage) -> None:
        if self.link.chained and message.replayed:
            # An upstream kernel_gateway_stream killed before its last batch was written
            # had relayed some of it to us already; its launcher kernel publishes what was
            # not durable again when it starts, and it numbers those afresh (a seq past
            # the one we resume from) and marks them: recorded once, by msg_id.
            self.sink.record_replayed(message)
        else:
            self.sink.record_message(message)
        self.sink.batch_received()
        if message.execution_state == "idle" and message.parent_msg_id:
            self._awaiting_idle.pop(message.parent_msg_id, None)

    def _release(self) -> None:
        """Record the held messages up to the next ``idle`` still waiting for a judgement."""
        counters = self.counters
        while self._held:
            first = self._held[0]
            if (
                counters is not None
                and first.execution_state == "idle"
                and counters.holds(first.msg_id)
            ):
                return
            self._record(self._held.pop(0))

    def _judge(self, now: float) -> None:
        counters = self.counters
        if counters is None:
            return
        lost = counters.poll(now)
        if lost is not None:
            self.upstream_lost += lost.count
            self.log.warning(
                "Upstream kernel %s: %s%d messages numbered %d..%d never arrived",
                self.link.kernel_id,
                "at most " if lost.bound else "",
                lost.count,
                lost.first,
                lost.last,
            )
            self.sink.record_gap("upstream_lost", lost.count)
            self._end_executions_after(lost)
        self._release()
        deadline = counters.next_deadline()
        if self._poll_timer is not None:
            self._poll_timer.cancel()
            self._poll_timer = None
        if deadline is not None and not self._stopped:
            self._poll_timer = asyncio.get_running_loop().call_later(
                max(0.0, deadline - now) + 0.01, self._on_poll_timer
            )

    def _end_executions_after(self, lost: Lost) -> None:
        """Executions whose execute_reply came and whose ``idle`` is among the numbers
        just found lost (ipykernel numbers it right after the reply, or one or two later
        when its IOPub thread numbers output meanwhile) end: the gateway records the
        ``idle`` the kernel published and the upstream lost, marked as the gateway's
        (``metadata.kernel_gateway_stream_synthesized``), after the gap record (so the
        execution's summary lists the gap)."""
        for parent, (reply_number, request_header, session) in list(self._awaiting_idle.items()):
            if not any(lost.covers(reply_number + step) for step in (1, 2, 3)):
                continue
            del self._awaiting_idle[parent]
            header = {
                "msg_id": uuid.uuid4().hex,
                "msg_type": "status",
                "username": "kernel_gateway_stream",
                "session": session,
                "date": _now_iso(),
                "version": "5.3",
            }
            metadata = {SYNTHESIZED_METADATA_KEY: {"reason": "upstream_lost"}}
            idle = KernelMessage.from_parts(
                [
                    dumps_json(header),
                    request_header,
                    dumps_json(metadata),
                    dumps_json({"execution_state": "idle"}),
                ],
                repair=True,
            )
            self.log.warning(
                "Upstream kernel %s: the idle of %s was lost; the execution ends",
                self.link.kernel_id,
                parent,
            )
            self.sink.record_message(idle)

    def _on_poll_timer(self) -> None:
        self._poll_timer = None
        self._judge(time.monotonic())

    async def _run(self) -> None:
        attempt = 0
        connected_before = False
        while not self._stopped:
            if self.link.chained is None:
                await self.link.identify()
            since = self.upstream_seq
            try:
                connection = await self.link.connect(self._session_id, since)
            except Exception as error:  # refused, timed out, 404, TLS...: retry
                if self._stopped:
                    return
                self._unreachable(f"{type(error).__name__}: {error}")
                if await self._gone(error):
                    return
                await asyncio.sleep(_backoff(self.link.settings, attempt))
                attempt += 1
                continue
            attempt = 0
            self._missing_since = None
            self._connection = connection
            if connected_before:
                self.reconnects += 1
            if not self.reachable:
                self.reachable = True
                self.log.warning("Upstream kernel %s is reachable again", self.link.kernel_id)
                # Resumed by seq from an upstream kernel_gateway_stream: nothing missed.
                self.sink.link_changed(True, "upstream_reconnected", 0 if since else None)
            elif connected_before:
                self.sink.link_changed(True, "upstream_reconnected", 0 if since else None)
            connected_before = True
            self.link.hub.attach(connection)
            self._nudge_until_ready(connection)
            try:
                await self._read(connection)
            finally:
                self.link.hub.detach()
                # What a dropped connection missed is the reconnection's gap record.
                if self.counters is not None:
                    self.counters.reset()
                self._hand_over_held()
            self._connection = None
            if not self._stopped:
                self._unreachable("the upstream closed the connection")
                await asyncio.sleep(_backoff(self.link.settings, 0))

    def _unreachable(self, why: str) -> None:
        if self.reachable:
            self.reachable = False
            self.log.warning("Upstream kernel %s is unreachable: %s", self.link.kernel_id, why)
            self.sink.link_changed(False, "upstream_unreachable", None)

    async def _gone(self, error: Exception) -> bool:
        """True once the upstream has said for ``gone_after`` seconds that the kernel does
        not exist (404 on its channels, then on its model) and ``on_gone`` was told, or
        once the source was stopped meanwhile."""
        on_gone = self.link.on_gone
        if on_gone is None or not (isinstance(error, HTTPClientError) and error.code == 404):
            self._missing_since = None
            return False
        exists = await self.link.exists()
        if self._stopped:
            return True
        if exists is not False:  # it has the kernel after all, or does not answer
            self._missing_since = None
            return False
        now = time.monotonic()
        if self._missing_since is None:
            self._missing_since = now
            self.log.warning(
                "The upstream says kernel %s does not exist: gone if it still says so in %ss",
                self.link.kernel_id,
                self.link.settings.gone_after,
            )
        if now - self._missing_since < self.link.settings.gone_after:
            return False
        self.log.warning(
            "Upstream kernel %s is gone: the upstream has it no more", self.link.kernel_id
        )
        self._stopped = True
        on_gone("upstream_kernel_gone")
        return True

    def _nudge_until_ready(self, connection: Connection) -> None:
        """Nudge until the kernel's IOPub answers (the Tap is ready): a nudge sent while
        the upstream still connects to a restarted kernel may be lost, and the Tap's
        clients wait for it to be ready."""
        if self._nudger is not None:
            self._nudger.cancel()
        self._nudger = asyncio.ensure_future(self._nudging(connection))

    async def _nudging(self, connection: Connection) -> None:
        settings = self.link.settings
        deadline = time.monotonic() + settings.ready_timeout
        while not self._stopped and self._connection is connection:
            ready = self.sink.ready
            if ready.done():
                return
            self._nudge(connection)
            try:
                await asyncio.wait_for(asyncio.shield(ready), settings.nudge_interval)
            except asyncio.TimeoutError:
                if time.monotonic() > deadline and not ready.done():
                    self.log.warning(
                        "No IOPub message from upstream kernel %s in %.0f s; going on unconfirmed",
                        self.link.kernel_id,
                        settings.ready_timeout,
                    )
                    ready.set_result(None)

    def _nudge(self, connection: Connection) -> None:
        """A kernel_info_request: its status messages prove the IOPub path live."""
        msg_id = uuid.uuid4().hex
        self._sent(msg_id)
        header = {
            "msg_id": msg_id,
            "msg_type": "kernel_info_request",
            "username": "kernel_gateway_stream",
            "session": self._session_id,
            "date": _now_iso(),
            "version": "5.4",
        }
        connection.write("shell", [dumps_json(header), b"{}", b"{}", b"{}"])

    async def _read(self, connection: Connection) -> None:
        while True:
            data = await connection.socket.read_message()
            if data is None:
                return
            try:
                channel, parts = decode_upstream(data, connection.v1)
                if channel != "iopub":
                    self.link.hub.deliver(channel, KernelMessage.from_parts(parts, repair=True))
                    continue
                if self.link.chained:
                    metadata, seq = upstream_seq(parts[2])
                    if seq is not None:
                        if self.upstream_seq is not None and seq <= self.upstream_seq:
                            self.replays += 1  # already recorded (an overlap on resume)
                            continue
                        self.upstream_seq = seq
                        parts[2] = metadata
                        self.counters = None
                message = KernelMessage.from_parts(parts, repair=True)
                if self.link.chained:
                    if message.msg_type == GAP_MSG_TYPE:
                        # The upstream's numbers are not ours: the gap is recorded afresh.
                        reason = message.content().get("reason")
                        self.sink.record_gap(f"upstream_{reason}"[:64], None)
                        continue
                else:
                    # What the kernel publishes through a server that relays anything: the
                    # gateway's own records are refused (see ..core.intake).
                    verdict = intake.check(message)
                    if isinstance(verdict, intake.Refuse):
                        self.rejected += 1
                        self._refused(verdict.reason)
                        # It came, numbered by the kernel's counter: no hole there.
                        self._saw(message)
                        continue
            except RemoteError as error:
                self.rejected += 1
                self.log.warning(
                    "Upstream kernel %s sent an invalid message: %s", self.link.kernel_id, error
                )
                continue
            self._take(message)

    def _refused(self, what: str) -> None:
        """Log a refusal, at most once a minute (a kernel can send a great many)."""
        now = time.monotonic()
        if now - self._refusals_logged >= 60.0:
            self._refusals_logged = now
            self.log.warning(
                "Upstream kernel %s sent %s; refused %d messages so far",
                self.link.kernel_id,
                what,
                self.rejected,
            )

    def reconnect(self) -> None:
        """After a restart: the upstream keeps the connection. A nudge, so the kernel's
        new session answers the gateway and its counter is watched (see
        :mod:`..core.upstream_counters`)."""
        if self._connection is not None and not self._stopped:
            self._nudge_until_ready(self._connection)

    def drain(self) -> None:
        """Record what is held back now, after judging the numbers missing below it."""
        self._hand_over_held()

    def _hand_over_held(self) -> None:
        counters = self.counters
        if not self._held:
            return
        if counters is not None:
            for message in reversed(self._held):
                if message.execution_state == "idle":
                    counters.judge_below(message.msg_id)
                    break
            self._judge(time.monotonic())
        while self._held:
            self._record(self._held.pop(0))

    def acknowledge(self, msg_id: str) -> None:
        """An upstream's kernel keeps nothing for the gateway: nothing to tell it."""

    def stop(self) -> None:
        # Stopped, the source records nothing more (the gateway shuts down, or another
        # node took the kernel over): what is held back (an ``idle`` and what followed it,
        # for at most the reordering window) is left, as any message on its way is.
        self._held.clear()
        self._stopped = True
        if self._nudger is not None:
            self._nudger.cancel()
            self._nudger = None
        if self._poll_timer is not None:
            self._poll_timer.cancel()
            self._poll_timer = None
        if self._connection is not None:
            self._connection.socket.close()
        if self._task is not None:
            self._task.cancel()


def _now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()
