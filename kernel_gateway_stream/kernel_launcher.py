"""Start ipykernel with an IOPub socket that queues instead of dropping.

``python -m kernel_gateway_stream.kernel_launcher -f CONNECTION_FILE`` is
``python -m ipykernel_launcher -f CONNECTION_FILE`` with one change: the kernel's IOPub
socket gets ``SNDHWM=0`` before it binds. By default a PUB socket silently drops what it
cannot queue for a subscriber (1000 messages), which on a busy machine loses output of a
fast ``print`` loop before it ever reaches the gateway. With no high-water mark the
kernel holds the backlog in memory instead, and the gateway's Tap drains it.

The option must be set before ``bind``: libzmq copies a listening socket's options when
it binds, and every subscriber's queue inherits them.

It also **keeps what it published until the gateway says it is durable.** A PUB socket
forgets a message once it is sent: what the gateway had received but not yet made durable
when it was killed, or what was on its way to it, would be gone. Once a gateway
acknowledges (it sends, upstream on the same IOPub connection, an XSUB talking to ipykernel
7's XPUB, one signed frame naming the last message of this kernel it has made durable:
``ACK_PREFIX``, then the HMAC of the payload with the kernel's key, then ``{"msg_id":
...}``; before it subscribes, the gateway sends one with ``"msg_id": null``, so that what
the kernel sends before anything is durable is kept too), this kernel keeps every message
it sends in a ring (up to
:attr:`LosslessIOPubKernelApp.iopub_hold_bytes`, the oldest let go beyond, and counted)
until an acknowledgement names it or a later one. While no subscription is active, what the
kernel publishes is not sent at all, only kept, acknowledged or not. When a subscriber
comes (the gateway, started again and re-attaching the kernel, or another node taking it
over; every subscription is heard: the socket is ``XPUB_VERBOSE``), the kernel first
publishes a notice (``kernel_gateway_stream_spool``, content ``{"held", "sent",
"dropped", "evicted", "acked", "acks"}``) and then everything in the ring, in order: what it
had sent and was never acknowledged, each message wrapped in one of its own
(``kernel_gateway_stream_replay``: a subscriber already listening must not get the same
signed message twice), then what it held while nobody listened, as it is. The gateway
records what its transcript does not have yet (it knows the messages it recorded last by
their ``msg_id``) and nothing twice. ``held`` counts what follows the notice, ``sent`` the
first of those (published before, and not acknowledged), ``dropped`` messages let go
before anyone received them (lost for certain), ``evicted`` messages let go after they were sent but
before they were acknowledged (lost if the gateway had not made them durable), ``acked`` is
the last ``msg_id`` acknowledged. Where nobody acknowledges (a stock server in front of the
kernel), only what was held while nobody listened is kept, and only the first subscriber
gets the notice. The first subscriber of a new kernel gets what the kernel published before
it connected, too (no slow-joiner loss).
"""

from __future__ import annotations

import collections
import hmac
import inspect
import ipaddress
import json
import logging
import threading
from typing import Any

import zmq
from ipykernel import kernelapp
from ipykernel.iostream import MASTER, IOPubThread
from ipykernel.kernelapp import IPKernelApp
from traitlets import Int

from .core.marks import ACK_PREFIX, REPLAY_MSG_TYPE, SPOOL_MSG_TYPE
from .core.messages import DELIMITER

__all__ = ["HoldingIOPubThread", "LosslessIOPubKernelApp", "main"]

#: Seconds between two reads of what subscribers sent upstream (see ``_read_upstream``).
UPSTREAM_POLL = 0.05


#: ipykernel 7's IOPubThread takes the session (for its welcome message); 6's does not.
_IOPUB_TAKES_SESSION = "session" in inspect.signature(IOPubThread.__init__).parameters


