"""Every client of an upstream kernel on the gateway's one WebSocket to it.

An upstream server (jupyter_server, Enterprise Gateway, another kernel_gateway_stream)
makes one ZMQ subscription and one re-encode of every IOPub message per WebSocket; a
second WebSocket to the same kernel doubles its work, and a kernel that outruns its
server drops IOPub (ipykernel's PUB socket past its high-water mark). So the gateway opens
exactly one WebSocket per upstream kernel, its Tap's (:class:`.upstream.UpstreamIOPubSource`),
and every client connection of that kernel (channels WebSocket, execute API, SSE input)
sends its shell, control and stdin messages on it. The rules:

* A request (a message whose type ends in ``_request``) is remembered by its ``msg_id``
  with the client channels that sent it (:class:`ReplyRoutes`).
* A message the kernel sends on shell, control or stdin goes to the channels whose request
  is its ``parent_header.msg_id`` (the Jupyter messaging spec: a reply's parent is the
  request), and to nobody else. A ``*_reply`` on shell or control ends the route; an
  ``input_request`` on stdin does not (its ``execute_reply`` comes after the
  ``input_reply``), so it reaches only the client that asked, and that client's
  ``input_reply`` goes back on the same connection, where the upstream's stdin socket for
  it is.
* Replies to the gateway's own requests (the Tap's ``kernel_info_request`` nudges) and to
  requests whose client left match no route: they reach no client.
* Channels that close take their routes with them (bounded by :data:`MAX_ROUTES` per
  channels besides): nothing stays pending for a client that left. A request sent just
  before it left still goes upstream; its output is recorded, its reply dropped.
* While the WebSocket is down (the source reconnects with backoff) messages wait, at most
  :data:`MAX_HELD`, and go out in order once it is open again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from ..core.errors import MalformedMessage, RemoteError
from ..core.messages import KernelMessage, load_json_object
from .base import ReplyCallback

__all__ = ["MAX_HELD", "MAX_ROUTES", "ReplyRoutes", "UpstreamChannels", "UpstreamHub"]

#: Messages held while the upstream WebSocket is not open (past it they are dropped, and
#: counted).
MAX_HELD = 1000
#: Requests awaiting a reply per client channels; past it the oldest route is forgotten
#: (a client that sends requests the kernel never answers must not grow the gateway).
MAX_ROUTES = 10_000


class ReplyRoutes:
    """Which owner sent which request: pure bookkeeping, no I/O.

    ``owner`` is any hashable object (the gateway passes :class:`UpstreamChannels`).
    """

    def __init__(self, max_routes: int = MAX_ROUTES) -> None:
        self.max_routes = max_routes
        self._owner_of: dict[str, Any] = {}
        self._routes_of: dict[Any, OrderedDict[str, None]] = {}
        #: Routes forgotten past ``max_routes``.
        self.forgotten = 0

    def __len__(self) -> int:
        return len(self._owner_of)

    def sent(self, owner: Any, msg_id: str, msg_type: str) -> None:
        """``owner`` sent ``msg_id``: its replies go to ``owner``. Only requests are
        remembered: nothing answers a ``comm_msg`` or an ``input_reply``."""
        if not msg_id or not msg_type.endswith("_request"):
            return
        previous = self._owner_of.get(msg_id)
        if previous is not None and previous is not owner:
            self._routes_of[previous].pop(msg_id, None)
        self._owner_of[msg_id] = owner
        routes = self._routes_of.setdefault(owner, OrderedDict())
        routes[msg_id] = None
        routes.move_to_end(msg_id)
        while len(routes) > self.max_routes:
            oldest, _ = routes.popitem(last=False)
            self._owner_of.pop(oldest, None)
            self.forgotten += 1

    def route(self, channel: str, parent_msg_id: str, msg_type: str) -> Any | None:
        """The owner of the request ``parent_msg_id`` (None: nobody's, drop it). A reply
        on shell or control ends the route."""
        owner = self._owner_of.get(parent_msg_id)
        if owner is None:
            return None
        if channel in ("shell", "control") and msg_type.endswith("_reply"):
            del self._owner_of[parent_msg_id]
            self._routes_of[owner].pop(parent_msg_id, None)
        return owner

    def forget(self, owner: Any) -> None:
        """``owner`` closed: its routes go."""
        for msg_id in self._routes_of.pop(owner, ()):
            if self._owner_of.get(msg_id) is owner:
                del self._owner_of[msg_id]

    def pending(self, owner: Any) -> int:
        return len(self._routes_of.get(owner, ()))


class Writer(Protocol):
    """The open upstream WebSocket, as the hub needs it."""

    def write(self, channel: str, parts: list[bytes]) -> None:
        """Send one message; raises :class:`MalformedMessage` if the protocol cannot
        carry it."""


class UpstreamHub:
    """One upstream kernel's WebSocket, shared: the source attaches the socket when it is
    open and hands over every shell, control and stdin message it reads; client channels
    send through it. Made by :class:`.upstream.UpstreamKernelLink`, one per kernel."""

    def __init__(self, log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        self.log = log
        self.routes = ReplyRoutes()
        self._writer: Writer | None = None
        self._held: list[tuple[str, list[bytes]]] = []
        #: Messages dropped while the WebSocket was down, past :data:`MAX_HELD`.
        self.dropped = 0
        #: Replies that matched no route (the gateway's own requests, clients that left).
        self.unrouted = 0
        #: Called with every message read on shell, control and stdin, before routing.
        self.observer: Callable[[str, KernelMessage], None] | None = None
        #: Called with the msg_id of every request sent.
        self.on_sent: Callable[[str], None] | None = None

    @property
    def open(self) -> bool:
        return self._writer is not None

    def attach(self, writer: Writer) -> None:
        """The source's WebSocket is open: send what waited, in order."""
        self._writer = writer
        held, self._held = self._held, []
        for channel, parts in held:
            self._write(channel, parts)

    def detach(self) -> None:
        """The source's WebSocket closed."""
        self._writer = None

    def send(self, owner: Any, channel: str, parts: list[bytes]) -> None:
        """Send ``[header, parent, metadata, content, *buffers]`` for ``owner``."""
        try:
            header = load_json_object(parts[0], "header")
        except RemoteError as error:  # the handler decoded it already: not expected
            self.log.warning("Not sent upstream: %s", error)
            return
        msg_id, msg_type = header.get("msg_id"), header.get("msg_type")
        if isinstance(msg_id, str) and isinstance(msg_type, str):
            if owner is not None:
                self.routes.sent(owner, msg_id, msg_type)
            if self.on_sent is not None and msg_type.endswith("_request"):
                self.on_sent(msg_id)
        if self._writer is None:
            if len(self._held) < MAX_HELD:
                self._held.append((channel, parts))
            else:
                self.dropped += 1
            return
        self._write(channel, parts)

    def _write(self, channel: str, parts: list[bytes]) -> None:
        assert self._writer is not None
        try:
            self._writer.write(channel, parts)
        except MalformedMessage as error:
            self.log.warning("Not sent upstream: %s", error)

    def deliver(self, channel: str, message: KernelMessage) -> None:
        """A message the kernel sent on shell, control or stdin: to the channels whose
        request it answers, else nowhere."""
        if self.observer is not None:
            self.observer(channel, message)
        parent = message.parent_msg_id
        owner = self.routes.route(channel, parent, message.msg_type) if parent else None
        if owner is None:
            self.unrouted += 1
            return
        owner.on_reply(channel, message)

    def forget(self, owner: Any) -> None:
        self.routes.forget(owner)


class UpstreamChannels:
    """One client's shell, control and stdin to an upstream kernel, on the kernel's one
    WebSocket (see the module docstring). Made by
    :meth:`.upstream.UpstreamKernelLink.channels`."""

    def __init__(self, hub: UpstreamHub, identity: bytes, on_reply: ReplyCallback) -> None:
        self.hub = hub
        self.session_id = identity.decode(errors="replace")
        self.on_reply = on_reply
        # Nothing to shake hands over: the upstream's stdin socket for the shared
        # WebSocket exists as long as the WebSocket does, and the hub holds messages
        # while it reconnects.
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.ready.set_result(None)
        self.handshaken = True
        self._closed = False

    def send(self, channel: str, parts: list[bytes]) -> None:
        if not self._closed:
            self.hub.send(self, channel, parts)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, linger_ms: int = 0) -> None:
        """Forget this client's pending requests. What it sent is on the shared socket
        already (``linger_ms`` has nothing to wait for)."""
        if not self._closed:
            self._closed = True
            self.hub.forget(self)
