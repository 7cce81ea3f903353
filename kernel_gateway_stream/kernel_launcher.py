"""Start ipykernel with an IOPub socket that queues instead of dropping.

``python -m kernel_gateway_stream.kernel_launcher -f CONNECTION_FILE`` is
``python -m ipykernel_launcher -f CONNECTION_FILE`` with one change: the kernel's IOPub
socket gets ``SNDHWM=0`` before it binds. By default a PUB socket silently drops what it
cannot queue for a subscriber (1000 messages), which on a busy machine loses output of a
fast ``print`` loop before it ever reaches the gateway. With no high-water mark the
kernel holds the backlog in memory instead, and the gateway's Tap drains it.

The option must be set before ``bind``: libzmq copies a listening socket's options when
it binds, and every subscriber's queue inherits them.

It also **holds IOPub while nobody listens.** A PUB socket drops whatever it sends while
no subscriber is connected: what a cell printed while the gateway was down (killed, and
started again to re-attach the kernel) would be gone. ipykernel 7's IOPub socket is an
XPUB, which hears subscriptions come and go; while no subscription is active, this kernel
keeps what it publishes (up to :attr:`LosslessIOPubKernelApp.iopub_hold_bytes`, the oldest
dropped beyond) and, when a subscriber comes, first publishes a notice
(``kernel_gateway_stream_spool``, content ``{"held", "dropped"}``) and then what it held,
in order. The gateway's Tap reads the notice: nothing lost means no gap record for the
downtime; ``dropped`` messages are a gap of that size. The first subscriber of a new kernel
gets what the kernel published before it connected, too (no slow-joiner loss).
"""

from __future__ import annotations

import collections
import inspect
import ipaddress
import logging
from typing import Any

import zmq
from ipykernel import kernelapp
from ipykernel.iostream import MASTER, IOPubThread
from ipykernel.kernelapp import IPKernelApp
from traitlets import Int

from .core.marks import SPOOL_MSG_TYPE

__all__ = ["HoldingIOPubThread", "LosslessIOPubKernelApp", "main"]


#: ipykernel 7's IOPubThread takes the session (for its welcome message); 6's does not.
_IOPUB_TAKES_SESSION = "session" in inspect.signature(IOPubThread.__init__).parameters


class HoldingIOPubThread(IOPubThread):
    """ipykernel's IOPub thread, holding what it publishes while no subscription is active
    (see the module docstring). Everything here runs on the IOPub thread."""

    #: Bytes held at most; set by the kernel application.
    hold_bytes = 64 * 1024 * 1024

    def __init__(self, socket: Any, pipe: bool = False, session: Any = False) -> None:
        self._topics: set[bytes] = set()
        self._held: collections.deque[list[bytes]] = collections.deque()
        self._held_bytes = 0
        self._dropped = 0
        self._holding = False
        is_xpub = hasattr(socket, "getsockopt") and socket.getsockopt(zmq.TYPE) == zmq.XPUB
        #: Only an XPUB hears subscriptions: a PUB is never held.
        self._can_hold = is_xpub and bool(session)
        super().__init__(socket, pipe=pipe, session=session)

    def _handle_subscription(self, frames: list[Any]) -> None:
        was_listened = bool(self._topics)
        for frame in frames:
            data = bytes(frame)
            if data[:1] == b"\x01":
                self._topics.add(data[1:])
            elif data[:1] == b"\x00":
                self._topics.discard(data[1:])
        if self._can_hold and self._topics and not was_listened:
            self._release()
        super()._handle_subscription(frames)  # ipykernel's iopub_welcome

    def _really_send(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        if (
            self._can_hold
            and not self._topics
            and not self.closed
            and self._check_mp_mode() == MASTER
        ):
            self._hold([bytes(part) for part in msg])
            return
        super()._really_send(msg, *args, **kwargs)

    def _hold(self, frames: list[bytes]) -> None:
        self._held.append(frames)
        self._held_bytes += sum(len(part) for part in frames)
        while self._held_bytes > self.hold_bytes and len(self._held) > 1:
            dropped = self._held.popleft()
            self._held_bytes -= sum(len(part) for part in dropped)
            self._dropped += 1

    def _release(self) -> None:
        """A subscriber came: the notice, then what was held, in order."""
        held, self._held = self._held, collections.deque()
        dropped, self._dropped = self._dropped, 0
        self._held_bytes = 0
        self.session.send(self.socket, SPOOL_MSG_TYPE, {"held": len(held), "dropped": dropped})
        for frames in held:
            self.socket.send_multipart(frames)


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
        help="Bytes of IOPub messages held while no subscriber listens (the gateway is "
        "down); the oldest are dropped beyond, and counted. A kernel's option: add "
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
