"""Marks: what the gateway itself writes into a kernel's transcript.

A kernel's own messages are most of a transcript; the gateway adds two kinds of its own,
so that readers learn what no kernel can tell them:

* **Lifecycle statuses**, recorded once a kernel is certainly gone: ``status`` messages
  with ``execution_state`` ``restarting`` or ``dead`` (as jupyter_server sends its
  clients) and a ``reason``: ``restart_requested`` (a REST restart has completed),
  ``kernel_died`` (jupyter_client's restarter brings it back), ``restart_failed`` and
  ``shutdown``. An execution that has not finished when one is recorded never will: it
  ends ``died`` (or ``aborted``, if it had not started).
* **Lifecycle requests** (``kernel_gateway_stream_lifecycle``), recorded when a restart or
  a shutdown is asked for, before the kernel goes: ``{"event", "reason"}``. The kernel may
  still report (ipykernel interrupts the running cell when asked to go); an execution that
  ends then keeps the request's reason beside its own status.
  Also recorded this way: a kernel that stops answering (``event`` ``unreachable``,
  reason ``heartbeat_timeout`` or ``upstream_unreachable``) and answers again
  (``reachable``); an execution running meanwhile keeps that reason.
* **Gap records** (``kernel_gateway_stream_gap``). One record stands for the sequence
  numbers ``first_seq..last_seq`` that hold nothing: numbers given out, or reserved, that
  the transcript could not keep (the gateway was killed before they were durable, the
  store refused writes past its backlog). It is stored at ``last_seq`` and covers the
  whole range (:attr:`Record.span`), so a reader resuming anywhere inside the range is
  told, and a frame made of it carries ``first_seq..last_seq`` like a merged frame. DESIGN
  invariant 1: a number a client may have seen is never reused; what could not be
  recorded is an explicit gap, never a silent hole.

* **Request marks** (``kernel_gateway_stream_request``): ``{"msg_id", "cell_id"}``,
  recorded when a client's ``execute_request`` names the notebook cell it runs
  (``metadata.cellId``, as JupyterLab sends it), before the kernel sees the request. A
  page reloaded later finds each cell's executions by them (:mod:`.outputs`). They have no
  parent: no execution's reader sees them as its output.

Lifecycle marks and gap records pass every reader's filters (a reader of one execution
must learn that it will never finish, or that part of it is missing).
"""

from __future__ import annotations

import datetime
from typing import Any

from .messages import KernelMessage, Record

__all__ = [
    "ACK_PREFIX",
    "GAP_MSG_TYPE",
    "LIFECYCLE_MSG_TYPE",
    "LIFECYCLE_STATES",
    "MAX_CELL_ID",
    "REPLAY_MSG_TYPE",
    "REQUEST_MSG_TYPE",
    "SPOOL_MSG_TYPE",
    "gap_message",
    "gap_record",
    "is_end",
    "is_mark",
    "is_terminal",
    "lifecycle_request",
    "lifecycle_status",
    "mark_reason",
    "request_mark",
]

#: Statuses the gateway records when a kernel restarts, dies or is shut down.
LIFECYCLE_STATES = frozenset({"restarting", "dead"})

GAP_MSG_TYPE = "kernel_gateway_stream_gap"
LIFECYCLE_MSG_TYPE = "kernel_gateway_stream_lifecycle"
REQUEST_MSG_TYPE = "kernel_gateway_stream_request"
#: What a kernel started by the gateway's launcher publishes before the IOPub messages it
#: held while nobody listened: ``{"held", "dropped"}`` (see :mod:`..kernel_launcher`). The
#: Tap reads it and does not record it.
SPOOL_MSG_TYPE = "kernel_gateway_stream_spool"
#: What that launcher wraps each message it publishes again in (to a new subscriber: what
#: it held, and what was not acknowledged as durable), so that no subscriber gets the same
#: signed message twice (jupyter_client refuses a duplicate signature): content ``{}``,
#: buffers the message's own frames from its signature on. The Tap unwraps it.
REPLAY_MSG_TYPE = "kernel_gateway_stream_replay"
#: The start of the frame a gateway sends that launcher upstream on IOPub (an XSUB to its
#: XPUB) to say what is durable: then the HMAC of the payload with the kernel's key, a NUL,
#: and the payload ``{"msg_id"}``: the last of the kernel's messages made durable. Neither
#: a subscription (``\x01``) nor an unsubscription (``\x00``): any other XPUB ignores it.
ACK_PREFIX = b"\x02kernel_gateway_stream_durable\x00"
#: Longest cell id recorded (JupyterLab's are UUIDs; nbformat allows up to 64 characters).
MAX_CELL_ID = 256


