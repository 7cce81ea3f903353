"""Who records a kernel on this node: the role switch of a kernel's recorder, as a table.

The rules, in the manner of h11's ``_state.py``:

1. A kernel's recorder on this node has one of four roles. ``OWNER``: this node reads the
   kernel's IOPub and numbers its records (one node alone, the one holding the kernel's
   lease: see the cluster). ``FOLLOWER``: another node numbers them; the records come off
   the record bus, and this node only fans them out. ``HANDING_OVER``: this node was the
   owner and stopped reading so that another node takes the kernel over (a graceful stop:
   the kernel was asked to hold its output first, and what it sent before is recorded);
   nothing more is recorded here. ``CLOSED``: the kernel ended, or the gateway stops.
2. A recorder starts as ``OWNER`` or ``FOLLOWER`` (whichever the lease says) and changes
   role only on an :class:`Event`, by :data:`TRANSITIONS`: ``(role, event) -> (next role,
   actions)``. The actions, in order, are what the recorder does for the change.
3. An event that has no row for the current role changes nothing and asks for nothing: it
   came late (a lease lost by a kernel that just closed, a second close) and is ignored,
   as the recorder ignored it before there was a table. ``CLOSED`` has no row at all.
4. Only ``OWNER`` records what the kernel sends (``records``); only ``FOLLOWER`` takes
   records off the bus (``follows``).

5. An owner stops recording on its own clock (:func:`step_down_at`): once it could not
   renew the kernel's lease for most of its TTL, it counts the lease as lost
   (``LEASE_LOST``) whether or not another node took it yet. Safety does not rest on
   this (an owner paused past its TTL runs again before it can look at a clock): its
   appends are fenced at Redis, and its clients get only what Redis confirmed.

Pure: no I/O, no clock. Imported by :mod:`kernel_gateway_stream.recording` (the recorder
carries the switch out) and read by whoever asks a recorder for its role.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "STEP_DOWN_MARGIN",
    "TRANSITIONS",
    "Action",
    "Event",
    "Ownership",
    "Role",
    "Step",
    "overdue",
    "step_down_at",
]


class Role(enum.Enum):
    OWNER = "owner"
    FOLLOWER = "follower"
    HANDING_OVER = "handing_over"
    CLOSED = "closed"


class Event(enum.Enum):
    #: This node took the lease of a kernel it followed (its owner is gone).
    LEASE_TAKEN = "lease_taken"
    #: This node lost the lease of a kernel it recorded (another node took it).
    LEASE_LOST = "lease_lost"
    #: A graceful stop: the kernel, told to hold its output, is handed to another node.
    RELEASED = "released"
    #: The gateway stops: stop reading, record nothing more (the kernel runs on).
    STOPPED = "stopped"
    #: The kernel ended (shut down, detached, or gone).
    CLOSED = "closed"


class Action(enum.Enum):
    #: Read the kernel's IOPub and number on from the last record delivered.
    START_READING = "start_reading"
    #: Record the kernel's end: what already arrived, then its ``dead`` status.
    RECORD_END = "record_end"
    #: Stop reading the kernel's IOPub.
    STOP_READING = "stop_reading"
    #: Stop hearing of the kernel manager's restarts and lifecycle requests.
    UNHOOK = "unhook"
    #: Take the records off the record bus again.
    FOLLOW = "follow"
    #: Tell the transcript store the kernel ended.
    END_TRANSCRIPT = "end_transcript"
    #: Release whoever waits for the recorder to be ready.
    SETTLE = "settle"
    #: Send the fan-out what it holds of the kernel, and forget it there.
    CLOSE_FANOUT = "close_fanout"


@dataclass(frozen=True, slots=True)
class Step:
    """One row's outcome: the next role, and the actions that take the recorder there."""

    role: Role
    actions: tuple[Action, ...] = ()


A = Action
#: ``(role, event) -> Step``: every change of role there is (rule 2).
TRANSITIONS: dict[tuple[Role, Event], Step] = {
    (Role.FOLLOWER, Event.LEASE_TAKEN): Step(Role.OWNER, (A.START_READING,)),
    (Role.OWNER, Event.LEASE_LOST): Step(Role.FOLLOWER, (A.STOP_READING, A.UNHOOK, A.FOLLOW)),
    (Role.OWNER, Event.RELEASED): Step(Role.HANDING_OVER, (A.STOP_READING, A.UNHOOK)),
    (Role.OWNER, Event.STOPPED): Step(Role.CLOSED, (A.STOP_READING,)),
    (Role.FOLLOWER, Event.STOPPED): Step(Role.CLOSED, (A.STOP_READING,)),
    (Role.HANDING_OVER, Event.STOPPED): Step(Role.CLOSED, (A.STOP_READING,)),
    (Role.OWNER, Event.CLOSED): Step(
        Role.CLOSED,
        (A.RECORD_END, A.STOP_READING, A.UNHOOK, A.SETTLE, A.END_TRANSCRIPT, A.CLOSE_FANOUT),
    ),
    (Role.FOLLOWER, Event.CLOSED): Step(Role.CLOSED, (A.SETTLE, A.CLOSE_FANOUT)),
    # The new owner recorded the end: nothing is left to do here.
    (Role.HANDING_OVER, Event.CLOSED): Step(Role.CLOSED),
}
del A

#: What an event without a row for the current role gives (rule 3).
_IGNORED: tuple[Action, ...] = ()


class Ownership:
    """The role of one kernel's recorder on this node (see the module docstring)."""

    __slots__ = ("role",)

    def __init__(self, role: Role) -> None:
        if role not in (Role.OWNER, Role.FOLLOWER):
            raise ValueError(f"a recorder starts as owner or follower, not {role.value}")
        self.role: Role = role

    @property
    def records(self) -> bool:
        """This node numbers the kernel's records (rule 4)."""
        return self.role is Role.OWNER

    @property
    def follows(self) -> bool:
        """This node takes the kernel's records off the record bus (rule 4)."""
        return self.role is Role.FOLLOWER

    @property
    def closed(self) -> bool:
        """Nothing more is recorded here: handing over, or closed."""
        return self.role in (Role.HANDING_OVER, Role.CLOSED)

    def handle(self, event: Event) -> tuple[Action, ...]:
        """Change role on ``event``; the actions the change asks for, in order (none if
        ``event`` has no row for the current role: rule 3)."""
        step = TRANSITIONS.get((self.role, event))
        if step is None:
            return _IGNORED
        self.role = step.role
        return step.actions


#: The share of ``lease_ttl`` an owner keeps in hand: it stops recording a kernel once
#: this much of the TTL is left since the last renewal Redis confirmed, so that it has
#: stopped before the lease can run out at Redis (a slow reply, a clock running apart).
STEP_DOWN_MARGIN = 0.2


def step_down_at(renewed_at: float, ttl: float) -> float:
    """When an owner must stop recording a kernel whose lease was last renewed (or taken)
    by a request sent at ``renewed_at`` (a monotonic clock's reading) for ``ttl`` seconds,
    unless it is renewed again first. Counted from the request's sending, not its reply:
    Redis may have started the TTL any time after that."""
    return renewed_at + ttl * (1 - STEP_DOWN_MARGIN)


def overdue(renewed: dict[str, float], ttl: float, now: float) -> list[str]:
    """The kernels of ``renewed`` (kernel id -> when its lease was last renewed, as in
    :func:`step_down_at`) that an owner must stop recording at ``now``, sorted."""
    return sorted(k for k, at in renewed.items() if now >= step_down_at(at, ttl))
