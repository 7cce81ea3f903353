"""``/api/kernels/{id}/channels``: a drop-in for jupyter_server's kernel WebSocket.

Shell, control and stdin work as in jupyter_server: each connection has its own
DEALER sockets with the client's session identity, so replies and ``input_request``
reach the client that asked. They are opened at the connection's first request, not
before: a client that only watches costs no ZMQ sockets (a thousand watchers of one kernel
cost one IOPub socket), and that first request waits until the kernel's stdin ROUTER knows
the identity, so an ``input_request`` it causes is never dropped. IOPub does not come from
a socket of the connection's own:
it comes from the broker, coalesced and never dropped, replayed from the transcript on
resume. Each IOPub message carries ``metadata["kernel_gateway_stream"]["seq"]``.

Resume: ``?since=SEQ`` sends every IOPub message after SEQ, then live. Without it, a
client reconnecting with a ``session_id`` it used before gets what that session missed.

Close codes (RFC 6455 section 7.4.2 reserves 4000-4999 for applications):

====  =========================================================================
1007  a frame that is not a Jupyter message of the negotiated protocol
1001  the kernel shut down
4008  too slow: the reason says ``last_seq``, resume with ``?since=last_seq``
====  =========================================================================
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, ClassVar

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import ws_authenticated
from jupyter_server.services.kernels.connection.base import BaseKernelWebsocketConnection
from jupyter_server.services.kernels.websocket import KernelWebsocketHandler
from tornado import web
from tornado.httputil import HTTPHeaders
from tornado.iostream import StreamClosedError
from tornado.websocket import WebSocketClosedError
from traitlets import Any as AnyTrait
from traitlets import default
from zmq.eventloop.zmqstream import ZMQStream

from ..broker.base import Subscriber, TransportClosed
from ..core.errors import (
    LocalError,
    MalformedMessage,
    RemoteError,
    SequenceAhead,
    UnknownKernel,
)
from ..core.frames import Frame
from ..core.messages import DELIMITER, KernelMessage, Signer, split_identities
from ..core.subscription import Overflow
from ..core.wire import Protocol, decode_incoming
from ..tap import connect_dealer
from .common import SETTINGS_KEY, Services, discarded_notice, parse_seq

__all__ = [
    "CLOSE_KERNEL_GONE",
    "CLOSE_MALFORMED",
    "CLOSE_SLOW",
    "ChannelsHandler",
    "StreamChannelsConnection",
    "close_subscribers",
]

CLOSE_MALFORMED = 1007
CLOSE_KERNEL_GONE = 1001
CLOSE_SLOW = 4008
CLOSE_LINGER_MS = 5000
#: Seconds a first request waits for the kernel to know the connection's stdin identity.
STDIN_HANDSHAKE_TIMEOUT = 5.0


class ConnectionSession:
    """What a channels connection needs of a jupyter_client ``Session``: the client's
    session id (also its DEALER identity) and signing with the kernel's key.

    jupyter_server gives every connection a full ``Session``, a configurable with dozens
    of traits; a thousand clients watching one kernel would each carry one.
    """

    __slots__ = ("session", "signer")

    def __init__(self) -> None:
        self.session = uuid.uuid4().hex
        self.signer: Signer | None = None

    @property
    def bsession(self) -> bytes:
        return self.session.encode()

    def send_raw(self, socket: Any, parts: list[bytes]) -> None:
        """Send ``[header, parent, metadata, content, *buffers]``, signed."""
        assert self.signer is not None, "prepare() sets the signer"
        socket.send_multipart([DELIMITER, self.signer.sign(parts), *parts])


class StreamChannelsConnection(BaseKernelWebsocketConnection):
    """One client's channels connection; ``ServerApp.kernel_websocket_connection_class``."""

    session = AnyTrait()  # a ConnectionSession, not a jupyter_client Session

    @default("session")
    def _connection_session(self) -> ConnectionSession:
        return ConnectionSession()

    #: Open connections by ``kernel_id:session_id``, to replace a stale one on reconnect.
    _open_sessions: ClassVar[dict[str, StreamChannelsConnection]] = {}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.channels: dict[str, Any] = {}
        self.subscriber: Subscriber | None = None
        self._held: list[tuple[str, list[bytes]]] = []
        #: The Tap's ``ready`` future that held requests wait on, if any.
        self._waiting_for: asyncio.Future[None] | None = None
        #: The stdin socket's monitor until the kernel knows our identity.
        self._stdin_monitor: ZMQStream | None = None
        self._closed = False
        self._counted = False

    @property
    def services(self) -> Services:
        services: Services = self.websocket_handler.settings[SETTINGS_KEY]
        return services

    @property
    def protocol(self) -> Protocol:
        return Protocol.from_subprotocol(self.websocket_handler.selected_subprotocol)

    @property
    def session_key(self) -> str:
        return f"{self.kernel_id}:{self.session_id}"

    async def prepare(self) -> None:
        """Before the upgrade: make sure the kernel is tapped and its IOPub subscription live."""
        self.tap = await self.services.taps.ensure(self.kernel_id)
        # The kernel's Tap signs and verifies with its key already: share its Signer.
        self.signer = self.tap.signer
        self.session.signer = self.signer
        await self.tap.ready

    async def connect(self) -> None:
        # The handler checked ``since`` against the head before the upgrade; heads only grow.
        since: int | None = getattr(self.websocket_handler, "since", None)
        if since is None and self.client_session:
            since = await self.services.store.load_cursor(self.kernel_id, self.session_id)
            if since is not None:
                since = min(since, self.tap.head)
        if self._closed:
            return  # the client left while we looked its cursor up; nothing to undo yet
        # From here to the Subscriber's start nothing awaits: a disconnect() that comes
        # later finds everything it has to undo.
        stale = self._open_sessions.get(self.session_key)
        if stale is not None:
            self.log.warning("Replacing stale connection %s", self.session_key)
            stale.websocket_handler.close()
            stale.disconnect()
        self._open_sessions[self.session_key] = self
        # Frames are merged by the broker already; Nagle's algorithm would hold a small
        # one for the client's delayed ACK (~40 ms on Linux).
        self.websocket_handler.set_nodelay(True)
        self._shed_upgrade_state()
        queue = self.services.new_queue(since or 0)
        self.subscriber = Subscriber(
            self.kernel_id, self.services.broker, self.services.store, self, queue
        )
        self.multi_kernel_manager.notify_connect(self.kernel_id)
        self._counted = True
        await self.subscriber.start(since)

    def _shed_upgrade_state(self) -> None:
        """Drop what only the upgrade needed and every connection would otherwise keep for
        its lifetime (a thousand idle clients, a few KiB each): the headers of the request
        and of the 101 response, the cookies parsed for authentication and the login
        cookie jupyter_server set."""
        handler = self.websocket_handler
        handler.__dict__.pop("_new_cookie", None)
        handler._headers = HTTPHeaders()
        handler.request.headers = HTTPHeaders()
        handler.request.__dict__.pop("_cookies", None)

    @property
    def client_session(self) -> bool:
        """True if the client named its session (``?session_id=``), so it can come back."""
        return bool(self.websocket_handler.get_argument("session_id", None))

    def disconnect(self) -> None:  # type: ignore[override]  # called without await
        if self._closed:
            return
        self._closed = True
        if self._open_sessions.get(self.session_key) is self:
            del self._open_sessions[self.session_key]
        if self._counted:
            self.multi_kernel_manager.notify_disconnect(self.kernel_id)
        if self.subscriber is not None:
            self.subscriber.close()
            if self.client_session:
                self.services.store.save_cursor(
                    self.kernel_id, self.session_id, self.subscriber.last_seq
                )
        self._stdin_handshaken()
        if self._held and self.tap.ready.done():
            # Sent just before the client left: it cannot answer input any more, but the
            # request still runs and its output is recorded.
            held, self._held = self._held, []
            for channel, parts in held:
                self._send(channel, parts)
        elif self._held:
            self.log.warning(
                "Dropping %d request(s) of %s: the client left while the kernel restarted",
                len(self._held),
                self.session_key,
            )
            self._held = []
        for stream in self.channels.values():
            if not stream.closed():
                stream.on_recv(None)
                # Linger: a request sent just before the client left still reaches the
                # kernel (its output is recorded with nobody watching).
                stream.close(linger=CLOSE_LINGER_MS)
        self.channels = {}

    def _open_channels(self) -> None:
        """The connection's shell, control and stdin DEALERs, at its first request."""
        identity = self.session.bsession
        info = self.kernel_manager.get_connection_info()
        context = self.services.taps.context
        for channel in ("shell", "control", "stdin"):
            stream, monitor = connect_dealer(context, info, channel, identity)
            stream.channel = channel  # type: ignore[attr-defined]
            stream.on_recv_stream(self.handle_outgoing_message)
            self.channels[channel] = stream
            if channel == "stdin":
                self._stdin_monitor = ZMQStream(monitor)
                self._stdin_monitor.on_recv(lambda _: self._stdin_handshaken(release=True))
            else:
                stream.socket.disable_monitor()
                monitor.close(linger=0)
        # If the kernel never answers the handshake (it died), send after a while anyway.
        loop = asyncio.get_running_loop()
        loop.call_later(STDIN_HANDSHAKE_TIMEOUT, self._stdin_handshaken, True)

    def _stdin_handshaken(self, release: bool = False) -> None:
        monitor, self._stdin_monitor = self._stdin_monitor, None
        if monitor is not None:
            stdin = self.channels.get("stdin")
            if stdin is not None and not stdin.closed():
                stdin.socket.disable_monitor()
            monitor.close(linger=0)
        if release:
            self._release_held(None)

    # -- client -> kernel ----------------------------------------------------------

    def handle_incoming_message(self, incoming_msg: Any) -> None:
        if self._closed:
            return
        try:
            message = decode_incoming(incoming_msg, self.protocol)
        except MalformedMessage as error:
            self.log.warning("Closing %s: %s", self.session_key, error)
            self._close(CLOSE_MALFORMED, {"reason": "malformed_message", "message": str(error)})
            return
        allowed = self.multi_kernel_manager.allowed_message_types
        if allowed and message.msg_type not in allowed:
            self.log.warning("Ignoring message of type %r, not allowed", message.msg_type)
            return
        if not self.channels:
            self._open_channels()
        if self._can_send() and not self._held:
            self._send(message.channel, message.parts)
            return
        # Hold requests until the Tap sees IOPub (it is resubscribing after a restart), so
        # the output they cause is recorded, and until the stdin socket is known to the
        # kernel, so the input_request they cause arrives.
        self._held.append((message.channel, message.parts))
        self._release_when_ready()

    def _can_send(self) -> bool:
        return self.tap.ready.done() and self._stdin_monitor is None

    def _release_when_ready(self) -> None:
        """Release the held requests when the Tap is ready: once per ``ready`` future, which
        a kernel restart replaces while requests wait."""
        ready = self.tap.ready
        if not ready.done() and self._waiting_for is not ready:
            self._waiting_for = ready
            ready.add_done_callback(self._release_held)

    def _release_held(self, _: Any) -> None:
        if self._closed:
            return
        if not self._can_send():
            self._release_when_ready()  # the stdin handshake or a new ready releases them
            return
        held, self._held = self._held, []
        for channel, parts in held:
            self._send(channel, parts)

    def _send(self, channel: str, parts: list[bytes]) -> None:
        stream = self.channels.get(channel)
        if stream is not None and not stream.closed():
            # Straight to the socket, not through ZMQStream's send queue, which a close
            # right after would discard.
            self.session.send_raw(stream.socket, parts)

    # -- kernel -> client (shell, control, stdin replies) ------------------------------

    def handle_outgoing_message(self, stream: Any, outgoing_msg: list[Any]) -> None:
        if self.subscriber is None or self._closed:
            return
        try:
            _, rest = split_identities([bytes(part) for part in outgoing_msg])
            if len(rest) < 5:
                raise MalformedMessage("reply too short")
            self.signer.verify(rest[0], rest[1:5])
            message = KernelMessage.from_parts(rest[1:])
        except RemoteError as error:
            self.log.warning("Dropped an invalid %s reply: %s", stream.channel, error)
            return
        self.subscriber.reply(Frame.reply(stream.channel, message), time.monotonic())

    # -- Transport, for the Subscriber ------------------------------------------------

    def is_open(self) -> bool:
        connection = self.websocket_handler.ws_connection
        return not self._closed and connection is not None and not connection.is_closing()

    async def send(self, frames: list[Frame]) -> None:
        pending = self.write_now(frames)
        try:
            if pending is not None:
                await pending
        except (WebSocketClosedError, StreamClosedError) as error:
            raise TransportClosed from error

    def write_now(self, frames: list[Frame]) -> asyncio.Future[None] | None:
        """Write ``frames`` to the socket now; the returned future resolves on flush."""
        protocol = self.protocol
        handler = self.websocket_handler
        pending = None
        try:
            for frame in frames:
                payload, binary = frame.encode(protocol)
                pending = handler.write_message(payload, binary=binary)
                # A client that drops mid-batch fails every write's future; nobody awaits
                # the earlier ones, so retrieve their errors (asyncio would log each).
                pending.add_done_callback(_retrieve)
        except (WebSocketClosedError, StreamClosedError) as error:
            raise TransportClosed from error
        return pending

    def discarded(self, first_seq: int, last_seq: int) -> Frame | None:
        return discarded_notice(first_seq, last_seq, self.session_id or "")

    def overflowed(self, overflow: Overflow) -> None:
        self.log.warning(
            "Disconnecting %s: %s (last seq %s)",
            self.session_key,
            overflow.reason,
            overflow.last_seq,
        )
        self._close(CLOSE_SLOW, {"reason": "slow_consumer", "last_seq": overflow.last_seq})

    def kernel_gone(self) -> None:
        last_seq = self.subscriber.last_seq if self.subscriber is not None else 0
        self._close(CLOSE_KERNEL_GONE, {"reason": "kernel_shutdown", "last_seq": last_seq})

    def _close(self, code: int, reason: dict[str, Any]) -> None:
        text = json.dumps(reason, separators=(",", ":"))
        self.websocket_handler.close(code, text[:123])


