"""The gateway's ZMQ sockets on kernels: one context, DEALERs, and the stdin handshake.

Everything that talks to a kernel's shell, control or stdin channel (a client's channels
connection, the execute API) does it through :class:`KernelChannels`: three DEALERs with
one identity, and a ``ready`` future. The kernel's stdin ROUTER silently drops an
``input_request`` for an identity whose connection it does not know yet, so a request
that may ask for input waits for ``ready``: the stdin socket's monitor reports
``ZMQ_EVENT_HANDSHAKE_SUCCEEDED`` (or a timeout passes: the kernel may be gone, and the
request should go anyway).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import zmq
from zmq.eventloop.zmqstream import ZMQStream

from .core.messages import DELIMITER, Signer

__all__ = ["CHANNELS", "KernelChannels", "KernelSockets", "channel_url"]

CHANNELS = ("shell", "control", "stdin")

#: ``on_reply(channel, frames)``: a message a kernel sent on one of the channels.
ReplyCallback = Callable[[str, list[Any]], None]


def channel_url(info: dict[str, Any], channel: str) -> str:
    """The ZMQ address of a kernel's channel, from its connection info."""
    port = info[f"{channel}_port"]
    if info.get("transport", "tcp") == "ipc":
        return f"ipc://{info['ip']}-{port}"
    return f"tcp://{info['ip']}:{port}"


class KernelSockets:
    """Owns the ZMQ context every socket of the gateway is made in."""

    def __init__(self) -> None:
        self.context = zmq.Context()
        # One SUB per kernel plus three DEALERs per client that talks to a kernel: more
        # than libzmq's default of 1023 sockets on a busy gateway.
        self.context.set(zmq.MAX_SOCKETS, 65536)

    def channels(
        self,
        info: dict[str, Any],
        identity: bytes,
        on_reply: ReplyCallback,
        *,
        handshake_timeout: float,
    ) -> KernelChannels:
        """Open shell, control and stdin DEALERs with ``identity`` on a kernel."""
        return KernelChannels(self.context, info, identity, on_reply, handshake_timeout)

    def close(self) -> None:
        self.context.destroy(linger=0)


class KernelChannels:
    """shell, control and stdin DEALERs with one identity on one kernel; see the module
    docstring for :attr:`ready`. Made by :meth:`KernelSockets.channels`."""

    def __init__(
        self,
        context: zmq.Context[Any],
        info: dict[str, Any],
        identity: bytes,
        on_reply: ReplyCallback,
        handshake_timeout: float,
    ) -> None:
        loop = asyncio.get_running_loop()
        self.identity = identity
        self.ready: asyncio.Future[None] = loop.create_future()
        self.handshaken = False
        self.streams: dict[str, ZMQStream] = {}
        self._monitor: ZMQStream | None = None
        for channel in CHANNELS:
            socket = context.socket(zmq.DEALER)
            socket.setsockopt(zmq.IDENTITY, identity)
            socket.setsockopt(zmq.LINGER, 0)
            if channel == "stdin":
                monitor = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
                self._monitor = ZMQStream(monitor)
                self._monitor.on_recv(lambda _: self._handshake_done(True))
            socket.connect(channel_url(info, channel))
            stream = ZMQStream(socket)
            stream.on_recv(_deliver(on_reply, channel))
            self.streams[channel] = stream
        self._timer = loop.call_later(handshake_timeout, self._handshake_done, False)

    def _handshake_done(self, handshaken: bool) -> None:
        self._timer.cancel()
        monitor, self._monitor = self._monitor, None
        if monitor is not None:
            stdin = self.streams.get("stdin")
            if stdin is not None and not stdin.closed():
                stdin.socket.disable_monitor()
            monitor.close(linger=0)
        self.handshaken = handshaken
        if not self.ready.done():
            self.ready.set_result(None)

    def send(self, channel: str, parts: list[bytes], signer: Signer) -> None:
        """Send ``[header, parent, metadata, content, *buffers]``, signed, on ``channel``.
        Straight to the socket, not through ZMQStream's send queue, which a close right
        after would discard."""
        stream = self.streams.get(channel)
        if stream is not None and not stream.closed():
            stream.socket.send_multipart([DELIMITER, signer.sign(parts), *parts])

    @property
    def closed(self) -> bool:
        return not self.streams

    def close(self, linger_ms: int = 0) -> None:
        """Close the sockets; with ``linger_ms``, what was just sent still goes out."""
        self._handshake_done(self.handshaken)
        for stream in self.streams.values():
            if not stream.closed():
                stream.on_recv(None)
                stream.close(linger=linger_ms)
        self.streams = {}


def _deliver(on_reply: ReplyCallback, channel: str) -> Callable[[list[Any]], None]:
    def deliver(frames: list[Any]) -> None:
        on_reply(channel, frames)

    return deliver
