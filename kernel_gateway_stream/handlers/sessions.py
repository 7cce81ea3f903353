"""A client session's kernel channels, which outlive one WebSocket connection.

jupyter_server keeps a session's ZMQ sockets across a reconnect and buffers their replies;
a client that comes back with the same ``session_id`` gets the ``execute_reply`` that was
sent while it was away (without it, JupyterLab shows the cell as ``[*]`` for ever). Here a
:class:`KernelSession` holds, per kernel and session id:

* the shell, control and stdin DEALERs (:class:`~..kernels.base.KernelChannels`), with
  the session id as their identity, opened at the first request;
* while no connection is attached, the replies the kernel sends: at most
  ``max_replies`` and ``max_bytes``, each with the head of the kernel's IOPub transcript
  when it came (:class:`~..core.handoff.HeldReply`), so the connection that comes back
  gets them in place among the replayed output;
* for ``grace`` seconds after the client dropped, then the sockets close.

Sessions whose client is away are bounded too (``max_away``, across kernels): each may
hold three sockets, and a client that opens connection after connection under new
session ids must not run the gateway out of descriptors. Past the bound the session that
has been away longest closes first.

A connection of a client that did not name its session (no ``?session_id=``) cannot come
back: its session closes with it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from ..core.frames import Frame
from ..core.handoff import HeldReply
from ..core.messages import KernelMessage, Signer
from ..kernels.base import KernelChannels
from ..recording.recorder import KernelRecorder

__all__ = ["KernelSession", "SessionRegistry"]

#: Milliseconds a session's sockets linger when they close: a request sent just before
#: the client left still reaches the kernel (its output is recorded with nobody watching).
CLOSE_LINGER_MS = 5000


class ReplyReceiver(Protocol):
    """A connection attached to a session: it gets the replies to its requests."""

    def deliver(self, frame: Frame) -> None: ...


class KernelSession:
    """One client session's channels to one kernel. Made by :class:`SessionRegistry`."""

    def __init__(self, key: str, tap: KernelRecorder, registry: SessionRegistry) -> None:
        self.key = key
        self.tap = tap
        self.registry = registry
        self.channels: KernelChannels | None = None
        self.receiver: ReplyReceiver | None = None
        self.held: list[HeldReply] = []
        self._held_bytes = 0
        #: Replies dropped while held, past the bounds (counted; the client is told by
        #: nothing else: its output is in the transcript, only the reply is lost).
        self.dropped = 0
        self._expiry: asyncio.TimerHandle | None = None

    @property
    def signer(self) -> Signer:
        return self.tap.signer

    def open(self, identity: bytes) -> KernelChannels:
        """The session's channels, opened at its first request."""
        if self.channels is None or self.channels.closed:
            self.channels = self.tap.link.channels(
                identity, self._on_reply, handshake_timeout=self.registry.handshake_timeout
            )
        return self.channels

    def attach(self, receiver: ReplyReceiver) -> list[HeldReply]:
        """A connection takes the session over; returns the replies held for it."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self.receiver = receiver
        self.registry.came_back(self)
        held, self.held, self._held_bytes = self.held, [], 0
        return held

    def detach(self, receiver: ReplyReceiver, *, keep: bool) -> None:
        """The connection went away; with ``keep`` (a named session) hold the channels and
        their replies for the grace period, else close them now."""
        if self.receiver is not receiver:
            return  # a newer connection has the session already
        self.receiver = None
        if keep and self.registry.grace > 0 and not self.tap.closed:
            loop = asyncio.get_running_loop()
            self._expiry = loop.call_later(self.registry.grace, self.close)
            self.registry.went_away(self)
        else:
            self.close()

    def _on_reply(self, channel: str, message: KernelMessage) -> None:
        message = self.tap.policy.screen(message)
        frame = Frame.reply(channel, message)
        if self.receiver is not None:
            self.receiver.deliver(frame)
        elif (
            len(self.held) < self.registry.max_replies
            and self._held_bytes + frame.size <= self.registry.max_bytes
        ):
            self.held.append(HeldReply(self.tap.head, frame))
            self._held_bytes += frame.size
        else:
            self.dropped += 1

    def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self.channels is not None:
            self.channels.close(linger_ms=CLOSE_LINGER_MS)
            self.channels = None
        self.held = []
        self._held_bytes = 0
        self.registry.forget(self)


class SessionRegistry:
    """The sessions of every kernel, by ``kernel_id:session_id``."""

    def __init__(
        self,
        log: Any,
        *,
        grace: float,
        max_replies: int = 1000,
        max_bytes: int = 8 * 1024 * 1024,
        max_away: int = 1000,
        handshake_timeout: float = 5.0,
    ) -> None:
        self.log = log
        #: Seconds a named session's channels outlive the connection that dropped.
        self.grace = grace
        self.max_replies = max_replies
        self.max_bytes = max_bytes
        #: Most sessions held with their client away; past it the longest away closes.
        self.max_away = max_away
        self.handshake_timeout = handshake_timeout
        self._sessions: dict[str, KernelSession] = {}
        #: Sessions whose client is away, longest away first (dicts keep insertion order).
        self._away: dict[str, KernelSession] = {}
        #: Sessions closed before their grace ended because of ``max_away``.
        self.evicted = 0

    def get(self, tap: KernelRecorder, session_id: str) -> KernelSession:
        key = f"{tap.kernel_id}:{session_id}"
        session = self._sessions.get(key)
        if session is None or session.tap is not tap:
            if session is not None:
                session.close()  # the kernel's Tap was replaced: its channels are stale
            session = self._sessions[key] = KernelSession(key, tap, self)
        return session

    def forget(self, session: KernelSession) -> None:
        self.came_back(session)
        if self._sessions.get(session.key) is session:
            del self._sessions[session.key]

    def went_away(self, session: KernelSession) -> None:
        """``session``'s client left and its channels are held: keep ``max_away``."""
        self._away[session.key] = session
        while len(self._away) > self.max_away:
            oldest = next(iter(self._away.values()))
            self.evicted += 1
            oldest.close()  # forgets it, and so takes it out of _away

    def came_back(self, session: KernelSession) -> None:
        if self._away.get(session.key) is session:
            del self._away[session.key]

    def held(self) -> list[str]:
        """The sessions whose client is away (their channels and replies are held)."""
        return list(self._away)

    def close_kernel(self, kernel_id: str) -> None:
        """The kernel shut down: close its sessions."""
        for key, session in list(self._sessions.items()):
            if key.startswith(f"{kernel_id}:"):
                session.close()

    def close(self) -> None:
        for session in list(self._sessions.values()):
            session.close()

    def stats(self) -> dict[str, int]:
        return {
            "sessions": len(self._sessions),
            "sessions_away": len(self._away),
            "sessions_evicted": self.evicted,
            "replies_held": sum(len(s.held) for s in self._sessions.values()),
            "replies_dropped": sum(s.dropped for s in self._sessions.values()),
        }