def lifecycle_status(
    state: str, reason: str, *, msg_id: str, date: str, session: str, epoch: int | None = None
) -> KernelMessage:
    """A ``status`` message for a lifecycle change the kernel cannot announce itself.

    ``session`` is the header's session: the kernel session of the life that ends here (a
    frontend such as JupyterLab drops queued messages whose session differs from the
    newest it saw, so the mark must not look like a new one). ``epoch``, for a restart,
    numbers the kernel's life that begins after it (the first is 0)."""
    if state not in LIFECYCLE_STATES:
        raise ValueError(f"not a lifecycle state: {state!r}")
    content: dict[str, Any] = {"execution_state": state, "reason": reason}
    if epoch is not None:
        content["epoch"] = epoch
    return KernelMessage.synthesize(
        "status",
        content,
        msg_id=msg_id,
        date=date,
        session=session,
    )


def lifecycle_request(
    event: str, reason: str, *, msg_id: str, date: str, session: str = ""
) -> KernelMessage:
    """A note that a restart or shutdown of the kernel was asked for (``event``).

    ``session``, as for every mark the Tap writes, is the kernel's current session:
    JupyterLab drops messages it has queued when one arrives with another session."""
    return KernelMessage.synthesize(
        LIFECYCLE_MSG_TYPE,
        {"event": event, "reason": reason},
        msg_id=msg_id,
        date=date,
        session=session,
    )


def request_mark(
    msg_id: str, cell_id: str, *, mark_id: str, date: str, session: str
) -> KernelMessage:
    """A note that execute_request ``msg_id`` runs notebook cell ``cell_id``."""
    return KernelMessage.synthesize(
        REQUEST_MSG_TYPE,
        {"msg_id": msg_id, "cell_id": cell_id},
        msg_id=mark_id,
        date=date,
        session=session,
    )


def gap_message(
    first_seq: int,
    last_seq: int,
    reason: str,
    *,
    date: str,
    lost: int | None = -1,
    session: str = "",
) -> KernelMessage:
    """The message of a gap record covering ``first_seq..last_seq`` (inclusive).

    ``lost``, when given (not -1), says how many of the kernel's messages are missing here
    (``None``: an unknown number): a gap where a source (a kernel that stopped answering,
    an upstream gateway) may have lost output that no transcript can have, rather than
    numbers given out and not kept (those are the range itself)."""
    if not 0 < first_seq <= last_seq:
        raise ValueError(f"bad gap {first_seq}..{last_seq}")
    content: dict[str, Any] = {"first_seq": first_seq, "last_seq": last_seq, "reason": reason}
    if lost != -1:
        content["lost"] = lost
    return KernelMessage.synthesize(
        GAP_MSG_TYPE,
        content,
        msg_id=f"gap-{first_seq}-{last_seq}",
        date=date,
        session=session,
    )


def gap_record(
    kernel_id: str, first_seq: int, last_seq: int, reason: str, *, now: float, date: str
) -> Record:
    """A gap record, stored at ``last_seq`` and spanning the whole range."""
    message = gap_message(first_seq, last_seq, reason, date=date)
    return Record(kernel_id, last_seq, now, message, span=last_seq - first_seq + 1)


def iso_date(seconds: float) -> str:
    """A header date as kernels write them (ISO 8601, UTC), for ``seconds`` since the epoch
    (given: the core reads no clock)."""
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat()


def backlog_gap(kernel_id: str, first: int, last: int, now: float) -> Record:
    """The gap record a store writes for records it could not keep (its backlog was full):
    every store's ``PendingBuffer`` makes its gaps with this."""
    return gap_record(kernel_id, first, last, "store_backlog_full", now=now, date=iso_date(now))


def is_mark(message: KernelMessage) -> bool:
    """True for a lifecycle status or request, or a gap record: what passes every filter."""
    return message.execution_state in LIFECYCLE_STATES or message.msg_type in _MARK_TYPES


def is_end(message: KernelMessage) -> bool:
    """True for what an execution's summary needs to tell that it ended, and how: its
    ``execute_input`` (it ran), ``error`` (it failed) and ``idle`` status (it ended), and
    the gateway's lifecycle statuses (the kernel went). Not gap records: a hole between
    ends kept is written back as a gap of its own (they took a third of what a node kept
    after a few restarts of Redis)."""
    return (
        message.execution_state == "idle"
        or message.msg_type in _END_TYPES
        or message.execution_state in LIFECYCLE_STATES
        or message.msg_type == LIFECYCLE_MSG_TYPE
    )


_END_TYPES = frozenset({"execute_input", "error"})


def is_terminal(message: KernelMessage) -> bool:
    """True for a lifecycle status: the kernel that ran what came before it is gone."""
    return message.execution_state in LIFECYCLE_STATES


_MARK_TYPES = frozenset({GAP_MSG_TYPE, LIFECYCLE_MSG_TYPE})


def mark_reason(message: KernelMessage) -> str:
    """A mark's ``reason`` (``kernel_died`` for a lifecycle status recorded without one)."""
    content: dict[str, Any] = message.content()
    reason = content.get("reason")
    if isinstance(reason, str):
        return reason
    return "kernel_died" if message.execution_state is not None else "unknown"