class HoldingIOPubThread(IOPubThread):
    """ipykernel's IOPub thread, keeping what it publishes until it is acknowledged and
    holding it while no subscription is active (see the module docstring). Everything here
    runs on the IOPub thread: sends, subscriptions and acknowledgements alike."""

    #: Bytes kept at most; set by the kernel application.
    hold_bytes = 64 * 1024 * 1024

    def __init__(self, socket: Any, pipe: bool = False, session: Any = False) -> None:
        self._topics: set[bytes] = set()
        #: Messages published and not acknowledged, oldest first: ``[frames, msg_id]``
        #: (the msg_id read from the header when an acknowledgement first needs it).
        self._ring: collections.deque[list[Any]] = collections.deque()
        self._ring_bytes = 0
        #: How many of the ring's newest messages were never sent (nobody listened).
        self._unsent = 0
        #: Let go before they were sent (lost for certain), and after they were sent but
        #: before they were acknowledged (lost if the gateway had not made them durable),
        #: since the last notice.
        self._dropped = 0
        self._evicted = 0
        #: The last msg_id acknowledged, and whether any acknowledgement came: only then
        #: is what was sent kept (a stock server in front of the kernel never says).
        self._acked: str | None = None
        self._acks_seen = False
        is_xpub = hasattr(socket, "getsockopt") and socket.getsockopt(zmq.TYPE) == zmq.XPUB
        #: Only an XPUB hears subscriptions and acknowledgements: a PUB is never held.
        self._can_hold = is_xpub and bool(session)
        super().__init__(socket, pipe=pipe, session=session)

    def _handle_subscription(self, frames: list[Any]) -> None:
        for frame in frames:
            data = bytes(frame)
            if data[:1] == b"\x01":
                was_listened = bool(self._topics)
                self._topics.add(data[1:])
                # Every subscription is heard (the socket is XPUB_VERBOSE): libzmq notices
                # a subscriber gone only when it next sends, so the gateway started again
                # after a kill may come while the kernel still counts the dead one. Where
                # a gateway acknowledges, every new subscriber gets the notice and the
                # ring again (those already listening keep what they have: the gateway
                # knows each message it recorded); where nobody does (a stock server in
                # front of this kernel), only the first, as ever.
                if self._can_hold and (self._acks_seen or not was_listened):
                    self._release()
            elif data[:1] == b"\x00":
                self._topics.discard(data[1:])
            elif data.startswith(ACK_PREFIX) and self._can_hold:
                self._acknowledged(data[len(ACK_PREFIX) :])
        super()._handle_subscription(frames)  # ipykernel's iopub_welcome

    def _really_send(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        if not self._can_hold or self.closed or self._check_mp_mode() != MASTER:
            super()._really_send(msg, *args, **kwargs)
            return
        # Subscribers gone are noticed first (the message would go to a dead one).
        self._read_upstream()
        frames = [bytes(part) for part in msg]
        if self._topics:
            super()._really_send(frames, *args, **kwargs)
            if self._acks_seen:  # kept until acknowledged
                self._keep(frames)
        else:
            self._keep(frames)
            self._unsent += 1

    def start(self) -> None:
        super().start()
        if self._can_hold:
            self.io_loop.add_callback(self._poll_upstream)

    def _poll_upstream(self) -> None:
        if self.closed:
            return
        self._read_upstream()
        self.io_loop.call_later(UPSTREAM_POLL, self._poll_upstream)

    def _read_upstream(self) -> None:
        """Read what subscribers sent: subscriptions, unsubscriptions, acknowledgements.
        ipykernel reads them through a ZMQStream woken by the socket's edge-triggered fd,
        and a send on the same socket takes that edge: seen with ipykernel 7.4, nothing
        after the first subscription was read until the kernel next published, so a
        subscriber gone (the gateway killed) was not noticed, nor a new one. So they are
        read here before every send, and every :data:`UPSTREAM_POLL` seconds."""
        if threading.current_thread() is not self.thread:
            # Before the IOPub thread runs, ipykernel sends from the main thread: reading
            # there could race the thread's first poll on one socket (not thread-safe).
            return
        socket = self.socket
        while socket is not None and not socket.closed and socket.get(zmq.EVENTS) & zmq.POLLIN:
            self._handle_subscription(socket.recv_multipart(zmq.NOBLOCK))

    def _keep(self, frames: list[bytes]) -> None:
        self._ring.append([frames, None])
        self._ring_bytes += sum(len(part) for part in frames)
        while self._ring_bytes > self.hold_bytes and len(self._ring) > 1:
            let_go, _ = self._ring.popleft()
            self._ring_bytes -= sum(len(part) for part in let_go)
            if len(self._ring) < self._unsent:  # it was never sent
                self._unsent -= 1
                self._dropped += 1
            else:
                self._evicted += 1

    def _acknowledged(self, rest: bytes) -> None:
        """The gateway made everything up to a message durable: let go of it and of what
        came before. An acknowledgement not signed with the kernel's key is ignored, and
        one naming a message not in the ring (let go already) lets go of nothing."""
        signature, _, payload = rest.partition(b"\x00")
        try:
            expected = self.session.sign([payload])
            if not hmac.compare_digest(signature, expected):
                return
            msg_id = json.loads(payload)["msg_id"]
        except (ValueError, KeyError, TypeError):
            return
        self._acks_seen = True
        if not isinstance(msg_id, str):  # the gateway's hello: keep from now on
            return
        ring = self._ring
        for index in range(len(ring) - self._unsent):
            entry = ring[index]
            if entry[1] is None:
                entry[1] = _msg_id(entry[0])
            if entry[1] == msg_id:
                for _ in range(index + 1):
                    frames, _ = ring.popleft()
                    self._ring_bytes -= sum(len(part) for part in frames)
                self._acked = msg_id
                self._evicted = 0  # all older than this message: durable
                return

    def _release(self) -> None:
        """A subscriber came: the notice, then everything not acknowledged, in order: what
        was sent already wrapped (no subscriber may get one signed message twice), what
        was never sent as it is."""
        sent = len(self._ring) - self._unsent
        notice = {
            "held": len(self._ring),
            "sent": sent,
            "dropped": self._dropped,
            "evicted": self._evicted,
            "acked": self._acked,
            "acks": True,
        }
        self._dropped = self._evicted = self._unsent = 0
        self.session.send(self.socket, SPOOL_MSG_TYPE, notice)
        for index, (frames, _) in enumerate(self._ring):
            if index < sent:
                own = frames[frames.index(DELIMITER) + 1 :]  # signature, header, ... buffers
                self.session.send(self.socket, REPLAY_MSG_TYPE, {}, buffers=own)
            else:
                self.socket.send_multipart(frames)
        if not self._acks_seen:  # nobody will say it is durable: sent is let go of
            self._ring.clear()
            self._ring_bytes = 0


def _msg_id(frames: list[bytes]) -> str | None:
    """The msg_id in a message's header (the frame two after the delimiter)."""
    try:
        header = json.loads(frames[frames.index(DELIMITER) + 2])
        msg_id = header.get("msg_id")
    except (ValueError, IndexError, AttributeError):
        return None
    return msg_id if isinstance(msg_id, str) else None


class _LoopbackTransportNotice(logging.Filter):
    """ipykernel warns, at every start, that TCP carries messages unencrypted. Between the
    gateway and a kernel it started on the loopback interface nothing else is on the
    wire: the notice goes to INFO, so operators see warnings only for what needs them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("Kernel is running over TCP without encryption"):
            record.levelno, record.levelname = logging.INFO, "INFO"
            return record.levelno >= logging.getLogger(record.name).getEffectiveLevel()
        return True


class LosslessIOPubKernelApp(IPKernelApp):
    """ipykernel's kernel application with an IOPub socket that never drops."""

    iopub_hold_bytes = Int(
        64 * 1024 * 1024,
        config=True,
        help="Bytes of IOPub messages kept until the gateway says they are durable, and held "
        "while no subscriber listens (the gateway is down); the oldest are let go beyond, "
        "and counted. A kernel's option: add "
        "--LosslessIOPubKernelApp.iopub_hold_bytes=N to the kernel's command.",
    )

    def init_sockets(self) -> None:
        if self.transport == "tcp" and _loopback(self.ip):
            self.log.addFilter(_LoopbackTransportNotice())
        super().init_sockets()

    def init_iopub(self, context: zmq.Context[Any]) -> None:
        make_socket = context.socket

        def socket(socket_type: int, *args: Any, **kwargs: Any) -> Any:
            created = make_socket(socket_type, *args, **kwargs)
            if socket_type in (zmq.PUB, zmq.XPUB):
                created.setsockopt(zmq.SNDHWM, 0)
            if socket_type == zmq.XPUB:  # every subscription is heard, not just the first
                created.setsockopt(zmq.XPUB_VERBOSE, 1)
            return created

        context.socket = socket  # type: ignore[method-assign]
        HoldingIOPubThread.hold_bytes = self.iopub_hold_bytes
        # init_iopub makes ipykernel's IOPubThread by its module-level name. Only
        # ipykernel 7 (an XPUB, and a thread that takes the session) can hold.
        if _IOPUB_TAKES_SESSION:
            kernelapp.IOPubThread = HoldingIOPubThread  # type: ignore[attr-defined,misc]
        try:
            super().init_iopub(context)
        finally:
            del context.socket
            kernelapp.IOPubThread = IOPubThread  # type: ignore[attr-defined,misc]


def _loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return ip == "localhost"


def main() -> None:
    LosslessIOPubKernelApp.launch_instance()


if __name__ == "__main__":
    main()
