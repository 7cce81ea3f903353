"""``/api/kernels/{id}/channels``: a drop-in for jupyter_server's kernel WebSocket.

Shell, control and stdin work as in jupyter_server: each client session has its own
DEALER sockets with its session id as identity, so replies and ``input_request`` reach the
client that asked (see :mod:`.sessions`: they outlive a dropped connection for a grace
period, and replies that came meanwhile reach the client when it returns). They are opened
at the session's first request, not before: a client that only watches costs no ZMQ
sockets (a thousand watchers of one kernel cost one IOPub socket), and that first request
waits until the kernel's stdin ROUTER knows the identity, so an ``input_request`` it causes
is never dropped. IOPub does not come from a socket of the connection's own: it comes from
the broker, coalesced and never dropped, replayed from the transcript on resume. Each
IOPub message carries ``metadata["kernel_gateway_stream"]["seq"]``.

Resume: ``?since=SEQ`` sends every IOPub message after SEQ, then live. Without it, a
client reconnecting with a ``session_id`` it used before gets what that session missed, and
any other client every message published after its socket opened (the 101), including what
came while the gateway was still setting the connection up.

Close codes and reasons: :mod:`..core.endings` (1007 malformed, 1001 kernel or gateway
shutdown, 4008 too slow; each with a JSON reason and, where it applies, ``last_seq``).
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
from tornado.iostream import IOStream, StreamClosedError
from tornado.websocket import WebSocketClosedError, WebSocketProtocol, WebSocketProtocol13
from traitlets import Any as AnyTrait
from traitlets import default

from ..broker.subscriber import Subscriber, TransportClosed
from ..core.endings import Ending, malformed
from ..core.errors import LocalError, MalformedMessage
from ..core.frames import Frame
from ..core.messages import Signer
from ..core.outputs import cell_request
from ..core.wire import Protocol, decode_incoming
from ..kernels.base import KernelChannels
from .common import KERNEL_ACTION, SETTINGS_KEY, Services, discarded_notice, parse_seq
from .sessions import KernelSession

__all__ = ["ChannelsHandler", "StreamChannelsConnection"]

#: Requests a connection holds while its kernel restarts (then it is closed as too busy).
MAX_HELD_REQUESTS = 1000
CLOSE_TRY_AGAIN_LATER = 1013


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


#: Frames of one write whose bytes add up to less than this are joined into one piece (a
#: small copy); larger writes go out as the frames themselves, which every client shares:
#: joining 100 clients' megabytes of large frames, each into a buffer of its own, cost
#: more than a third of the daemon's CPU (allocating, copying and freeing them).
JOIN_BELOW = 64 * 1024
#: At most this many pieces in one ``sendmsg`` (Linux's IOV_MAX is 1,024); more are joined.
SENDMSG_MAX = 512


def _write_after(stream: IOStream, pieces: list[bytes], skip: int) -> asyncio.Future[None]:
    """Hand ``pieces`` but their first ``skip`` bytes to tornado's stream, without joining
    them (it keeps a view of each large one, and writes it when the socket takes more).
    The last write's future resolves once everything before it is written too."""
    future = None
    for piece in pieces:
        if skip >= len(piece):
            skip -= len(piece)
            continue
        future = stream.write(memoryview(piece)[skip:] if skip else piece)
        skip = 0
    assert future is not None  # called only when something is left to write
    return future


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
        self.subscriber: Subscriber | None = None
        self.kernel_session: KernelSession | None = None
        #: Requests waiting for the Tap (a restart) or the stdin handshake, in order.
        self._held: list[tuple[str, list[bytes]]] = []
        self._releasing: asyncio.Future[None] | None = None
        self._closed = False
        self._counted = False
        #: Why the gateway ended this connection, if it did (for the log).
        self._end_reason: str | None = None
        #: The handler and protocol, read once at connect: a trait's read costs a few µs,
        #: and the transport's methods run for every frame written to every client.
        self._handler: Any = None
        self._protocol = Protocol.LEGACY
        #: The kernel's head when the socket opened (see :meth:`prepare`).
        self._opened_at = 0

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

    @property
    def channels(self) -> dict[str, Any]:
        """The session's open kernel sockets by channel (none until a first request)."""
        channels = self.kernel_session.channels if self.kernel_session else None
        return dict(getattr(channels, "streams", {})) if channels is not None else {}

    async def prepare(self) -> None:
        """Before the upgrade: make sure the kernel is tapped and its IOPub subscription live."""
        self.tap = await self.services.taps.ensure(self.kernel_id)
        # The kernel's Tap signs and verifies with its key already: share its Signer.
        self.signer = self.tap.signer
        self.session.signer = self.signer
        await self.tap.ready
        # The head when the client is told the socket is open (the 101 follows): a client
        # that asked for no ``since`` gets everything after it, even what the kernel
        # publishes while :meth:`connect` still awaits (its cursor lookup reads the store).
        self._opened_at = self.services.broker.head(self.kernel_id)

    async def connect(self) -> None:
        # The handler checked ``since`` against the head before the upgrade; heads only grow.
        since: int | None = getattr(self.websocket_handler, "since", None)
        if since is None and self.client_session:
            since = await self.services.store.load_cursor(self.kernel_id, self.session_id)
            if since is not None:
                since = min(since, self.tap.head)
        live = since is None
        if live and self.services.broker.head(self.kernel_id) > self._opened_at:
            since = self._opened_at
        if self._closed:
            return  # the client left while we looked its cursor up; nothing to undo yet
        # From here to the Subscriber's start nothing awaits: a disconnect() that comes
        # later finds everything it has to undo.
        stale = self._open_sessions.get(self.session_key)
        if stale is not None:
            self.log.info("Replacing the stale connection of session %s", self.session_key)
            stale.websocket_handler.close()
            stale.disconnect()
        self._open_sessions[self.session_key] = self
        self._handler, self._protocol = self.websocket_handler, self.protocol
        # Frames are merged by the broker already; Nagle's algorithm would hold a small
        # one for the client's delayed ACK (~40 ms on Linux).
        self.websocket_handler.set_nodelay(True)
        self._shed_upgrade_state()
        services = self.services
        self.subscriber = Subscriber(
            self.kernel_id,
            services.broker,
            services.store,
            self,
            services.new_queue(since or 0),
            limits=services.replay,
            registry=services.subscribers,
        )
        self.kernel_session = services.sessions.get(self.tap, self.session_id)
        held = self.kernel_session.attach(self)
        self.multi_kernel_manager.notify_connect(self.kernel_id)
        self._counted = True
        self.log.info(
            "Client %s connected to kernel %s (%s, %s)",
            self.session_id,
            self.kernel_id,
            self.surface,
            "live" if live else f"resuming after seq {since}",
            extra={"kernel_id": self.kernel_id, "session_id": self.session_id,
                   "surface": self.surface, "since": None if live else since},
        )  # fmt: skip
        await self.subscriber.start(since, held, asked=not live)

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
            reason = self._end_reason or "client_closed"
            self.log.info(
                "Client %s of kernel %s left at seq %d (%s)",
                self.session_id,
                self.kernel_id,
                self.subscriber.last_seq,
                reason,
                extra={"kernel_id": self.kernel_id, "session_id": self.session_id,
                       "last_seq": self.subscriber.last_seq, "reason": reason},
            )  # fmt: skip
            if self.client_session:
                self.services.store.save_cursor(
                    self.kernel_id, self.session_id, self.subscriber.last_seq
                )
        if self._held and self._gate_open():
            # Sent just before the client left: it cannot answer input any more, but the
            # request still runs and its output is recorded.
            self._release()
        if self.kernel_session is not None:
            # A named session keeps its sockets for a while; requests still held are sent
            # once the kernel is ready (the release task does not need this connection).
            self.kernel_session.detach(self, keep=self.client_session)

    # -- client -> kernel ----------------------------------------------------------

    @property
    def surface(self) -> str:
        """Transport: what metrics call this kind of client."""
        return self.protocol.surface

    def handle_incoming_message(self, incoming_msg: Any) -> None:
        if self._closed:
            return
        try:
            message = decode_incoming(incoming_msg, self.protocol)
        except MalformedMessage as error:
            self.services.count_refused("malformed_message")
            self.log.info("Closing %s: %s", self.session_key, error)
            self.end(malformed(str(error)))
            return
        allowed = self.multi_kernel_manager.allowed_message_types
        if allowed and message.msg_type not in allowed:
            self.log.warning("Ignoring message of type %r, not allowed", message.msg_type)
            return
        assert self.kernel_session is not None
        self.kernel_session.open(self.session.bsession)
        if message.msg_type == "execute_request" and message.channel == "shell":
            cell = cell_request(message.parts)
            if cell is not None:
                # Recorded before the kernel can answer: a page reloaded later finds the
                # cell's output by it (``GET .../cells``).
                self.tap.record_request(*cell)
        if self._gate_open() and not self._held:
            self._send(message.channel, message.parts)
            return
        # Hold requests until the Tap sees IOPub (it is resubscribing after a restart), so
        # the output they cause is recorded, and until the stdin socket is known to the
        # kernel, so the input_request they cause arrives.
        if len(self._held) >= MAX_HELD_REQUESTS:
            self.end(Ending("too_many_requests", None, CLOSE_TRY_AGAIN_LATER))
            return
        self._held.append((message.channel, message.parts))
        if self._releasing is None:
            self._releasing = asyncio.ensure_future(self._release_when_ready())

    def _channels(self) -> KernelChannels | None:
        return self.kernel_session.channels if self.kernel_session is not None else None

    def _gate_open(self) -> bool:
        channels = self._channels()
        return self.tap.ready.done() and channels is not None and channels.ready.done()

    async def _release_when_ready(self) -> None:
        """Send the held requests once the Tap is ready (a restart replaces its ``ready``
        future while requests wait) and the stdin handshake is done."""
        try:
            while not self._gate_open():
                channels = self._channels()
                if channels is None or channels.closed:
                    return  # the session closed (its kernel shut down): nothing to send on
                waiting = self.tap.ready if not self.tap.ready.done() else channels.ready
                await asyncio.shield(waiting)
            self._release()
        finally:
            self._releasing = None

    def _release(self) -> None:
        held, self._held = self._held, []
        for channel, parts in held:
            self._send(channel, parts)

    def _send(self, channel: str, parts: list[bytes]) -> None:
        channels = self._channels()
        if channels is not None:
            channels.send(channel, parts)

    # -- kernel -> client (shell, control, stdin replies) ------------------------------

    def deliver(self, frame: Frame) -> None:
        """A reply to one of this client's requests (from its :class:`KernelSession`)."""
        if self.subscriber is not None and not self._closed:
            self.subscriber.reply(frame, time.monotonic())

    def handle_outgoing_message(self, stream: Any, outgoing_msg: list[Any]) -> None:
        """Unused: replies come through :meth:`deliver` (the ABC requires the method)."""

    # -- Transport, for the Subscriber ------------------------------------------------

    def is_open(self) -> bool:
        connection = self._handler.ws_connection
        return not self._closed and connection is not None and not connection.is_closing()

    async def send(self, frames: list[Frame]) -> None:
        pending = self.write_now(frames)
        try:
            if pending is not None:
                await pending
        except (WebSocketClosedError, StreamClosedError) as error:
            raise TransportClosed from error

    def write_now(self, frames: list[Frame]) -> asyncio.Future[None] | None:
        """Write ``frames`` to the socket now; the returned future resolves on flush.

        Without compression (jupyter_server's default) the frames go to the socket's
        stream whole, framed once for every client (:meth:`Frame.framed`), in one write
        (one ``send``, or one ``sendmsg`` of the shared frames when they are large):
        tornado's ``write_message`` would frame each again per client and wrap each write
        in a task, so the future of a write the socket took at once would still be pending
        and every next frame would wake the subscriber's writer (py-spy: half the daemon's
        CPU with 1,000 clients, a third of it making those tasks).

        On a plain TCP stream with nothing waiting to be written, the bytes go to the socket
        directly: a write the socket takes whole needs no future (tornado makes one per
        write, and a done callback). What it does not take, tornado's stream writes."""
        connection: WebSocketProtocol | None = self._handler.ws_connection
        if connection is None or connection.is_closing():
            raise TransportClosed
        stream = connection.stream
        if not (
            isinstance(connection, WebSocketProtocol13)
            and connection._compressor is None
            and not connection.mask_outgoing
            and stream is not None
        ):
            return self._write_messages(frames)
        protocol = self._protocol
        pieces = [frame.framed(protocol) for frame in frames]
        size = sum(map(len, pieces))
        if len(pieces) > 1 and (size <= JOIN_BELOW or len(pieces) > SENDMSG_MAX):
            pieces = [b"".join(pieces)]
        try:
            if type(stream) is IOStream and not stream.writing() and not stream.closed():
                try:
                    if len(pieces) == 1:
                        written = stream.socket.send(pieces[0])
                    else:
                        written = stream.socket.sendmsg(pieces)
                except BlockingIOError:
                    written = 0
                except OSError as error:  # reset, broken pipe: the client is gone
                    stream.close(exc_info=error)
                    raise TransportClosed from error
                if written == size:
                    return None
                return _write_after(stream, pieces, written)
            return _write_after(stream, pieces, 0)
        except StreamClosedError as error:
            raise TransportClosed from error

    def _write_messages(self, frames: list[Frame]) -> asyncio.Future[None] | None:
        """:meth:`write_now` through tornado's ``write_message`` (a compressed socket)."""
        protocol = self._protocol
        handler = self._handler
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

    def end(self, ending: Ending) -> None:
        self.services.subscribers.count_ending(ending.reason)
        self._end_reason = ending.reason
        if ending.reason == "slow_consumer":
            self.log.info("Disconnecting %s: %s (last seq %s)", self.session_key,
                          ending.message, ending.last_seq,
                          extra={"kernel_id": self.kernel_id, "reason": ending.reason,
                                 "last_seq": ending.last_seq})  # fmt: skip
        close_with_grace(self.websocket_handler, ending.code, ending.close_reason())


