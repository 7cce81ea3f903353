"""What an upstream's kernel numbered and the gateway never received: pure, no I/O.

jupyter_client numbers every message a kernel's session sends, on every channel, with
one counter: ``msg_id`` is ``<session>_<pid>_<n>`` (jupyter_client 7 and later) or
``<session>_<n>`` (jupyter_client 6, Enterprise Gateway's kernels). Behind an upstream
server the gateway reads, on its one WebSocket to the kernel, the kernel's IOPub and the
replies to its own requests; a number it never receives is a message lost on the way
(ipykernel's PUB socket drops past its high-water mark when a server falls behind) or a
message sent to another client of the upstream. The rules, in order:

1. **Reordering.** ipykernel numbers messages in two threads (stream output in its IOPub
   thread, the rest in the main or control thread), so IOPub numbers arrive a little out
   of order; and the upstream merges shell, control and stdin onto the WebSocket from
   other sockets than IOPub's, so an ``execute_reply`` overtakes thousands of IOPub
   messages still queued in the kernel when it floods. So only an IOPub number reveals a
   missing number (a *hole*) below it; numbers on the other channels only fill holes, or
   wait above the highest IOPub number (at most ``max_ahead`` of them) to be left out of
   the holes revealed later. A hole is judged once it has been missing for ``window``
   seconds and ``settle`` more messages have arrived since, or for ``quiet_window``
   seconds whatever came after; and never while late numbers are still filling holes (one
   filled less than ``window`` seconds ago): a kernel started by the gateway's launcher
   holds IOPub output while no subscriber listens and sends it later, behind newer
   messages, thousands of numbers late. A hole below an ``idle`` status is *closed*:
   ipykernel flushes an execution's output before it publishes its ``idle``, so what is
   still missing below it can only be a reply on its way on another channel, and it is
   judged once it has been missing for ``window`` seconds, however few messages came
   after (the adapter holds the ``idle`` back meanwhile, :meth:`CounterWatch.holds`, so
   the gap record comes before the execution's end).
2. **Other clients.** A request the gateway did not send (another client of the upstream,
   or the upstream server's own ``kernel_info_request``) shows on IOPub as ``busy`` and
   ``idle`` statuses with that request as parent; its reply is numbered between the two
   and goes to the other client. So each such request explains one hole between its
   ``busy`` and its ``idle`` (or after its ``busy`` while its ``idle`` has not come). An
   ``idle`` whose ``busy`` the gateway did not see (it came before the counter was
   watched: the upstream nudges the kernel on shell and control at once when the
   gateway's WebSocket connects, as the gateway does) spans from the first number
   watched. An ``execute_request`` may also send ``input_request`` to its client: holes
   beyond the first in its span are lost, but the count is only an upper bound.
3. **Judgement.** Holes still missing and not explained are reported, all those judged at
   one :meth:`CounterWatch.poll` together, as one :class:`Lost` (``count``, and ``bound``
   when rule 2 may explain part of it).
4. **Whose counter.** The upstream server sends messages of its own on the same
   WebSocket (jupyter_server's "IOPub message rate exceeded" notices, its ``restarting``
   statuses), numbered by *its* session, whose counter its other connections share. So
   a session is watched only once a reply to a request the gateway sent came from it
   (the kernel answers; the Tap nudges with a ``kernel_info_request`` when it connects
   and after a restart): numbers of any other session are ignored. The latest
   ``MAX_EARLY`` messages of a session not yet watched are kept, and those numbered
   above the reply that makes it watched are counted then (the reply's own ``busy`` and
   ``idle`` often come before it). A restart brings a new session; the two newest are
   watched.
5. **Bounds.** At most ``max_holes`` runs of holes and ``max_spans`` request spans are
   kept per session; past them the oldest are judged at once. Numbers below the first
   IOPub message received once the session is watched are ignored: the gateway came
   late, or the upstream's subscription to a restarted kernel was not live yet (its
   first answers to the gateway's nudge come on shell, and the statuses around them
   never reach any client). :meth:`CounterWatch.reset` forgets every
   session (the connection dropped: that loss is the reconnection's own gap record).

A kernel whose ``msg_id`` does not follow jupyter_client's form is not watched.
"""

from __future__ import annotations

import re
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["CounterWatch", "Lost", "missed_while_away", "parse_counter"]

