"""Kernels reachable by ZMQ connection info: the one module of the gateway that opens ZMQ
sockets on kernels.

Kernels the gateway started, kernels attached by connection info (a connection file, a
kernel in a container or another host) and kernels in their own network namespace are all
reached this way. :class:`KernelSockets` owns the ZMQ context; for each kernel it makes a
:class:`ZmqKernelLink`, which makes

* the kernel's :class:`ZmqIOPubSource`: one SUB socket, read straight off its fd in bounded
  batches, every message's signature checked and verbatim replays refused before the Tap
  sees it; optionally a heartbeat that says when the kernel stops answering;
* :class:`ZmqChannels` per client: shell, control and stdin DEALERs with one identity.

ZMQ details that matter here:

* **Slow joiner.** A SUB socket misses whatever its PUB publishes before the subscription
  reaches it. The source therefore sends ``kernel_info_request`` on a shell socket of its
  own until an IOPub message arrives, and only then is the Tap ready; client connections
  and the execute API wait for that before they send the kernel anything.
* **No drops.** A kernel started through the gateway's launcher queues instead of
  dropping.
* **A byte budget.** ZMQ bounds its queue in messages, not bytes, so the socket's own
  queue is a few messages (:data:`SOCKET_HWM`) and the source reads the socket eagerly
  into a backlog of its own, bounded in bytes (``backlog_bytes``); what
  arrives while the backlog is full of bytes is not kept: one gap record says how many
  messages it was (``iopub_backlog_full``), in its place in the order. Full by count
  (``receive_hwm`` messages), the source stops reading, as it did without a backlog. A
  single message over ``max_message_bytes`` is recorded cut (see :mod:`..core.oversize`);
  its content and buffers are received without a copy, so it costs what libzmq holds,
  once, until it is cut. (``ZMQ_MAXMSGSIZE`` would refuse it in libzmq, but by dropping
  the whole connection: what the kernel sent next would be lost too, in a gap of unknown
  size.)
* **The stdin handshake.** The kernel's stdin ROUTER silently drops an ``input_request``
  for an identity whose connection it does not know yet, so a request that may ask for
  input waits for :attr:`ZmqChannels.ready`: the stdin socket's monitor reports
  ``ZMQ_EVENT_HANDSHAKE_SUCCEEDED`` (or a timeout passes: the kernel may be gone, and the
  request should go anyway).
* **Heartbeat.** For a kernel whose process the gateway cannot watch (attached, or behind
  a network that can fail), a REQ socket pings the kernel's heartbeat port; no echo for
  ``timeout`` seconds and the kernel is unreachable until it echoes again. Whether the
  IOPub connection itself dropped meanwhile (a SUB monitor sees it) decides whether output
  may have been lost: a TCP connection that survived a dead link delivers everything.
* **A subscriber's first messages.** libzmq applies a subscription as soon as it reads it
  off the connection, which may be inside one of the kernel's sends, and hands it to the
  kernel later: a kernel of the gateway's launcher that is already sending (someone else
  listens) may send the new subscriber a message or two, or the rest of another
  subscriber's release, before the notice and the replay of what it holds
  (tests/unit/test_launcher_subscriptions.py). Recorded as they came, those were ahead of
  older lines in the transcript, and after a restart they made a gap of what the replay
  then brought. So after subscribing the source holds what comes before the notice, for
  :data:`NOTICE_WAIT` seconds at most (a kernel that sends none is known by then, and its
  source does not wait again), and hands it over after the notice's replay, but for what
  the replay brought.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import zmq
import zmq.asyncio
from jupyter_client.session import Session
from zmq.eventloop.zmqstream import ZMQStream

from ..core import intake
from ..core.errors import BadSignature, InvalidMessage, MalformedMessage, RemoteError
from ..core.guards import DigestHistory
from ..core.marks import ACK_PREFIX, REPLAY_MSG_TYPE, SPOOL_MSG_TYPE
from ..core.messages import (
    DELIMITER,
    KernelMessage,
    Signer,
    invalid_placeholder,
    split_identities,
)
from ..core.oversize import cut_message, parts_size
from ..core.reserve import SMALL, fits
from ..memory import pin_mmap_threshold
from .base import IOPubSink, ReplyCallback

__all__ = [
    "CHANNELS",
    "HeartbeatSettings",
    "IOPubSettings",
    "KernelSockets",
    "ZmqChannels",
    "ZmqIOPubSource",
    "ZmqKernelLink",
    "channel_url",
    "decode_signed",
]

#: What a drain (before a mark, at a stop) reads at most of what has already arrived.
DRAIN_MAX_MESSAGES = 50_000
DRAIN_MAX_BYTES = 32 * 1024 * 1024
#: Messages read off the socket into the backlog in one turn, at most, as a multiple of
#: the batch processed in a turn (reading is cheap: a full backlog drops what it reads).
PULL_FACTOR = 8
#: What a message in the backlog costs besides its bytes: the list and the bytes objects.
BACKLOG_OVERHEAD = 400
#: Frames from here on (content, buffers) are received without a copy, and kept so when
#: larger than this: a large message is held once, in libzmq's buffer, until it is cut.
ZERO_COPY_FROM = 64 * 1024
#: Messages the IOPub socket itself queues (libzmq's receive high-water mark). ZMQ counts
#: messages, not bytes, so this is kept small: the source reads eagerly into its backlog,
#: which is bounded in bytes, and past these few the I/O thread stops reading the
#: connection (TCP holds the rest, then the kernel: its PUB socket's own queue, or, with
#: the gateway's launcher, the kernel's memory). 20,000 here let a kernel flooding 8 MiB
#: messages faster than the gateway could cut them park hundreds of MiB in libzmq.
SOCKET_HWM = 8
#: Largest signature frame accepted (a hex HMAC is at most 128 bytes).
MAX_SIGNATURE = 1024
#: Allocations from this size on are mmap()ed and unmapped when freed (see memory.py).
MMAP_THRESHOLD = 1024 * 1024
#: Nudges without an IOPub message after which the subscription is sent again.
RESUBSCRIBE_EVERY = 8
#: Once IOPub is live and the kernel has not answered yet, how many more requests a Tap sends
#: at most in ``ready_timeout`` (one every ``ready_timeout / READY_NUDGES``).
READY_NUDGES = 4
#: Seconds between two asks whether the sink takes messages again (see ZmqIOPubSource._read).
ROOM_POLL = 0.05
#: Seconds after subscribing that the source holds what comes before a launcher's notice
#: (see the module docstring: the launcher reads subscriptions every 0.05 s and before
#: every send), and the most bytes it holds so.
NOTICE_WAIT = 0.5
NOTICE_WAIT_BYTES = 4 * 1024 * 1024
#: What an XSUB sends to subscribe to everything, and to unsubscribe.
SUBSCRIBE_ALL, UNSUBSCRIBE_ALL = b"\x01", b"\x00"
#: Reason of the gap record for messages a full backlog could not keep.
BACKLOG_FULL = "iopub_backlog_full"
_REPLAY_TAG = f'"{REPLAY_MSG_TYPE}"'.encode()

#: ``[header, parent_header, metadata, content, *buffers]`` as received: bytes, or views
#: of libzmq's buffer for large frames.
Parts = list[bytes | memoryview]

CHANNELS = ("shell", "control", "stdin")

#: ``connection_info()``: a kernel's connection info as it is now (a restart may move ports).
InfoGetter = Callable[[], dict[str, Any]]


def _is_status(entry: list[bytes | memoryview] | KernelMessage | Replayed | None) -> bool:
    """Whether a message read off IOPub, small enough for the reserve, is a ``status``
    (only its header is parsed, and only when the backlog is full)."""
    if isinstance(entry, (KernelMessage, Replayed)):
        message = entry if isinstance(entry, KernelMessage) else entry.message
        return message.msg_type == "status"
    if entry is None or sum(map(len, entry)) > SMALL:
        return False
    try:
        _, rest = split_identities(entry)  # type: ignore[arg-type]
        header = json.loads(bytes(rest[1])) if len(rest) >= 5 else None
    except (ValueError, TypeError, MalformedMessage):
        return False
    return isinstance(header, dict) and header.get("msg_type") == "status"


def channel_url(info: dict[str, Any], channel: str) -> str:
    """The ZMQ address of a kernel's channel, from its connection info."""
    port = info[f"{channel}_port"]
    if info.get("transport", "tcp") == "ipc":
        return f"ipc://{info['ip']}-{port}"
    return f"tcp://{info['ip']}:{port}"