#: Seconds a client the gateway closes has to read what was sent before the close frame,
#: and the frame, before the connection is aborted. tornado gives it 5 s: a slow consumer
#: cut off with megabytes still in the socket's buffers, on a machine short of CPU, was
#: aborted before it reached the close, and never learned its reason or its last seq.
CLOSE_GRACE = 30.0


def close_with_grace(handler: Any, code: int, reason: str) -> None:
    """Close ``handler``'s WebSocket with ``code`` and ``reason``, and give the client
    :data:`CLOSE_GRACE` seconds (not tornado's 5) to read up to the close frame."""
    handler.close(code, reason)
    protocol = handler.ws_connection
    waiting = getattr(protocol, "_waiting", None)  # tornado's abort timer, if it set one
    if waiting is None:
        return
    loop = protocol.stream.io_loop
    loop.remove_timeout(waiting)
    protocol._waiting = loop.add_timeout(loop.time() + CLOSE_GRACE, protocol._abort)


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
        allowed = self.authorizer.is_authorized(self, user, KERNEL_ACTION, "kernels")
        if not await ensure_async(allowed):
            raise web.HTTPError(403)
        try:
            self.since = parse_seq("since", self.get_argument("since", None))
            await services.locate(kernel_id, self.since, running=True)
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

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        """As tornado's, without the request's URI, which may carry ``?token=``."""
        if not isinstance(value, web.HTTPError):
            kernel_id = self.path_kwargs.get("kernel_id")
            self.log.error("Uncaught exception in the channels socket of %s", kernel_id,
                           exc_info=(typ, value, tb))  # fmt: skip


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