#: Sessions watched at once: the kernel's, and the one before its last restart.
MAX_SESSIONS = 2
#: Messages of a session not yet watched kept, to be counted once it is (rule 4).
MAX_EARLY = 256
#: A message of a session not yet watched: number, parent msg_id and type, execution
#: state, and whether it came on IOPub.
_Early = tuple[int, str | None, str | None, str | None, bool]
_COUNTED = re.compile(r"^(?P<key>.{8,}?)_(?P<n>[0-9]{1,18})$")


def parse_counter(msg_id: str) -> tuple[str, int] | None:
    """``(session key, n)`` of a jupyter_client ``msg_id``; None for any other form."""
    match = _COUNTED.match(msg_id)
    if match is None:
        return None
    return match.group("key"), int(match.group("n"))


#: How far below the highest number the gateway had of a session a number may still have
#: been on its way (ipykernel numbers in two threads: see rule 1), for :func:`missed_while_away`.
REORDER_WINDOW = 1000


def missed_while_away(
    known: Iterable[str], msg_id: str, window: int = REORDER_WINDOW
) -> int | None:
    """At most how many messages a kernel numbered that the gateway never received, from
    the msg_ids it has (``known``: its transcript's last ones) to ``msg_id``, the first it
    receives after being away (a gateway restarted, a kernel re-attached): the numbers
    missing from ``window`` below the highest known one up to ``msg_id``'s. An upper bound
    (a reply to another client, or a number still on its way, counts as missed), never
    less than what was missed; None where it cannot be told (another session: the kernel
    restarted meanwhile; a msg_id of another form; nothing known of its session)."""
    counted = parse_counter(msg_id)
    if counted is None:
        return None
    key, number = counted
    seen: set[int] = set()
    for other in known:
        found = parse_counter(other)
        if found is not None and found[0] == key:
            seen.add(found[1])
    if not seen:
        return None
    highest = max(seen)
    if number <= highest:
        return None  # out of order across the restart: nothing to count from
    low = max(-1, highest - window)
    return sum(1 for n in range(low + 1, number) if n not in seen)


@dataclass(frozen=True, slots=True)
class Lost:
    """Numbers the kernel gave out that never arrived: ``count`` messages (an upper bound
    if ``bound``), numbered ``first`` to ``last`` at most, in ``ranges`` (inclusive)."""

    count: int
    bound: bool
    first: int
    last: int
    ranges: tuple[tuple[int, int], ...] = ()

    def covers(self, number: int) -> bool:
        return any(first <= number <= last for first, last in self.ranges)


@dataclass(slots=True)
class _Hole:
    first: int
    last: int
    noticed: float
    #: Messages received when it was noticed (for ``settle``).
    received: int
    #: An ``idle`` numbered above it has come (rule 1): due after ``window`` alone.
    closed: bool = False

    @property
    def size(self) -> int:
        return self.last - self.first + 1


@dataclass(slots=True)
class _Span:
    """A request of another client: its ``busy`` and ``idle`` numbers."""

    busy: int
    idle: int | None
    execute: bool
    explained: int = 0


@dataclass(slots=True)
class _Session:
    key: str
    high: int
    #: The first number watched.
    first: int
    #: Whether an IOPub message has come since (numbers count from it: rule 5).
    started: bool = False
    holes: list[_Hole] = field(default_factory=list)
    spans: OrderedDict[str, _Span] = field(default_factory=OrderedDict)
    #: Numbers above ``high`` received on shell, control or stdin.
    ahead: set[int] = field(default_factory=set)