def connect(socket: Any, info: dict[str, Any], channel: str) -> None:
    """Connect ``socket`` to the kernel's ``channel``, over CurveZMQ where the connection
    info carries the kernel's keys (jupyter_server's ``transport_encryption``, jupyter_client
    8.8 and later): the kernel's sockets are CurveZMQ servers with its key pair, and a
    client authenticates the server by its public key. As jupyter_client does, the client
    side uses the same pair (nothing else to distribute); a process without the keys
    cannot complete the handshake, so reads nothing."""
    public, secret = info.get("curve_publickey"), info.get("curve_secretkey")
    if public and secret:
        public_key = public.encode() if isinstance(public, str) else public
        socket.curve_secretkey = secret.encode() if isinstance(secret, str) else secret
        socket.curve_publickey = public_key
        socket.curve_serverkey = public_key
    socket.connect(channel_url(info, channel))


def decode_signed(frames: list[Any], signer: Signer) -> KernelMessage:
    """A message from ZMQ frames, its signature checked.

    Raises:
        RemoteError: not a message, or a bad signature (BadSignature is one).
    """
    _, rest = split_identities([bytes(frame) for frame in frames])
    if len(rest) < 5:
        raise RemoteError(f"expected a signature and 4 parts, got {len(rest)} frames")
    signer.verify(rest[0], rest[1:5])
    return KernelMessage.from_parts(rest[1:], repair=True)


@dataclass(frozen=True)
class IOPubSettings:
    """How an IOPub source reads (the RecorderRegistry's options)."""

    receive_hwm: int
    receive_buffer: int
    batch: int
    batch_bytes: int
    nudge_interval: float
    ready_timeout: float
    replay_history: int
    refusal_log_interval: float
    #: A message over this many bytes is recorded cut (0: no limit).
    max_message_bytes: int = 0
    #: Of a cut stream message, this many bytes of text are kept.
    cut_keep_bytes: int = 64 * 1024
    #: Bytes of messages read and not yet recorded, at most (0: no bound).
    backlog_bytes: int = 0


@dataclass(frozen=True)
class HeartbeatSettings:
    """Ping every ``interval`` seconds; unreachable after ``timeout`` seconds without echo."""

    interval: float
    timeout: float


