"""Following an event stream across connections: where to resume, how soon, when to stop.

Pure: the clients pass ``now`` and a ``jitter`` in [0, 1) in, and do the I/O.

The rules:

* The first connection of a stream that the gateway never answered fails at once
  (:class:`GatewayUnreachable`): a wrong URL or a stopped gateway is said in a second,
  not after a minute of retries.
* Once the gateway has answered, a lost connection, a stream that ends without its last
  event, a 502/503/504, a ``gateway_shutdown`` event (the gateway is stopping; it may
  come back) or a ``lease_lost`` event (the node stopped recording the kernel: another
  node records it now, or will) is resumed after a pause: exponential from
  ``first_delay``, capped at ``max_delay``, each drawn between half and all of that
  ("equal jitter", so that clients cut off together do not come back together).
* The pauses of one outage count from its first failure; past ``give_up_after`` seconds
  (or ``max_attempts``), :class:`GatewayUnreachable` ends the stream. An outage ends when
  the stream makes progress: an event, or the gateway's keep-alive comment.
* ``slow_consumer``: the gateway dropped a reader that fell behind. It is resumed at once
  when that connection delivered something (else after a pause, as above).
* ``server_error``: the gateway failed to serve the stream. The event is kept back; if the
  connection then ends without the stream's last event, it is resumed after a pause as
  above, but a failure that comes back at the same place (a resume replays what failed)
  ends the stream with :class:`GatewayHTTPError` ``500 server_error`` after
  ``MAX_SERVER_ERRORS`` connections in a row: never a loop. Any other error answer (4xx,
  500) is raised at once; only 502/503/504, a proxy's answers, are retried.
* A stream resumes after the last sequence number it got, with ``Last-Event-ID`` (the
  gateway then sends every message after it, then live, with no gap or duplicate). A
  control event's ``last_seq`` moves that point on when it is ahead (a filtered stream).
* An event named in ``ends_with`` is delivered and ends the stream (``kernel_shutdown``,
  and ``done`` for an execution). Any other event, including one the client does not
  know, is delivered; a stream that then stops is resumed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.errors import GatewayHTTPError, GatewayUnreachable
from .api import Event, describe, error_for, event_from
from .sse import EventStreamParser

__all__ = ["Backoff", "Reconnect", "ResumableStream"]

#: Final events after which the stream is resumed, and what they mean.
RESUME_EVENTS = {
    "slow_consumer": "the gateway dropped the stream as too slow a reader (slow_consumer)",
    "gateway_shutdown": "the gateway is shutting down (gateway_shutdown)",
    "lease_lost": "the node stopped recording the kernel (lease_lost)",
}
#: Answers that a proxy gives while the gateway behind it restarts.
RETRY_STATUSES = frozenset({502, 503, 504})
#: The gateway's event saying it failed to serve the stream (see :mod:`..core.endings`).
SERVER_ERROR = "server_error"
#: Connections in a row that end with ``server_error`` at one place before the stream fails.
MAX_SERVER_ERRORS = 3


@dataclass(frozen=True, slots=True)
class Backoff:
    """How a dropped stream is retried (see the module's docstring)."""

    first_delay: float = 0.1
    max_delay: float = 5.0
    give_up_after: float = 60.0
    max_attempts: int | None = None

    def delay(self, attempt: int, jitter: float) -> float:
        """The pause before ``attempt`` (1 for the first retry); ``jitter`` in [0, 1)."""
        ceiling = min(self.max_delay, self.first_delay * 2.0 ** min(attempt - 1, 64))
        return ceiling * (1 + jitter) / 2


@dataclass(frozen=True, slots=True)
class Reconnect:
    """A stream about to be resumed: what ``on_reconnect`` is told."""

    #: The stream's path on the gateway.
    path: str
    #: 1 for the first retry of an outage; 0 for an immediate resume (slow_consumer).
    attempt: int
    #: Seconds the client waits before it connects again.
    delay: float
    #: The sequence number it resumes after (None: from the start).
    since: int | None
    #: Why, in words.
    reason: str


@dataclass(slots=True)
class _Outage:
    """The retries of one outage: when its first failure came, and how many so far."""

    started: float | None = None
    retries: int = 0


@dataclass(slots=True)
class _Connection:
    """One connection's state."""

    parser: EventStreamParser = field(default_factory=EventStreamParser)
    #: Why it stopped, for ``on_reconnect``.
    reason: str = "the gateway ended the stream"
    #: It delivered an event, or the gateway's keep-alive.
    progressed: bool = False
    #: It has nothing more to give.
    over: bool = False
    #: The gateway's ``server_error`` event on it, if any: its data.
    server_error: dict[str, object] | None = None


@dataclass(slots=True)
class _ServerErrors:
    """``server_error`` endings in a row at one place: where (the cursor), how many."""

    cursor: int | None = None
    count: int = 0


@dataclass(slots=True, eq=False)
class ResumableStream:
    """One event stream, across as many connections as it takes.

    The clients drive it so, stopping to read a response when ``connection_over``::

        while True:
            headers = stream.connect()
            try:
                ... open the response ...
                stream.answered(status, body_if_error)
                for chunk in response: deliver stream.feed(chunk); stop if connection_over
            except transport error:
                stream.failed(url, error)
            if stream.finished: return
            pause = stream.reconnect(url, now, jitter); tell on_reconnect; sleep pause.delay
    """

    #: The path (and query) on the gateway.
    path: str
    #: The last sequence number received: where the next connection resumes.
    cursor: int | None
    #: The events that end the stream, delivered last.
    ends_with: frozenset[str]
    backoff: Backoff
    #: Whether the gateway has answered for this stream (then failures are retried).
    established: bool = False
    #: The stream is over: its last event was delivered.
    finished: bool = field(default=False, init=False)
    _connection: _Connection = field(default_factory=_Connection, init=False)
    _outage: _Outage = field(default_factory=_Outage, init=False)
    _server_errors: _ServerErrors = field(default_factory=_ServerErrors, init=False)

    @property
    def connection_over(self) -> bool:
        """The current connection has nothing more to give."""
        return self._connection.over

    def connect(self) -> dict[str, str]:
        """Start a connection; the headers it must send."""
        self._connection = _Connection()
        headers = {"Accept": "text/event-stream"}
        if self.cursor is not None:
            headers["Last-Event-ID"] = str(self.cursor)
        return headers

    def answered(self, status: int, body: bytes) -> None:
        """The response's status (and its body, for an error).

        Raises:
            GatewayHTTPError: an error answer that is not worth retrying.
        """
        if status < 400:
            self.established = True
            return
        error: GatewayHTTPError = error_for(status, body)
        if not (self.established and status in RETRY_STATUSES):
            raise error
        self._stop(str(error))

    def feed(self, chunk: bytes) -> list[Event]:
        """The events to deliver from ``chunk`` (control events are kept back).

        Raises:
            ClientError: an event's data is not JSON.
        """
        decoder = self._connection.parser.decoder
        comments = decoder.comments
        delivered = []
        for sse in self._connection.parser.feed(chunk):
            event = event_from(sse)
            if event.id is not None:
                self.cursor = event.id
            if event.event in RESUME_EVENTS:
                self._resume_after(event)
                break
            if event.event == SERVER_ERROR:
                # Kept back: the gateway may still end the stream properly (an execution's
                # ``done`` follows it); if not, reconnect() counts it.
                data = event.data if isinstance(event.data, dict) else {}
                self._connection.server_error = data
                self._connection.reason = f"the gateway failed ({data.get('message')})"
                continue
            delivered.append(event)
            if event.event in self.ends_with:
                self.finished = self._connection.over = True
                break
        if delivered or decoder.comments != comments:
            self._connection.progressed = True
            self._outage = _Outage()
        return delivered

    def failed(self, url: str, error: Exception) -> None:
        """The connection failed (could not be made, or broke).

        Raises:
            GatewayUnreachable: the gateway never answered for this stream.
        """
        if not self.established:
            raise GatewayUnreachable(url, describe(error)) from error
        self._stop(f"lost the connection ({describe(error)})")

    def reconnect(self, url: str, now: float, jitter: float) -> Reconnect:
        """When and from where to connect again, after a connection that did not finish.

        Raises:
            GatewayUnreachable: this outage has lasted past ``give_up_after`` seconds or
                ``max_attempts`` retries.
            GatewayHTTPError: ``500 server_error``: the gateway failed to serve the stream
                ``MAX_SERVER_ERRORS`` times in a row at the same place.
        """
        self._count_server_error()
        reason = self._connection.reason
        if reason == RESUME_EVENTS["slow_consumer"] and self._connection.progressed:
            return Reconnect(self.path, 0, 0.0, self.cursor, reason)
        outage, backoff = self._outage, self.backoff
        if outage.started is None:
            outage.started = now
        outage.retries += 1
        waited = now - outage.started
        too_many = backoff.max_attempts is not None and outage.retries > backoff.max_attempts
        if too_many or waited >= backoff.give_up_after:
            detail = f"gave up after {outage.retries - 1} retries in {waited:.1f} s"
            raise GatewayUnreachable(url, f"{detail}; {reason}")
        left = outage.started + backoff.give_up_after - now
        delay = min(backoff.delay(outage.retries, jitter), left)
        return Reconnect(self.path, outage.retries, delay, self.cursor, reason)

    def _count_server_error(self) -> None:
        failure = self._connection.server_error
        if failure is None:
            return
        errors = self._server_errors
        if errors.count and self.cursor == errors.cursor:
            errors.count += 1
        else:
            errors.cursor, errors.count = self.cursor, 1
        if errors.count >= MAX_SERVER_ERRORS:
            message = " ".join(str(failure.get("message") or "no detail").split())
            raise GatewayHTTPError(
                500,
                SERVER_ERROR,
                f"the gateway failed to serve {self.path} {errors.count} times after seq "
                f"{self.cursor}: {message}",
            )

    def _resume_after(self, event: Event) -> None:
        last_seq = event.data.get("last_seq") if isinstance(event.data, dict) else None
        if isinstance(last_seq, int) and (self.cursor is None or last_seq > self.cursor):
            self.cursor = last_seq
        self._stop(RESUME_EVENTS[event.event])

    def _stop(self, reason: str) -> None:
        self._connection.reason = reason
        self._connection.over = True