class CounterWatch:
    """One upstream kernel's counters. The adapter calls :meth:`sent` for every request
    it sends, :meth:`saw` for every message it receives (any channel), then
    :meth:`poll` (after each batch, and at :meth:`next_deadline` when quiet)."""

    def __init__(
        self,
        window: float = 2.0,
        *,
        settle: int = 64,
        quiet_window: float = 10.0,
        max_holes: int = 1000,
        max_spans: int = 1000,
        max_sent: int = 10_000,
        max_ahead: int = 10_000,
    ) -> None:
        self.window = window
        self.settle = settle
        self.quiet_window = quiet_window
        self.max_holes = max_holes
        self.max_spans = max_spans
        self.max_sent = max_sent
        self.max_ahead = max_ahead
        self.received = 0
        #: Sessions watched, oldest first (at most MAX_SESSIONS).
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._sent: OrderedDict[str, None] = OrderedDict()
        #: Holes judged past the bounds, waiting for the next poll.
        self._forced: list[tuple[int, bool, int, int]] = []
        #: When a late number last filled a hole (reordering still under way).
        self._last_fill = float("-inf")
        #: Messages of sessions not (yet) watched, the latest ``MAX_EARLY`` of each.
        self._early: OrderedDict[str, deque[_Early]] = OrderedDict()

    def sent(self, msg_id: str) -> None:
        """The gateway sent request ``msg_id`` upstream: its reply comes to it."""
        self._sent[msg_id] = None
        while len(self._sent) > self.max_sent:
            self._sent.popitem(last=False)

    def reset(self) -> None:
        self._sessions.clear()
        self._early.clear()
        self._forced = []

    def saw(
        self,
        msg_id: str,
        now: float,
        *,
        parent_msg_id: str | None = None,
        parent_msg_type: str | None = None,
        execution_state: str | None = None,
        iopub: bool = True,
    ) -> None:
        """A message the kernel sent, received by the gateway on IOPub (``iopub``) or on
        shell, control or stdin."""
        counted = parse_counter(msg_id)
        if counted is None:
            return
        key, number = counted
        session = self._sessions.get(key)
        if session is None:
            if iopub or parent_msg_id is None or parent_msg_id not in self._sent:
                # Not (yet) known to be the kernel's counter (rule 4). Kept a while: the
                # status messages of the very reply that makes it known may come first.
                early = self._early.get(key)
                if early is None:
                    early = self._early[key] = deque(maxlen=MAX_EARLY)
                early.append((number, parent_msg_id, parent_msg_type, execution_state, iopub))
                self._early.move_to_end(key)
                while len(self._early) > MAX_SESSIONS:
                    self._early.popitem(last=False)
                return
            # The kernel answered the gateway: its first message the gateway watches, or a
            # restart's new session.
            session = self._sessions[key] = _Session(key, number, number)
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
            self.received += 1
            for early_number, parent, parent_type, state, on_iopub in self._early.pop(key, ()):
                if early_number > number:
                    self.saw(
                        f"{key}_{early_number}",
                        now,
                        parent_msg_id=parent,
                        parent_msg_type=parent_type,
                        execution_state=state,
                        iopub=on_iopub,
                    )
            return
        self.received += 1
        if iopub and not session.started:
            # IOPub is live from here: no hole below (rule 5).
            session.started = True
            if number > session.high:
                session.ahead = {n for n in session.ahead if n > number}
                session.high = number
            session.first = session.high
        elif number <= session.high:
            if self._fill(session, number):
                self._last_fill = now
        elif not iopub:
            if len(session.ahead) < self.max_ahead:
                session.ahead.add(number)
        else:
            self._reveal(session, number, now)
            session.high = number
        if iopub and execution_state == "idle":
            for hole in session.holes:
                if hole.last < number:
                    hole.closed = True
        if execution_state in ("busy", "idle") and parent_msg_id:
            self._span(session, number, parent_msg_id, parent_msg_type, execution_state)

    def _reveal(self, session: _Session, number: int, now: float) -> None:
        """IOPub ``number`` came: the numbers between the highest before it and it are
        holes, but for those that came ahead on the other channels."""
        start = session.high + 1
        ahead = sorted(n for n in session.ahead if n < number)
        session.ahead.difference_update(ahead)
        session.ahead.discard(number)
        for seen in [*ahead, number]:
            if seen > start:
                session.holes.append(_Hole(start, seen - 1, now, self.received))
            start = seen + 1
        while len(session.holes) > self.max_holes:
            self._force(session, session.holes.pop(0))

    def _fill(self, session: _Session, number: int) -> bool:
        """A late number: take it out of its hole (splitting the hole). False if it was
        in none."""
        for index, hole in enumerate(session.holes):
            if hole.first <= number <= hole.last:
                pieces = []
                if hole.first < number:
                    pieces.append(
                        _Hole(hole.first, number - 1, hole.noticed, hole.received, hole.closed)
                    )
                if number < hole.last:
                    pieces.append(
                        _Hole(number + 1, hole.last, hole.noticed, hole.received, hole.closed)
                    )
                session.holes[index : index + 1] = pieces
                return True
        return False

    def _span(
        self,
        session: _Session,
        number: int,
        parent: str,
        parent_type: str | None,
        state: str,
    ) -> None:
        if parent in self._sent:
            return  # the gateway's own request: its reply comes to the gateway
        span = session.spans.get(parent)
        if state == "busy":
            if span is None:
                session.spans[parent] = _Span(number, None, parent_type == "execute_request")
                while len(session.spans) > self.max_spans:
                    session.spans.popitem(last=False)
        elif span is not None:
            span.idle = number if span.idle is None else max(span.idle, number)
        elif number > session.first:
            # Its busy came before the counter was watched (or was lost: a hole itself).
            session.spans[parent] = _Span(session.first, number, parent_type == "execute_request")
            while len(session.spans) > self.max_spans:
                session.spans.popitem(last=False)

    def _force(self, session: _Session, hole: _Hole) -> None:
        explained, bound = self._explain(session, hole)
        if hole.size - explained > 0:
            self._forced.append((hole.size - explained, bound, hole.first, hole.last))

    def _judged(self, judged: list[tuple[int, bool, int, int]]) -> Lost:
        return Lost(
            sum(count for count, _, _, _ in judged),
            any(bound for _, bound, _, _ in judged),
            min(first for _, _, first, _ in judged),
            max(last for _, _, _, last in judged),
            tuple((first, last) for _, _, first, last in judged),
        )

    def _explain(self, session: _Session, hole: _Hole) -> tuple[int, bool]:
        """How many of ``hole``'s numbers other clients' requests explain (rule 2), and
        whether what remains is only an upper bound."""
        explained = 0
        bound = False
        for span in session.spans.values():
            low = max(hole.first, span.busy + 1)
            high = hole.last if span.idle is None else min(hole.last, span.idle - 1)
            if low > high:
                continue
            if span.execute:
                bound = True
            if span.explained == 0 and explained < hole.size:
                span.explained = 1
                explained += 1
        return explained, bound

    def poll(self, now: float) -> Lost | None:
        """Judge the holes that are due: what was lost, if anything."""
        judged = list(self._forced)
        self._forced = []
        reordering = now - self._last_fill < self.window
        for session in self._sessions.values():
            keep = []
            for hole in session.holes:
                waited = now - hole.noticed
                settled = hole.closed or self.received - hole.received >= self.settle
                due = (waited >= self.window and settled) or waited >= self.quiet_window
                if due and not reordering:
                    explained, bound = self._explain(session, hole)
                    if hole.size > explained:
                        judged.append((hole.size - explained, bound, hole.first, hole.last))
                else:
                    keep.append(hole)
            session.holes = keep
            self._prune(session)
        if not judged:
            return None
        return self._judged(judged)

    def _prune(self, session: _Session) -> None:
        """Spans wholly below every hole and every future number explain nothing more."""
        low = session.holes[0].first if session.holes else session.high
        for parent, span in list(session.spans.items()):
            if span.idle is not None and span.idle < low:
                del session.spans[parent]

    def next_deadline(self) -> float | None:
        """When :meth:`poll` may next have something to judge with no message arriving."""
        if self._forced:
            return 0.0
        due = [
            hole.noticed + (self.window if hole.closed else self.quiet_window)
            for session in self._sessions.values()
            for hole in session.holes
        ]
        if not due:
            return None
        return max(min(due), self._last_fill + self.window)

    def holds(self, msg_id: str) -> bool:
        """Whether IOPub message ``msg_id`` (an ``idle`` the adapter received) has numbers
        missing below it and not yet judged: recorded before them, it would end its
        execution before the gap record that may belong to it."""
        counted = parse_counter(msg_id)
        if counted is None:
            return False
        session = self._sessions.get(counted[0])
        return session is not None and any(hole.first < counted[1] for hole in session.holes)

    def judge_below(self, msg_id: str) -> None:
        """Judge now, at the next :meth:`poll`, every hole below ``msg_id``'s number
        (the adapter can hold no more behind it, or must hand over what it holds)."""
        counted = parse_counter(msg_id)
        session = None if counted is None else self._sessions.get(counted[0])
        if counted is None or session is None:
            return
        keep = []
        for hole in session.holes:
            if hole.first < counted[1]:
                self._force(session, hole)
            else:
                keep.append(hole)
        session.holes = keep

    @property
    def pending(self) -> int:
        """Numbers missing and not yet judged."""
        return sum(hole.size for session in self._sessions.values() for hole in session.holes)