class KernelSockets:
    """Owns the ZMQ context every socket of the gateway is made in."""

    def __init__(self) -> None:
        # What kernels send arrives in large buffers (libzmq's, and the bytes decoded from
        # them): each is given back to the system when freed, not kept in an arena.
        pin_mmap_threshold(MMAP_THRESHOLD)
        self.context = zmq.Context()
        # One SUB per kernel plus three DEALERs per client that talks to a kernel: more
        # than libzmq's default of 1023 sockets on a busy gateway.
        self.context.set(zmq.MAX_SOCKETS, 65536)
        self.async_context = zmq.asyncio.Context.shadow(self.context.underlying)

    def link(
        self,
        kernel_id: str,
        connection_info: InfoGetter,
        *,
        key: bytes,
        signature_scheme: str,
        log: logging.Logger | logging.LoggerAdapter[Any],
    ) -> ZmqKernelLink:
        """How to reach a kernel by its connection info."""
        return ZmqKernelLink(self, kernel_id, connection_info, key, signature_scheme, log)

    async def probe(self, info: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        """The content of the kernel's ``kernel_info_reply`` to a request signed with
        ``info``'s key, or None if no correctly signed reply came within ``timeout``
        seconds (not running, wrong address or ports, or a wrong key: a kernel ignores a
        request whose signature does not match). Asked on control and on shell: a kernel
        busy running a cell answers on control (ipykernel does), an older one on shell."""
        key = info.get("key", "")
        key_bytes = key.encode() if isinstance(key, str) else key
        scheme = info.get("signature_scheme", "hmac-sha256")
        session = Session(key=key_bytes, signature_scheme=scheme, username="kernel_gateway_stream")
        signer = Signer(key_bytes, scheme)
        sockets = [self.async_context.socket(zmq.DEALER) for _ in ("control", "shell")]
        deadline = time.monotonic() + timeout
        try:
            asked: set[str] = set()
            for socket, channel in zip(sockets, ("control", "shell"), strict=True):
                socket.setsockopt(zmq.LINGER, 0)
                connect(socket, info, channel)
                request = session.msg("kernel_info_request")
                asked.add(request["header"]["msg_id"])
                # A send blocks while the socket has no peer (a CurveZMQ handshake that
                # cannot complete, without the kernel's keys): bounded by the timeout too.
                try:
                    await asyncio.wait_for(
                        socket.send_multipart(session.serialize(request)),
                        max(0.0, deadline - time.monotonic()),
                    )
                except asyncio.TimeoutError:
                    return None
            poller = zmq.asyncio.Poller()
            for socket in sockets:
                poller.register(socket, zmq.POLLIN)
            while (left := deadline - time.monotonic()) > 0:
                try:
                    ready = await poller.poll(left * 1000)
                except zmq.ZMQError:  # the gateway is stopping
                    return None
                for socket, _ in ready:
                    frames = await socket.recv_multipart()
                    try:
                        reply = decode_signed(frames, signer)
                    except RemoteError:
                        continue
                    if reply.parent_msg_id in asked:
                        content: dict[str, Any] = reply.content()
                        return content
            return None
        finally:
            for socket in sockets:
                socket.close(linger=0)

    async def ping(self, info: dict[str, Any], timeout: float) -> bool:
        """True if the kernel's heartbeat echoes within ``timeout`` seconds."""
        socket = self.async_context.socket(zmq.REQ)
        socket.setsockopt(zmq.LINGER, 0)
        try:
            connect(socket, info, "hb")
            # A send blocks while the socket has no peer: bounded as the echo is.
            await asyncio.wait_for(socket.send(b"ping"), timeout)
            await asyncio.wait_for(socket.recv(), timeout)
            return True
        except (asyncio.TimeoutError, zmq.ZMQError):  # no echo, or the gateway is stopping
            return False
        finally:
            socket.close(linger=0)

    def close(self) -> None:
        # The asyncio shadow's sockets first (heartbeats, probes still waiting): terminating
        # the context waits for every socket made in it, and the loop that would close
        # them is the one waiting.
        for socket in list(self.async_context._sockets):
            if not socket.closed:
                socket.close(linger=0)
        self.context.destroy(linger=0)


class ZmqKernelLink:
    """One kernel reachable by connection info (see :class:`..base.KernelLink`)."""

    kind = "zmq"

    def __init__(
        self,
        sockets: KernelSockets,
        kernel_id: str,
        connection_info: InfoGetter,
        key: bytes,
        signature_scheme: str,
        log: logging.Logger | logging.LoggerAdapter[Any],
    ) -> None:
        self.sockets = sockets
        self.kernel_id = kernel_id
        self.connection_info = connection_info
        self.key = key
        self.signature_scheme = signature_scheme
        self.signer = Signer(key, signature_scheme)
        self.log = log
        #: Set by the Tap's manager before :meth:`iopub`.
        self.settings: IOPubSettings | None = None
        self.heartbeat: HeartbeatSettings | None = None

    def iopub(self, sink: IOPubSink) -> ZmqIOPubSource:
        assert self.settings is not None
        return ZmqIOPubSource(self, sink, self.settings, self.heartbeat)

    def channels(
        self, identity: bytes, on_reply: ReplyCallback, *, handshake_timeout: float
    ) -> ZmqChannels:
        return ZmqChannels(self, identity, on_reply, handshake_timeout)


class ZmqChannels:
    """shell, control and stdin DEALERs with one identity on one kernel; see the module
    docstring for :attr:`ready`. Made by :meth:`ZmqKernelLink.channels`."""

    def __init__(
        self,
        link: ZmqKernelLink,
        identity: bytes,
        on_reply: ReplyCallback,
        handshake_timeout: float,
    ) -> None:
        loop = asyncio.get_running_loop()
        self.link = link
        self.identity = identity
        self.on_reply = on_reply
        self.ready: asyncio.Future[None] = loop.create_future()
        self.handshaken = False
        self.streams: dict[str, ZMQStream] = {}
        self._monitor: ZMQStream | None = None
        #: A read of every socket is scheduled (see :meth:`send`).
        self._catching_up = False
        info = link.connection_info()
        for channel in CHANNELS:
            socket = link.sockets.context.socket(zmq.DEALER)
            socket.setsockopt(zmq.IDENTITY, identity)
            socket.setsockopt(zmq.LINGER, 0)
            if channel == "stdin":
                monitor = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
                self._monitor = ZMQStream(monitor)
                self._monitor.on_recv(lambda _: self._handshake_done(True))
            connect(socket, info, channel)
            stream = ZMQStream(socket)
            stream.on_recv(self._deliver(channel))
            self.streams[channel] = stream
        self._timer = loop.call_later(handshake_timeout, self._handshake_done, False)

    def _deliver(self, channel: str) -> Callable[[list[Any]], None]:
        def deliver(frames: list[Any]) -> None:
            try:
                message = decode_signed(frames, self.link.signer)
            except RemoteError as error:
                self.link.log.warning(
                    "Dropped an invalid %s reply from %s: %s", channel, self.link.kernel_id, error
                )
                return
            self.on_reply(channel, message)

        return deliver

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

    def send(self, channel: str, parts: list[bytes]) -> None:
        """Send ``[header, parent, metadata, content, *buffers]``, signed, on ``channel``.
        Straight to the socket, not through ZMQStream's send queue, which a close right
        after would discard.

        A send takes the edge of the socket's notification fd: a reply that came in
        meanwhile is queued in the socket with the fd quiet, and the stream, woken only by
        the fd, never read it, nor any reply after it (JupyterLab then waited for ever for
        a create_subshell_reply, or a history_reply). So the stream reads what is queued
        once the send is done, as ZMQStream does after its own sends."""
        stream = self.streams.get(channel)
        if stream is not None and not stream.closed():
            stream.socket.send_multipart([DELIMITER, self.link.signer.sign(parts), *parts])
            if not self._catching_up:
                self._catching_up = True
                asyncio.get_running_loop().call_soon(self._catch_up)

    def _catch_up(self) -> None:
        """Deliver the replies queued in the sockets (see :meth:`send`)."""
        self._catching_up = False
        for stream in self.streams.values():
            if not stream.closed():
                stream.flush(zmq.POLLIN)

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


class ZmqIOPubSource:
    """A kernel's IOPub over one SUB socket, for its Tap (see the module docstring)."""

    def __init__(
        self,
        link: ZmqKernelLink,
        sink: IOPubSink,
        settings: IOPubSettings,
        heartbeat: HeartbeatSettings | None,
    ) -> None:
        self.link = link
        self.sink = sink
        self.settings = settings
        self.heartbeat = heartbeat
        self.log = link.log
        self.kernel_id = link.kernel_id
        self.session = Session(
            key=link.key, signature_scheme=link.signature_scheme, username="kernel_gateway_stream"
        )
        self.signer = link.signer
        self.history = DigestHistory(settings.replay_history)
        self.rejected = 0
        self.replays = 0
        #: Messages the launcher published again that this gateway had already.
        self.seen_again = 0
        self.invalid = 0
        self.reachable = True
        #: Times the IOPub connection dropped (a SUB monitor counts them).
        self.disconnects = 0
        #: Messages recorded cut (over max_message_bytes), and not kept (backlog full).
        self.cut = 0
        self.dropped = 0
        #: Read and not yet recorded: a message's parts and its cost, or the number of
        #: messages a full backlog dropped at that place.
        self._backlog: deque[tuple[Parts | KernelMessage | Replayed | None, int] | int] = deque()
        self._backlog_bytes = 0
        self._refusals_logged = 0.0
        self._socket: zmq.Socket[bytes] | None = None
        self._fd = -1
        self._monitor: ZMQStream | None = None
        self._nudger: asyncio.Task[None] | None = None
        #: Done once the kernel has published a ``busy`` or ``idle`` status since this
        #: source connected (None: nobody waits for it).
        self._answered: asyncio.Future[None] | None = None
        self._pinger: asyncio.Task[None] | None = None
        #: Set while the sink takes nothing (see _read).
        self._room_timer: asyncio.TimerHandle | None = None
        self._stopped = False
        #: Whether the kernel publishes a notice when this source subscribes (a kernel of
        #: the gateway's launcher); None until the first subscription tells.
        self.sends_notices: bool | None = None
        #: Set while what comes before the notice is held (see the module docstring).
        self._notice_timer: asyncio.TimerHandle | None = None
        self._before_notice: list[KernelMessage | Replayed] = []
        self._before_notice_bytes = 0
        #: Messages of the notice's replay still to come, and what came before the notice,
        #: handed over once they have (but for what the replay brought).
        self._replay_left = 0
        self._after_replay: list[KernelMessage | Replayed] = []

    def start(self) -> None:
        self._connect()
        if self.heartbeat is not None:
            self._pinger = asyncio.ensure_future(self._ping(self.heartbeat))

    def _connect(self) -> None:
        settings = self.settings
        info = self.link.connection_info()
        # An XSUB, not a SUB: it also sends upstream, what the gateway's launcher is told
        # is durable (see acknowledge()).
        socket = self.link.sockets.context.socket(zmq.XSUB)
        socket.setsockopt(zmq.RCVHWM, SOCKET_HWM)
        # The kernel's PUB socket drops what it cannot queue for us (1000 messages by
        # default) once the TCP buffers between us are full. A fresh connection starts with
        # a small receive buffer that autotuning grows only later, so a short stall of our
        # I/O thread early in a burst could cost messages: ask for a large buffer at once.
        if settings.receive_buffer:
            socket.setsockopt(zmq.RCVBUF, settings.receive_buffer)
        socket.setsockopt(zmq.LINGER, 0)
        if self.heartbeat is not None:
            monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            self._monitor = ZMQStream(monitor)
            self._monitor.on_recv(self._on_disconnect)
        connect(socket, info, "iopub")
        # A kernel of the gateway's launcher keeps what it sends only once it knows the
        # gateway will say what is durable: told before the subscription (the frames go
        # in order), it keeps its first messages too. Until the first acknowledgement,
        # which comes only after the first commit, it would let them go.
        socket.send(self._acknowledgement(None))
        socket.send(SUBSCRIBE_ALL)  # kept by the XSUB: sent again on every reconnection
        self._socket = socket
        self._await_notice()
        self._fd = cast(int, socket.getsockopt(zmq.FD))
        # Read straight off the socket's notification fd (edge-triggered: every wake-up
        # reads until the socket says it has nothing more), not through a ZMQStream, whose
        # per-message callbacks and end-of-batch exception cost more than the decoding.
        loop = asyncio.get_running_loop()
        loop.add_reader(self._fd, self._on_readable)
        loop.call_soon(self._on_readable)
        self._nudger = asyncio.ensure_future(self._nudge(info))

    def _on_disconnect(self, _: list[Any]) -> None:
        self.disconnects += 1

    async def _nudge(self, info: dict[str, Any]) -> None:
        """Send kernel_info_request until IOPub proves the subscription is live (the sink is
        ready then) and the kernel has answered one (its model leaves ``starting``).

        The first IOPub message is not the answer: ipykernel 7 welcomes a subscription
        (``iopub_welcome``) and the gateway's launcher publishes what it held (the kernel's
        ``starting``) as soon as it binds, before its shell answers, and a kernel that
        started slowly (a loaded machine) had not yet taken the requests this socket had
        queued for it when nudging stopped there and closed it: nothing ever took the
        kernel's model out of ``starting`` while no client connected."""
        shell = self.link.sockets.context.socket(zmq.DEALER)
        shell.setsockopt(zmq.LINGER, 0)
        shell.setsockopt(zmq.SNDTIMEO, 0)  # a full queue raises zmq.Again: see below
        connect(shell, info, "shell")
        ready = self.sink.ready
        answered = self._answered = asyncio.get_running_loop().create_future()
        deadline = time.monotonic() + self.settings.ready_timeout
        try:
            nudges = 0
            while not (ready.done() and answered.done()):
                # Never blocking: a DEALER whose queue is full (a kernel that does not read
                # its shell) would block the event loop, and every kernel and client with it.
                with contextlib.suppress(zmq.Again):
                    self.session.send(shell, "kernel_info_request")
                nudges += 1
                if nudges % RESUBSCRIBE_EVERY == 0 and not ready.done():
                    # Still no IOPub: subscribe again (a subscription the kernel missed is
                    # not sent again by ZMQ until the connection is made anew).
                    self._resubscribe()
                waited, interval = ready, self.settings.nudge_interval
                if ready.done():
                    # Live, not answered yet: a kernel busy with a cell (re-attached, taken
                    # over mid-flood) takes its shell's requests only after it, and answers
                    # every one queued by then, each with a busy and an idle that go in
                    # its transcript. The requests already sent wait in this socket or the
                    # kernel's until then: send one more only now and then, in case one
                    # was lost.
                    waited = answered
                    interval = max(interval, self.settings.ready_timeout / READY_NUDGES)
                try:
                    await asyncio.wait_for(asyncio.shield(waited), interval)
                except asyncio.TimeoutError:
                    if time.monotonic() > deadline:
                        if ready.done():  # busy with a cell, most likely: not a fault
                            self.log.info(
                                "Kernel %s answered no kernel_info_request in %.0f s",
                                self.kernel_id,
                                self.settings.ready_timeout,
                            )
                            break
                        self.log.warning(
                            "No IOPub message from kernel %s in %.0f s; going on unconfirmed",
                            self.kernel_id,
                            self.settings.ready_timeout,
                        )
                        ready.set_result(None)
                        break
        finally:
            if self._answered is answered:  # not a later connection's nudging
                self._answered = None
            shell.close(linger=0)

    def _resubscribe(self) -> None:
        socket = self._socket
        if socket is None or socket.closed:
            return
        with contextlib.suppress(zmq.Again):
            socket.send(SUBSCRIBE_ALL, zmq.NOBLOCK)
        self._await_notice()
        # A send takes the edge of the socket's fd (see acknowledge()).
        asyncio.get_running_loop().call_soon(self._on_readable)

    def _on_readable(self) -> None:
        """Read what IOPub has queued, in a bounded batch so other work on the loop gets
        its turn; a batch that hits the bound continues on the next loop iteration."""
        if self._read(self.settings.batch, self.settings.batch_bytes):
            asyncio.get_running_loop().call_soon(self._on_readable)

    def _read(self, most: int, most_bytes: int, drain: bool = False) -> bool:
        """Pull what the socket holds into the backlog, then record up to ``most``
        messages / ``most_bytes`` of it; True if more are waiting. While the sink takes
        nothing (its store is behind, and the kernel keeps what it publishes), neither,
        and again in :data:`ROOM_POLL` seconds; a ``drain`` (before a mark, at a stop)
        records what has come all the same. Asked before every message: one batch can
        be more than the room left."""
        accepting = self.sink.accepting
        if not drain and not accepting():
            self._wait_for_room()
            return False
        more = self._pull(max(most, 1) * PULL_FACTOR)
        count = taken = 0
        backlog = self._backlog
        try:
            while backlog and count < most and taken < most_bytes:
                if count and not drain and not accepting():
                    self._wait_for_room()
                    return False
                entry = backlog.popleft()
                count += 1
                if isinstance(entry, int):
                    self.sink.record_gap(BACKLOG_FULL, entry)
                    if self._after_replay:
                        self._replayed(entry)
                    continue
                parts, cost = entry
                self._backlog_bytes -= cost
                taken += cost
                try:
                    message = parts if not isinstance(parts, list) else self._decode(parts)
                    if self._answered is not None and message is not None:
                        self._heard(message)
                    self._arrived(message)
                except Exception:
                    # Never stop reading: the fd signals only on an edge, so a batch that
                    # ends in an exception would leave the socket unread for good.
                    self.log.exception("Recording an IOPub message of %s failed", self.kernel_id)
        finally:
            if count:
                self.sink.batch_received()
        return more or bool(backlog)

    def _arrived(self, message: KernelMessage | Replayed | None) -> None:
        """One message read (None: refused, or seen already), for the sink; held if it
        came before the notice (see the module docstring)."""
        if self._notice_timer is not None:
            if isinstance(message, KernelMessage) and message.msg_type == SPOOL_MSG_TYPE:
                self._notice_came(message)
            elif message is not None:
                self._before_notice.append(message)
                self._before_notice_bytes += message.size
                if self._before_notice_bytes > NOTICE_WAIT_BYTES:
                    self._stop_awaiting_notice()
            return
        self._hand_over(message)
        if self._after_replay:
            self._replayed(1)

    def _hand_over(self, message: KernelMessage | Replayed | None) -> None:
        if isinstance(message, Replayed):
            self.sink.record_replayed(message.message)
        elif message is not None:
            self.sink.record_message(message)

    def _await_notice(self) -> None:
        """Hold what comes before the kernel's notice (unless it sends none)."""
        if self.sends_notices is not False and self._notice_timer is None:
            loop = asyncio.get_running_loop()
            self._notice_timer = loop.call_later(NOTICE_WAIT, self._notice_overdue)

    def _notice_came(self, notice: KernelMessage) -> None:
        """The notice, then its replay (``held`` messages), then what came before it but
        for what the replay brought (all of it, unless someone acknowledged some of it
        meanwhile)."""
        assert self._notice_timer is not None
        self._notice_timer.cancel()
        self._notice_timer = None
        self.sends_notices = True
        self.sink.record_message(notice)
        held = notice.content().get("held")
        early, self._before_notice = self._before_notice, []
        self._before_notice_bytes = 0
        if early:
            self._after_replay.extend(early)
            self._replay_left = held if isinstance(held, int) and held > 0 else 0
            self._replayed(0)

    def _replayed(self, count: int) -> None:
        """``count`` more messages of the notice's replay came (refused or seen ones too)."""
        self._replay_left -= count
        if self._replay_left <= 0 and self._after_replay:
            self._replay_left = 0
            early, self._after_replay = self._after_replay, []
            for message in early:
                inner = message.message if isinstance(message, Replayed) else message
                # Not twice: recorded unless the transcript has it (by its msg_id).
                self.sink.record_replayed(inner)

    def _notice_overdue(self) -> None:
        """No notice in NOTICE_WAIT: hand over what came, as it came."""
        self._notice_timer = None
        if self.sends_notices is None:
            self.sends_notices = False
        if self._before_notice:
            self._flush_before_notice()
            self.sink.batch_received()

    def _stop_awaiting_notice(self) -> None:
        if self._notice_timer is not None:
            self._notice_timer.cancel()
            self._notice_timer = None
        self._flush_before_notice()

    def _flush_before_notice(self) -> None:
        early, self._before_notice = self._before_notice, []
        self._before_notice_bytes = 0
        for message in early:
            self._hand_over(message)

    def _wait_for_room(self) -> None:
        if self._room_timer is None:
            loop = asyncio.get_running_loop()
            self._room_timer = loop.call_later(ROOM_POLL, self._room_again)

    def _room_again(self) -> None:
        self._room_timer = None
        if not self._stopped:
            self._on_readable()

    def _heard(self, message: KernelMessage | Replayed) -> None:
        """While nudging: a ``busy`` or ``idle`` status is the kernel's answer."""
        if isinstance(message, Replayed):
            message = message.message
        answered = self._answered
        if (
            answered is not None
            and not answered.done()
            and message.execution_state in ("busy", "idle")
        ):
            answered.set_result(None)

    def _pull(self, most: int) -> bool:
        """Move up to ``most`` messages from the socket to the backlog; past the backlog's
        byte budget, count them as dropped instead. True if the socket holds more."""
        socket = self._socket
        if socket is None or socket.closed:
            return False
        budget = self.settings.backlog_bytes
        # Full by count: the socket's own queue takes the rest, then the kernel's (a kernel
        # of the gateway's launcher holds what it cannot send), as without a backlog.
        most_queued = self.settings.receive_hwm
        backlog = self._backlog
        pulled = 0
        recv = socket.recv
        while True:
            if pulled >= most or (most_queued and len(backlog) >= most_queued):
                return True  # perhaps more: the next turn finds out
            # Read until the socket has nothing (zmq.Again), not asking ZMQ_EVENTS before
            # each message: pyzmq's getsockopt costs a third of the receive. A read that
            # ends empty re-arms the notification fd as the events check does.
            try:
                frames = _receive(recv)
            except zmq.Again:
                return False
            pulled += 1
            size = sum(map(len, frames))
            entry: Parts | KernelMessage | Replayed | None = frames
            limit = self.settings.max_message_bytes
            if limit and size > limit:
                # Cut now, not when its turn comes: the backlog holds what is kept of it.
                entry = self._decode(frames)
                size = 0 if entry is None or isinstance(entry, list) else entry.size
            cost = size + BACKLOG_OVERHEAD
            # Past the budget a status still has a reserve (core/reserve.py): an
            # execution's idle is not lost behind a flood.
            used = self._backlog_bytes
            if backlog and not fits(used, cost, budget, used + cost > budget and _is_status(entry)):
                self.dropped += 1
                last = backlog[-1]
                if isinstance(last, int):
                    backlog[-1] = last + 1
                else:
                    backlog.append(1)
                    self._refused(f"more than the IOPub backlog's {budget} bytes (dropped)")
                continue
            backlog.append((entry, cost))
            self._backlog_bytes += cost
        return False

    def _decode(self, frames: list[bytes | memoryview]) -> KernelMessage | Replayed | None:
        """The message to record for ``frames`` (cut if over max_message_bytes, a
        placeholder if signed but not a message; what a replay wrapper of the gateway's
        launcher holds, :class:`Replayed`); None if refused (counted, logged)."""
        try:
            _, rest = split_identities(frames)  # type: ignore[arg-type]
            if not _is_replay(rest):
                return self._verified(rest)
            # The launcher publishes again what was not acknowledged: the wrapper alone
            # (its content is {}; its buffers, not signed by it, are the message), then
            # the message, which is no replay attack when this gateway got it before.
            if self._verified(rest[:5]) is None:
                return None
            inner = self._verified(rest[5:], again=True)
            return None if inner is None else Replayed(inner)
        except (BadSignature, RemoteError) as error:
            self.rejected += 1
            self._refused(f"an invalid message ({error})")
            return None

    def _verified(
        self, rest: Sequence[bytes | memoryview], again: bool = False
    ) -> KernelMessage | None:
        """``[signature, header, parent, metadata, content, *buffers]`` checked and decoded;
        None if a replay (``again``: a message published again, seen already: counted
        apart and not logged).

        Raises:
            BadSignature, RemoteError: not a message signed with the kernel's key.
        """
        if len(rest) < 5:
            raise RemoteError(f"expected a signature and 4 parts, got {len(rest)} frames")
        if len(rest[0]) > MAX_SIGNATURE:
            raise RemoteError(f"a signature of {len(rest[0])} bytes")
        signature = bytes(rest[0])
        self.signer.verify(signature, rest[1:5])  # type: ignore[arg-type]
        if self.history.seen(signature):
            if again:
                self.seen_again += 1
                return None
            self.replays += 1
            self._refused(f"a replay of a message already recorded ({self.replays})")
            return None
        limit = self.settings.max_message_bytes
        try:
            if limit and parts_size(rest[1:]) > limit:
                self.cut += 1
                message = cut_message(
                    rest[1:], max_message_bytes=limit, keep_bytes=self.settings.cut_keep_bytes
                )
            else:
                message = KernelMessage.from_parts(rest[1:], repair=True)  # type: ignore[arg-type]
            if _forges_a_mark(message) or (again and message.msg_type == REPLAY_MSG_TYPE):
                self.rejected += 1
                self._refused(f"a message only the gateway writes ({message.msg_type})")
                return None
        except RemoteError as error:
            self.invalid += 1
            invalid = InvalidMessage(str(error), signature, rest[1:])  # type: ignore[arg-type]
            message = invalid_placeholder(invalid, date=_now_iso(), session=self.session.session)
        return message

    def _refused(self, what: str) -> None:
        """Log a refusal, at most once per ``refusal_log_interval`` (a kernel can send a
        great many: the log must not be its megaphone)."""
        now = time.monotonic()
        if now - self._refusals_logged >= self.settings.refusal_log_interval:
            self._refusals_logged = now
            self.log.warning(
                "Kernel %s sent %s; refused %d invalid and %d replayed messages so far",
                self.kernel_id,
                what,
                self.rejected,
                self.replays,
            )

    def drain(self) -> None:
        # Bounded: a kernel that floods on (a firehose at a stop) would otherwise keep the
        # loop reading for ever, and a stop would never end.
        # In turns of one batch: the backlog takes at most receive_hwm messages at a time.
        batch = max(1, self.settings.batch)
        for _ in range(max(1, DRAIN_MAX_MESSAGES // batch)):
            if not self._read(batch, DRAIN_MAX_BYTES, drain=True):
                break
        # Whatever is held goes too (a mark or the end comes after it).
        held = bool(self._before_notice or self._after_replay)
        self._stop_awaiting_notice()
        self._replayed(self._replay_left)
        if held:
            self.sink.batch_received()

    async def _ping(self, heartbeat: HeartbeatSettings) -> None:
        """Ping the kernel's heartbeat port; tell the sink when it stops and starts echoing."""
        context = self.link.sockets.async_context
        socket: zmq.asyncio.Socket | None = None
        answered = time.monotonic()
        disconnects_then = 0
        try:
            while not self._stopped:
                if socket is None:
                    socket = context.socket(zmq.REQ)
                    socket.setsockopt(zmq.LINGER, 0)
                    connect(socket, self.link.connection_info(), "hb")
                started = time.monotonic()
                try:
                    await asyncio.wait_for(socket.send(b"ping"), heartbeat.timeout)
                    await asyncio.wait_for(socket.recv(), heartbeat.timeout)
                except asyncio.TimeoutError:
                    # A REQ socket must get its reply before it sends again: start afresh.
                    socket.close(linger=0)
                    socket = None
                    if self.reachable and time.monotonic() - answered >= heartbeat.timeout:
                        self.reachable = False
                        disconnects_then = self.disconnects
                        self.log.warning(
                            "Kernel %s does not answer its heartbeat (%.0f s)",
                            self.kernel_id,
                            heartbeat.timeout,
                        )
                        self.sink.link_changed(False, "heartbeat_timeout", None)
                    continue
                answered = time.monotonic()
                if not self.reachable:
                    self.reachable = True
                    self.drain()
                    # A connection that survived delivered everything, in order; one that
                    # dropped may have missed what the kernel published meanwhile.
                    lost = None if self.disconnects != disconnects_then else 0
                    self.log.warning("Kernel %s answers its heartbeat again", self.kernel_id)
                    self.sink.link_changed(True, "heartbeat_answered", lost)
                await asyncio.sleep(max(0.0, heartbeat.interval - (answered - started)))
        finally:
            if socket is not None:
                socket.close(linger=0)

    def _disconnect(self) -> None:
        if self._room_timer is not None:
            self._room_timer.cancel()
            self._room_timer = None
        if self._nudger is not None:
            self._nudger.cancel()
            self._nudger = None
        monitor, self._monitor = self._monitor, None
        socket = self._socket
        if socket is not None:
            self.drain()
            if not socket.closed:
                if monitor is not None:
                    with contextlib.suppress(zmq.ZMQError):
                        socket.disable_monitor()
                asyncio.get_running_loop().remove_reader(self._fd)
                socket.close(linger=0)
            self._socket = None
        if monitor is not None:
            monitor.close(linger=0)

    def reconnect(self) -> None:
        if self._stopped:
            return
        self._disconnect()
        self._connect()

    async def release(self, quiet: float, timeout: float) -> bool:
        """Hand the kernel's IOPub over (several nodes: this node stops gracefully): read
        what has come, then unsubscribe, so that a kernel of the gateway's launcher holds
        what it publishes until the next node subscribes. Always False: what was on its way
        when the subscription ended is lost, a gap of unknown size (this socket filters it
        out, and the kernel's drops what it sends before it hears of the unsubscription;
        an XSUB here and an XPUB_MANUAL there would close that window, but made kernels
        that other subscribers also watch stop answering the Tap in our CI runs)."""
        socket = self._socket
        if socket is None or socket.closed:
            return False
        self.drain()
        socket.send(UNSUBSCRIBE_ALL)
        return False

    def acknowledge(self, msg_id: str) -> None:
        """Tell the kernel (a kernel of the gateway's launcher keeps what it published
        until it hears this) that its messages up to ``msg_id`` are durable: one signed
        frame upstream on IOPub. Not sent if the socket cannot take it now (the next
        acknowledgement names a later message)."""
        socket = self._socket
        if socket is None or socket.closed:
            return
        with contextlib.suppress(zmq.Again):
            socket.send(self._acknowledgement(msg_id), zmq.NOBLOCK)
        # A send takes the edge of the socket's fd: what arrived meanwhile would not wake
        # the reader. Read now.
        asyncio.get_running_loop().call_soon(self._on_readable)

    def _acknowledgement(self, msg_id: str | None) -> bytes:
        """The signed frame naming ``msg_id`` durable (None: nothing yet, but acknowledgements
        will come)."""
        payload = json.dumps({"msg_id": msg_id}).encode()
        return ACK_PREFIX + self.signer.sign([payload]) + b"\x00" + payload

    def stop(self) -> None:
        self._stopped = True
        if self._pinger is not None:
            self._pinger.cancel()
            self._pinger = None
        self._disconnect()


def _receive(recv: Callable[..., Any]) -> list[bytes | memoryview]:
    """One multipart message's frames, ``recv`` being its socket's ``recv``: each frame
    received without a copy (a ``zmq.Frame``, whose ``more`` saves asking ZMQ_RCVMORE),
    then copied out as bytes, except a frame past the metadata larger than
    :data:`ZERO_COPY_FROM`, kept as a view of libzmq's buffer (a 300 MB content is held
    once, not twice).

    Raises:
        zmq.Again: nothing to read (only before the first frame: ZMQ delivers a multipart
            message whole).
    """
    frame = recv(zmq.NOBLOCK, copy=False)
    frames: list[bytes | memoryview] = [frame.bytes]
    # Frames up to [..., delimiter, signature, header, parent, metadata] are small.
    after_delimiter = 0 if frames[0] == DELIMITER else -1
    while frame.more:
        frame = recv(zmq.NOBLOCK, copy=False)
        if (
            after_delimiter >= 0
            and len(frames) - after_delimiter >= 5
            and len(frame) > ZERO_COPY_FROM
        ):
            frames.append(frame.buffer)
            continue
        data = frame.bytes
        if after_delimiter < 0 and data == DELIMITER:
            after_delimiter = len(frames)
        frames.append(data)
    return frames


def _is_replay(rest: Sequence[bytes | memoryview]) -> bool:
    """Whether ``[signature, header, ...]`` is a replay wrapper of the gateway's launcher
    (the header is parsed only when it names that type: not on the hot path)."""
    if len(rest) < 10 or _REPLAY_TAG not in rest[1]:
        return False
    try:
        header = json.loads(bytes(rest[1]))
    except ValueError:
        return False
    return isinstance(header, dict) and header.get("msg_type") == REPLAY_MSG_TYPE


class Replayed:
    """A message the gateway's launcher published again (see :func:`_is_replay`)."""

    __slots__ = ("message",)

    def __init__(self, message: KernelMessage) -> None:
        self.message = message

    @property
    def size(self) -> int:
        return self.message.size


def _forges_a_mark(message: KernelMessage) -> bool:
    """True for what only the gateway writes into a transcript (its marks, a kernel's
    restart or death): code in the kernel has its key and could sign one, to end other
    executions, hide output in a notebook cell or forge a gap. The spool notice of the
    gateway's own launcher is the exception (see :mod:`..kernel_launcher`). The rule is
    :mod:`..core.intake`'s, the same for every kind of kernel."""
    return isinstance(intake.check(message, allow_spool=True), intake.Refuse)


def _now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()
