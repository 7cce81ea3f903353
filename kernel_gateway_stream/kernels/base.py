"""The two seams between the gateway and a kernel, whatever kind of kernel it is.

Everything above this package (the Tap, client connections, the execute API) reaches a
kernel through a :class:`KernelLink`, and nothing above it knows which kind of kernel it is:

* an **IOPub source** (:class:`IOPubSource`) reads the kernel's IOPub channel and hands each
  message, decoded and checked, to the one :class:`IOPubSink` of the kernel (its Tap, which
  numbers, stores and publishes: no ZMQ and no WebSocket in it);
* **kernel channels** (:class:`KernelChannels`), one per client connection or executor:
  send on shell, control and stdin, replies to whoever opened them, and ``ready`` once the
  kernel can answer that connection's stdin (the stdin handshake).

The kinds of kernel are siblings in this package: :mod:`.zmq_kernel` (ZMQ sockets from
connection info: kernels the gateway started, attached by connection info, or in their own
network) and :mod:`.upstream` (a kernel behind another gateway, over its WebSocket).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any, Protocol

from ..core.messages import KernelMessage

__all__ = [
    "IOPubSink",
    "IOPubSource",
    "KernelChannels",
    "KernelLink",
    "ReplyCallback",
    "death_reason",
    "mark_start_failed",
    "start_of",
]

#: ``on_reply(channel, message)``: a message the kernel sent on shell, control or stdin to
#: the channels that asked (signature checked, decoded).
ReplyCallback = Callable[[str, KernelMessage], None]


class IOPubSink(Protocol):
    """Where an IOPub source puts what it reads: the kernel's Tap."""

    #: Done once the source has proved it is live (or gave up waiting).
    ready: asyncio.Future[None]

    def record_message(self, message: KernelMessage) -> None:
        """One IOPub message, checked and decoded."""

    def record_replayed(self, message: KernelMessage) -> None:
        """A message the kernel published again (the gateway's launcher, to a new
        subscriber: what was not acknowledged as durable; an upstream kernel_gateway_stream
        that recorded it again after a restart): recorded unless the transcript has it
        already."""

    def batch_received(self) -> None:
        """A batch of messages has been handed over: the source is live."""

    def accepting(self) -> bool:
        """Whether the sink takes messages now. False while it could only drop them (its
        store is behind) and the kernel keeps what it publishes until told it is durable:
        the source then leaves them with the kernel and asks again soon."""

    def record_gap(self, reason: str, lost: int | None) -> None:
        """Output is missing here that the source knows of (an upstream's own gap): one
        gap record, ``lost`` messages (``None``: an unknown number)."""

    def link_changed(self, reachable: bool, reason: str, lost: int | None) -> None:
        """The kernel stopped answering (``reachable`` False) or answers again. ``lost`` is
        how many IOPub messages the source knows it missed meanwhile (``None``: it cannot
        know, 0: none)."""


class IOPubSource(Protocol):
    """Reads one kernel's IOPub for its sink. Made by :meth:`KernelLink.iopub`."""

    #: Messages refused: a signature that does not match, or framing that is not a message.
    rejected: int
    #: Correctly signed messages seen before (replays), refused.
    replays: int
    #: Correctly signed messages that are not messages, handed on as placeholders.
    invalid: int
    #: False while the kernel does not answer (heartbeat, or the upstream is gone).
    reachable: bool

    def start(self) -> None:
        """Subscribe and start proving the subscription live."""

    def reconnect(self) -> None:
        """Subscribe again (after a restart, which may have changed the kernel's ports)."""

    def drain(self) -> None:
        """Hand over, now, whatever has already arrived."""

    def stop(self) -> None:
        """Stop reading, for good."""

    def acknowledge(self, msg_id: str) -> None:
        """The kernel's messages up to ``msg_id`` are durable (a kernel of the gateway's
        launcher lets go of them); a source that cannot tell its kernel does nothing."""


class KernelChannels(Protocol):
    """shell, control and stdin to one kernel for one client. Made by
    :meth:`KernelLink.channels`."""

    #: Done once the kernel knows these channels' stdin (or the handshake timed out).
    ready: asyncio.Future[None]
    handshaken: bool

    def send(self, channel: str, parts: list[bytes]) -> None:
        """Send ``[header, parent, metadata, content, *buffers]`` on ``channel``."""

    @property
    def closed(self) -> bool: ...

    def close(self, linger_ms: int = 0) -> None:
        """Close; with ``linger_ms``, what was just sent still goes out."""


class KernelLink(Protocol):
    """How the gateway reaches one kernel."""

    #: ``"zmq"`` or ``"upstream"``: for status and logs only.
    kind: str

    def iopub(self, sink: IOPubSink) -> IOPubSource:
        """The kernel's one IOPub source, feeding ``sink``."""

    def channels(
        self, identity: bytes, on_reply: ReplyCallback, *, handshake_timeout: float
    ) -> KernelChannels:
        """New channels with ``identity`` (the kernel routes stdin by it)."""


def start_of(kernel: Any) -> asyncio.Future[Any] | None:
    """A kernel manager's start, as an asyncio future (jupyter_client's ``ready``, which
    may be a concurrent future); None for a manager that has none."""
    ready = getattr(kernel, "ready", None)
    if isinstance(ready, asyncio.Future):
        return ready
    if isinstance(ready, concurrent.futures.Future):
        return asyncio.wrap_future(ready)
    return None


def mark_start_failed(kernel: Any, reason: str) -> None:
    """What jupyter_server's own WebSocket sets on a kernel manager whose start failed:
    ``dead``, with the start's error as its reason."""
    kernel.execution_state = "dead"
    kernel.reason = reason


def death_reason(kernel: Any) -> str:
    """Why a kernel manager's kernel process ended by itself: what its provisioner can tell
    (``cpu_limit`` for a sandbox kernel past its CPU time), else ``kernel_died``. Asked by
    jupyter_client's restarter's callbacks, while the dead process is still known."""
    provisioner = getattr(kernel, "provisioner", None)
    tell = getattr(provisioner, "death_reason", None)
    reason = tell() if callable(tell) else None
    return reason if isinstance(reason, str) and reason else "kernel_died"