class ChannelsHandler(KernelWebsocketHandler):
    """jupyter_server's kernel WebSocket handler, validating before the upgrade.

    An unknown kernel gets 404 and a bad ``since`` 400, with a JSON reason, instead of a
    WebSocket that opens and breaks.
    """

    since: int | None = None

    @ws_authenticated
    async def get(self, kernel_id: str) -> None:  # type: ignore[override]
        services: Services = self.settings[SETTINGS_KEY]
        # Authorize before saying anything about the kernel (pre_get does it again).
        user = self.current_user
        if not await ensure_async(self.authorizer.is_authorized(self, user, "execute", "kernels")):
            raise web.HTTPError(403)
        try:
            self.since = parse_seq("since", self.get_argument("since", None))
            if kernel_id not in self.kernel_manager:
                raise UnknownKernel(kernel_id)
            tap = await services.taps.ensure(kernel_id)
            if self.since is not None and self.since > tap.head:
                raise SequenceAhead(self.since, tap.head)
        except LocalError as error:
            self.set_status(error.status)
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(error.to_json()))
            return
        await super().get(kernel_id)

    def on_close(self) -> None:
        if self.connection is not None:
            self.connection.disconnect()
            self.connection = None


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


#: Seconds a client of a kernel that shut down gets to receive what was queued for it.
END_DRAIN_SECONDS = 10.0


def close_subscribers(kernel_id: str, subscribers: list[Subscriber]) -> None:
    """TapManager ``on_close`` callback: send each client what is queued for it (the
    kernel's last output), then tell it the kernel is gone."""
    for subscriber in subscribers:
        task = asyncio.ensure_future(subscriber.end(END_DRAIN_SECONDS))
        _ending.add(task)  # asyncio keeps only weak references to running tasks
        task.add_done_callback(_ending.discard)


_ending: set[asyncio.Future[None]] = set()
